"""The kustomize base and each of its components render, every object validates against the Kubernetes schema of its
kind (kubernetes-validate's bundled schemas, no network), and the install has the properties the
operations guide promises: hardened containers, probes, budgets, selectors that keep sparkgate out of its
own way, and settings consistent with the code that reads them."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from sparkgate import contract
from sparkgate.cli import build_parser
from sparkgate.policy import load_policy
from sparkgate.probe import MATCH_CONDITION

Obj = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
_COMPONENTS = sorted(p.parent.name for p in (MANIFESTS / "components").glob("*/kustomization.yaml"))
# Oldest supported (scheduling gates and matchConditions are GA from 1.30) and newest schemas shipped.
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
CRDS = {
    "ServiceMonitor": ("monitoring.coreos.com/v1", {"selector", "endpoints"}),
    "PrometheusRule": ("monitoring.coreos.com/v1", {"groups"}),
    "Certificate": ("cert-manager.io/v1", {"secretName", "issuerRef"}),
    "Issuer": ("cert-manager.io/v1", set()),
}


def validate(obj: Obj, version: str) -> None:
    if obj["kind"] in CRDS:
        api_version, required = CRDS[obj["kind"]]
        assert obj["apiVersion"] == api_version and required <= set(obj["spec"]), obj
        return
    kubernetes_validate.validate(obj, version, strict=True)


def test_every_component_of_the_manifests_is_listed_in_the_documented_order(kustomize: ModuleType) -> None:
    assert sorted((*kustomize.COMPONENTS, kustomize.ADMISSION_POLICY)) == _COMPONENTS


@pytest.mark.parametrize("component", [None, *_COMPONENTS], ids=lambda c: c or "base")
def test_every_object_validates_against_its_schema(kustomize: ModuleType, component: str | None) -> None:
    objects = kustomize.install([component] if component else [])
    assert len({(o["kind"], o["metadata"]["name"]) for o in objects}) == len(objects)
    for obj in objects:
        for version in VERSIONS:
            validate(obj, version)


def test_the_validator_refuses_what_kubectl_would(rendered: dict[tuple[str, str], Obj]) -> None:
    broken = yaml.safe_load(yaml.safe_dump(rendered[("Deployment", "sparkgate")]))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_the_base_policy_references_nothing_a_bare_cluster_lacks(
    rendered: dict[tuple[str, str], Obj],
) -> None:
    """No PriorityClass, service account, runtime class or source ConfigMap: a fresh install admits every
    executor pod it shapes (issue 12: the shipped analytics profile named a class nobody created)."""
    text = rendered[("ConfigMap", "sparkgate-policy")]["data"]["policy.yaml"]
    assert text == (MANIFESTS / "base" / "policy.yaml").read_text()
    assert "#" in text  # the comments survive: the admin's documentation
    policy = load_policy(text, "sparkgate-system")
    assert policy.profiles
    for profile in policy.profiles:
        assert profile.config_maps == (), profile.name
        assert not references(profile.template), profile.name


def references(template: Obj) -> set[str]:
    """What a pod template names that must exist in the cluster for the API server to admit the pod."""
    spec = template.get("spec") or {}
    named = {
        f"{k}={spec[k]}" for k in ("priorityClassName", "serviceAccountName", "runtimeClassName") if k in spec
    }
    named |= {f"imagePullSecret={s['name']}" for s in spec.get("imagePullSecrets") or []}
    for volume in spec.get("volumes") or []:
        named |= {
            f"{kind}={volume[kind]}"
            for kind in ("configMap", "secret", "persistentVolumeClaim")
            if kind in volume
        }
    return named


def test_the_example_component_ships_the_example_policy_and_what_it_references(kustomize: ModuleType) -> None:
    objects = kustomize.by_kind(kustomize.install(["example-policy"]))
    example = (MANIFESTS / "components" / "example-policy" / "policy.yaml").read_text()
    config_map = objects[("ConfigMap", "sparkgate-policy")]
    assert config_map["data"] == {"policy.yaml": example}
    assert config_map["metadata"]["namespace"] == "sparkgate-system"
    policy = load_policy(example, "sparkgate-system")
    assert len(policy.profiles) >= 2 and any(p.config_maps and p.overrides for p in policy.profiles)
    for profile in policy.profiles:
        for ref in references(profile.template):
            kind, _, name = ref.partition("=")
            assert kind == "priorityClassName" and ("PriorityClass", name) in objects, ref
        for source in profile.config_maps:
            assert objects[("ConfigMap", source.source)]["metadata"]["namespace"] == "sparkgate-system"


def pod_spec(rendered: dict[tuple[str, str], Obj]) -> Obj:
    spec: Obj = rendered[("Deployment", "sparkgate")]["spec"]["template"]["spec"]
    return spec


def containers(rendered: dict[tuple[str, str], Obj]) -> dict[str, Obj]:
    spec = pod_spec(rendered)
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


def test_deployment_is_hardened_and_probed(rendered: dict[tuple[str, str], Obj]) -> None:
    deployment = rendered[("Deployment", "sparkgate")]
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    spec = pod_spec(rendered)
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
    assert spec["automountServiceAccountToken"] is False
    assert [c["name"] for c in spec["containers"]] == ["webhook", "allocator"]
    for name, c in containers(rendered).items():
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"], name
        assert sc["capabilities"]["drop"] == ["ALL"] and not sc.get("privileged"), name
        assert set(c["resources"]["requests"]) == set(c["resources"]["limits"]) == {"cpu", "memory"}, name
        assert c["image"] == "ghcr.io/sparkgate/sparkgate:0.1.0", name
    for c in spec["containers"]:
        port_names = {p["name"] for p in c["ports"]}
        assert c["livenessProbe"]["httpGet"]["port"] in port_names, c["name"]
    webhook, allocator = spec["containers"]
    # Pod readiness is what the webhook Service routes by: it must be the webhook's alone.
    assert webhook["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "webhook", "scheme": "HTTPS"}
    assert "readinessProbe" not in allocator
    assert webhook["lifecycle"]["preStop"]["sleep"]["seconds"] >= 5
    assert spec["terminationGracePeriodSeconds"] > webhook["lifecycle"]["preStop"]["sleep"]["seconds"]


def test_only_the_allocator_gets_an_api_token(rendered: dict[tuple[str, str], Obj]) -> None:
    token_path = "/var/run/secrets/kubernetes.io/serviceaccount"
    mounts = {n: {m["mountPath"] for m in c.get("volumeMounts", [])} for n, c in containers(rendered).items()}
    assert token_path not in mounts["webhook"]
    assert token_path in mounts["allocator"] and token_path in mounts["certs"]
    assert rendered[("ServiceAccount", "sparkgate-allocator")]["automountServiceAccountToken"] is False
    tls = next(v for v in pod_spec(rendered)["volumes"] if v["name"] == "tls")["secret"]
    assert {i["key"] for i in tls["items"]} == {"tls.crt", "tls.key"}  # never the CA key
    assert tls["optional"] is True  # a fresh install must not wait for a Secret nobody has created yet


def test_settings_match_what_the_code_reads(rendered: dict[tuple[str, str], Obj]) -> None:
    sources = "\n".join(
        p.read_text() for d in ("webhook", "allocator", "certs", "sparkgate") for p in (REPO / d).glob("*.py")
    )
    known = set(re.findall(r"\b(SPARKGATE_[A-Z_]+|POD_NAME|PROMETHEUS_MULTIPROC_DIR)\b", sources))
    parser = build_parser()
    commands = {
        name
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    }
    for name, c in containers(rendered).items():
        unknown = {e["name"] for e in c.get("env", [])} - known
        assert not unknown, f"{name}: no code reads {unknown}"
        assert c["args"][0] in commands, f"{name}: sparkgate has no command {c['args'][0]}"
        parser.parse_args(c["args"])
    webhook = containers(rendered)["webhook"]
    env = {e["name"]: e.get("value") for e in webhook["env"]}
    assert env["SPARKGATE_BIND"].endswith(f":{webhook['ports'][0]['containerPort']}")
    assert env["SPARKGATE_ALLOCATOR_USER"] == contract.ALLOCATOR_USER
    binding = rendered[("ClusterRoleBinding", "sparkgate-allocator")]["subjects"][0]
    assert f"system:serviceaccount:{binding['namespace']}:{binding['name']}" == contract.ALLOCATOR_USER


def test_services_and_budget_select_the_pods(rendered: dict[tuple[str, str], Obj]) -> None:
    labels = rendered[("Deployment", "sparkgate")]["spec"]["template"]["metadata"]["labels"]
    for service in ("sparkgate-webhook", "sparkgate-metrics"):
        assert rendered[("Service", service)]["spec"]["selector"].items() <= labels.items()
    pdb = rendered[("PodDisruptionBudget", "sparkgate")]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items() and pdb["minAvailable"] == 1
    port = rendered[("Service", "sparkgate-webhook")]["spec"]["ports"][0]
    assert port["port"] == 443 and port["targetPort"] == "webhook"


def webhooks(objects: dict[tuple[str, str], Obj]) -> list[tuple[str, Obj]]:
    return [
        (kind, w)
        for kind in ("Mutating", "Validating")
        for w in (objects.get((f"{kind}WebhookConfiguration", "sparkgate")) or {}).get("webhooks", [])
    ]


@pytest.fixture(scope="module")
def old_clusters(kustomize: ModuleType) -> dict[tuple[str, str], Obj]:
    """The install for clusters that do not serve ValidatingAdmissionPolicy (components/validating-webhook)."""
    objects: dict[tuple[str, str], Obj] = kustomize.by_kind(kustomize.install(["validating-webhook"]))
    return objects


def test_webhook_configurations(
    rendered: dict[tuple[str, str], Obj], old_clusters: dict[tuple[str, str], Obj]
) -> None:
    routes = set(re.findall(r'@app\.post\("([^"]+)"\)', (REPO / "webhook" / "app.py").read_text()))
    for _, w in webhooks(rendered) + webhooks(old_clusters):
        assert w["failurePolicy"] == "Ignore" and w["sideEffects"] == "None", w["name"]
        assert w["admissionReviewVersions"] == ["v1"] and w["timeoutSeconds"] <= 3
        assert w["objectSelector"] == {"matchLabels": {"spark-role": "executor"}}
        excluded = w["namespaceSelector"]["matchExpressions"][0]
        assert excluded["key"] == "kubernetes.io/metadata.name" and excluded["operator"] == "NotIn"
        assert {"kube-system", "sparkgate-system"} <= set(excluded["values"])
        service = w["clientConfig"]["service"]
        assert (service["namespace"], service["name"], service["port"]) == (
            "sparkgate-system",
            "sparkgate-webhook",
            443,
        )
        assert "caBundle" not in w["clientConfig"]  # injected by certs sync
        assert service["path"] in routes
    [(kind, mutating)] = webhooks(rendered)
    assert kind == "Mutating"
    assert mutating["rules"][0]["operations"] == ["CREATE"] and mutating["reinvocationPolicy"] == "Never"
    assert mutating["clientConfig"]["service"]["path"] == "/mutate"
    assert mutating["matchConditions"] == [
        MATCH_CONDITION
    ]  # the policy probe's dry runs (sparkgate/probe.py)
    (_, same), (kind, validating) = webhooks(old_clusters)
    assert same == mutating and kind == "Validating"
    assert validating["rules"][0]["operations"] == ["UPDATE"]
    assert validating["clientConfig"]["service"]["path"] == "/validate"


def test_the_gate_is_protected_by_an_admission_policy_and_on_old_clusters_by_the_webhook(
    rendered: dict[tuple[str, str], Obj], old_clusters: dict[tuple[str, str], Obj]
) -> None:
    policy = rendered[("ValidatingAdmissionPolicy", "sparkgate-gate")]
    binding = rendered[("ValidatingAdmissionPolicyBinding", "sparkgate-gate")]
    assert "namespace" not in policy["metadata"] and "namespace" not in binding["metadata"]
    assert binding["spec"] == {"policyName": "sparkgate-gate", "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}
    ]
    conditions = " ".join(c["expression"] for c in spec["matchConditions"])
    assert f"'{contract.ALLOCATOR_USER}'" in conditions and f"'{contract.GATE}'" in conditions
    assert f"!('{contract.BREAK_GLASS_GROUP}' in request.userInfo.groups)" in conditions
    [validation] = spec["validations"]
    assert f"'{contract.GATE}'" in validation["expression"]
    assert (
        validation["message"].startswith("sparkgate: only the sparkgate allocator")
        and "\n" not in validation["message"]
    )
    assert not {k for k in old_clusters if k[0].startswith("ValidatingAdmissionPolicy")}
    assert ("ValidatingWebhookConfiguration", "sparkgate") not in rendered


@pytest.mark.parametrize(
    "components", [("cert-manager",), ("validating-webhook", "cert-manager")], ids=" + ".join
)
def test_cert_manager_hands_certificates_over(kustomize: ModuleType, components: tuple[str, ...]) -> None:
    objects = kustomize.by_kind(kustomize.install(components))
    spec = objects[("Deployment", "sparkgate")]["spec"]["template"]["spec"]
    assert "initContainers" not in spec
    allocator = {e["name"]: e.get("value") for e in spec["containers"][1]["env"]}
    assert spec["containers"][1]["name"] == "allocator" and allocator["SPARKGATE_CERTS_SYNC"] == "false"
    granted = {
        resource
        for kind in ("ClusterRole", "Role")
        for rule in objects[(kind, "sparkgate-allocator")]["rules"]
        for resource in rule["resources"]
    }
    assert granted == {
        "pods",
        "pods/status",
        "podtemplates",
        "provisioningrequests",
        "configmaps",
        "events",
        "leases",
        "namespaces",
        "nodes",
    }  # nor the MutatingAdmissionPolicy's: only the install without the webhook grants that
    certificate = objects[("Certificate", "sparkgate-webhook")]["spec"]
    webhook_names = {
        w["clientConfig"]["service"]["name"] + "." + w["clientConfig"]["service"]["namespace"] + ".svc"
        for _, w in webhooks(objects)
    }
    assert webhook_names and webhook_names <= set(certificate["dnsNames"])
    configurations = [o for (kind, _), o in objects.items() if kind.endswith("WebhookConfiguration")]
    assert len(configurations) == len(components)  # every one that the install has gets its caBundle
    for configuration in configurations:
        annotations = configuration["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == "sparkgate-system/sparkgate-webhook"
    assert certificate["secretName"] == "sparkgate-webhook-tls"
