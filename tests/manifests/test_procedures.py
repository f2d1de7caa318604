"""The certificate, upgrade and scheduler-uninstall procedures of docs/operations.md and docs/install.md, run
on kubesim as an admin types them (the style of tests/manifests/test_runbooks.py).

- "Checking and forcing": its `kubectl ... exec deploy/sparkgate -c allocator -- sparkgate certs sync
  --once` (and the same command in the alert runbook) is run through the CLI as `kubectl exec` runs it: in
  that container of the rendered Deployment, with its environment (its `fieldRef`s resolved) and its pod's
  service account, which it has only if it mounts the API token. On a fresh install it creates the Secret
  the section "What is there" describes and injects every sparkgate webhook configuration's `caBundle`; a
  `caBundle` blanked by a `kubectl replace` is repaired by it. The section's `openssl` line runs in bash as
  typed, fed what its `kubectl get secret -o jsonpath=...` prints (kubesim serves plain HTTP, where kubectl
  sends no bearer token: the test makes kubectl's GET and evaluates the jsonpath). "To start over: delete
  the Secret": the command then makes a new CA, injects it everywhere, admissions fail open until the
  webhook's Secret volume is updated (as the kubelet does it), then go through the webhook over TLS verified
  against the new CA, the mutating and the validating one (components/validating-webhook, so that there are
  two configurations to inject).
- "Upgrading": the install applied as test_apply.py applies it (server-side), the `certs` init container's
  own command run, then the install re-applied with a new image tag set the way docs/install.md says:
  the Secret and the injected `caBundle` are untouched, and the new pods' init container has nothing to
  do. (A changed policy changing its ConfigMap alone is test_apply.py's; its reload by both containers is
  tested in tests/sparkgate/test_policy_file.py, tests/webhook/test_app.py and
  tests/allocator/test_integration_lifecycle.py.)
- The uninstall with `components/scheduler` (docs/install.md, "With the webhook (the default)"): executors
  the webhook sent to the `sparkgate` scheduler wait gated; the policy loses `schedulerName` and is applied,
  the webhook reloads it, the documented `kubectl get pods` lists the executors still waiting for that
  scheduler, they are deleted and Spark replaces them (for the default scheduler); then the uninstall as
  test_runbooks.py runs it. No released executor may be left for the scheduler the uninstall deleted. The
  cluster is taken as full while the second scheduler runs (it binds nothing): the case the document
  warns about, and the one where its steps matter.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import re
import shlex
import shutil
import subprocess
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from certs.plan import CA_CRT, CA_KEY, TLS_CRT, TLS_KEY, Step, load_certs
from certs.sync import Target
from kubesim.cluster import Cluster
from sandbox.local_webhook import LocalWebhook
from sparkgate import contract
from sparkgate.cli import main
from sparkgate.kube import Kube, KubeError

from .test_apply import apply_all, served
from .test_install_e2e import REMOVE_GATE, Install
from .test_release import executor
from .test_runbooks import (
    DOCS,
    UNINSTALL,
    assert_uninstalled,
    installed,
    installed_on_kubesim,
    kubectl,
    section,
    shell_commands,
)

REPO = Path(__file__).resolve().parents[2]
INSTALL_MD, OPERATIONS_MD = DOCS
Obj = dict[str, Any]
POD = "sparkgate-6f7d9c8b5-k2x9q"  # the pod of the Deployment that `kubectl exec deploy/...` picks
API_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount"
NEW_TAG = "0.2.0"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
# --- the documents ---------------------------------------------------------------------------------------


def forcing_commands() -> list[str]:
    """Every distinct form of the forced certificate cycle in docs/operations.md: the code block of
    "Checking and forcing" and the inline spans (the alert runbook's "Fix")."""
    block = [c for c in shell_commands(section(OPERATIONS_MD, "Checking and forcing")) if "certs sync" in c]
    assert block, "no `certs sync` command under 'Checking and forcing'"
    inline = re.findall(r"`(kubectl [^`]* -- sparkgate certs sync [^`]*)`", OPERATIONS_MD.read_text())
    return list(dict.fromkeys(block + inline))


def the_secret() -> tuple[str, str, str]:
    """(namespace, name, type) of the certificate Secret, as "What is there" names them."""
    text = " ".join(section(OPERATIONS_MD, "What is there").split())
    match = re.search(r"One Secret, `([^`]+)` \(type `([^`]+)`\) in `([^`]+)`", text)
    assert match, "'What is there' no longer names the Secret, its type and namespace"
    name, kind, namespace = match.groups()
    return namespace, name, kind


def jsonpath(template: str, obj: Obj) -> str:
    """What `kubectl -o jsonpath=TEMPLATE` prints for a template of one field path, `{.a.b\\.c}`."""
    match = re.fullmatch(r"\{\.([^{}]+)\}", template)
    assert match, f"a jsonpath this test does not evaluate: {template}"
    value: Any = obj
    for key in re.split(r"(?<!\\)\.", match.group(1)):
        value = value[key.replace("\\.", ".")]
    assert isinstance(value, str), template
    return value


# --- `kubectl exec` into a container of the rendered Deployment ------------------------------------------


def run_in_container(
    cluster: Cluster, deployment: Obj, container: Obj, args: list[str], monkeypatch: pytest.MonkeyPatch
) -> int:
    """`sparkgate ARGS` through the CLI as it runs in `container` of a pod of `deployment`: the container's
    environment (fieldRefs resolved for the pod), and the pod's service account where the container mounts
    the API token; a container without the token has no credentials at all."""
    namespace = deployment["metadata"]["namespace"]
    spec = deployment["spec"]["template"]["spec"]
    mounts = {m["mountPath"] for m in container.get("volumeMounts") or []}
    assert API_TOKEN in mounts, f"container {container['name']} has no API token: the command cannot log in"
    env = {
        "KUBECONFIG": str(cluster.add_user(f"system:serviceaccount:{namespace}:{spec['serviceAccountName']}"))
    }
    for entry in container.get("env") or []:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        else:
            field = entry["valueFrom"]["fieldRef"]["fieldPath"]
            env[entry["name"]] = {"metadata.namespace": namespace, "metadata.name": POD}[field]
    with monkeypatch.context() as m:
        for key in list(os.environ):  # only the container's environment
            if key.startswith("SPARKGATE_") or key in ("KUBECONFIG", "POD_NAME"):
                m.delenv(key)
        for key, value in env.items():
            m.setenv(key, value)
        return main(args)


def kubectl_exec(cluster: Cluster, objects: list[Obj], line: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """`kubectl -n NAMESPACE exec deploy/NAME -c CONTAINER -- sparkgate ARGS`, in the rendered `objects`."""
    words = shlex.split(line)
    split = words.index("--")
    flags, argv = words[1:split], words[split + 1 :]
    assert words[0] == "kubectl" and "exec" in flags and argv[0] == "sparkgate", line
    namespace, container_name = flags[flags.index("-n") + 1], flags[flags.index("-c") + 1]
    kind, name = flags[flags.index("exec") + 1].split("/")
    assert kind in ("deploy", "deployment", "deployments"), line
    [deployment] = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    assert deployment["metadata"]["namespace"] == namespace, line
    # exec reaches the running containers, not the init containers
    [container] = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == container_name
    ]
    return run_in_container(cluster, deployment, container, argv[1:], monkeypatch)


def init_container(objects: list[Obj], name: str) -> tuple[Obj, Obj]:
    """(the Deployment `sparkgate`, its init container `name`)."""
    [deployment] = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "sparkgate"]
    [container] = [c for c in deployment["spec"]["template"]["spec"]["initContainers"] if c["name"] == name]
    return deployment, container


# --- the installed certificates --------------------------------------------------------------------------


def sparkgate_bundles(cluster: Cluster, objects: list[Obj]) -> dict[str, bytes]:
    """`mutating|validating/configuration/webhook` → caBundle, for every webhook configuration the rendered
    install `objects` has, as the cluster holds it."""
    found = {}
    for obj in objects:
        if not obj["kind"].endswith("WebhookConfiguration"):
            continue
        name = obj["metadata"]["name"]
        config = cluster.store.get(f"{obj['kind'].lower()}s", None, name)
        for webhook in config["webhooks"]:
            raw = (webhook.get("clientConfig") or {}).get("caBundle") or ""
            kind = obj["kind"].removesuffix("WebhookConfiguration").lower()
            found[f"{kind}/{name}/{webhook['name']}"] = base64.b64decode(raw)
    return found


def common_name(name: x509.Name) -> str:
    [attribute] = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(attribute.value)


@pytest.fixture
def webhook_install(
    kustomize: ModuleType,
    tmp_path: Path,
    patient_webhook: Callable[[Obj], Obj],
    secret_volume: Callable[[Path, dict[str, bytes]], None],
) -> Iterator[tuple[Install, list[Obj]]]:
    """The install with components/validating-webhook (a mutating and a validating configuration, from the
    rendered manifests, with the longest timeout), both served by a real `sparkgate webhook`: no Secret
    yet, as before the first pod's init container ran."""
    objects = kustomize.install(["validating-webhook"])
    configurations = [o for o in objects if o["kind"].endswith("WebhookConfiguration")]
    assert {o["kind"] for o in configurations} == {
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
    with (
        LocalWebhook(REPO / "manifests" / "base" / "policy.yaml", tmp_path / "webhook", workers=1) as webhook,
        Cluster(
            nodes=1, namespaces=("default", "kube-system", "sparkgate-system", "spark-jobs"), workdir=tmp_path
        ) as cluster,
    ):
        cluster.register_service(contract.INSTALL_NAMESPACE, contract.WEBHOOK_SERVICE, webhook.url)
        for config in configurations:
            cluster.store.create(f"{config['kind'].lower()}s", patient_webhook(config))
        allocator = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
        try:
            yield Install(cluster, webhook, allocator, Target(), secret_volume), objects
        finally:
            allocator.close()


def admitted_through_both_webhooks(install: Install, executors: Any, name: str) -> None:
    """An executor pod created as Spark creates it is shaped by the mutating webhook, and its gate's removal
    by Spark's service account is refused by the validating webhook (under failurePolicy Ignore a webhook
    not reached over verified TLS shapes nothing and refuses nothing)."""
    spark = Kube.from_kubeconfig(str(install.cluster.add_user("system:serviceaccount:spark-jobs:spark")))
    try:
        created = spark.create("/api/v1/namespaces/spark-jobs/pods", executors.pod(name))
        assert executors.admitted(created), f"{name} was admitted without sparkgate"
        with pytest.raises(KubeError) as refused:
            spark.patch(
                f"/api/v1/namespaces/spark-jobs/pods/{name}", REMOVE_GATE, "application/json-patch+json"
            )
        assert refused.value.status in (400, 403) and "sparkgate" in refused.value.message
    finally:
        spark.close()


def admitted_without_sparkgate(install: Install, executors: Any, name: str) -> bool:
    spark = Kube.from_kubeconfig(str(install.cluster.add_user("system:serviceaccount:spark-jobs:spark")))
    try:
        return not executors.admitted(spark.create("/api/v1/namespaces/spark-jobs/pods", executors.pod(name)))
    finally:
        spark.close()


def test_the_alert_runbook_forces_the_cycle_with_a_command_tested_here() -> None:
    found = forcing_commands()
    text = " ".join(section(OPERATIONS_MD, "SparkgateCertificateExpiresSoon").split())
    assert any(f"`{c}`" in text for c in found), "the alert's Fix no longer runs a cycle"


@pytest.mark.parametrize("command", forcing_commands())
def test_forcing_a_cycle_creates_the_secret_injects_every_ca_bundle_and_repairs_a_blanked_one(
    webhook_install: tuple[Install, list[Obj]],
    executors: Any,
    command: str,
    patient_webhook: Callable[[Obj], Obj],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    install, objects = webhook_install
    cluster = install.cluster
    assert kubectl_exec(cluster, objects, command, monkeypatch) == 0
    out = capsys.readouterr().out
    # What "What is there" describes, outside a rollover: the serving pair, the CA pair; every caBundle the CA.
    namespace, name, kind = the_secret()
    secret = cluster.store.get("secrets", namespace, name)
    assert secret["type"] == kind
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert set(data) == {TLS_CRT, TLS_KEY, CA_CRT, CA_KEY}
    what_is_there = section(OPERATIONS_MD, "What is there")
    assert all(f"`{key}`" in what_is_there for key in data)
    bundles = sparkgate_bundles(cluster, objects)
    assert len(bundles) == 2 and set(bundles.values()) == {data[CA_CRT]}, bundles
    assert out == f"certs sync: create, {', '.join(f'inject {ref}' for ref in sorted(bundles))}\n"

    # The section's check of the dates: `kubectl get secret -o jsonpath` | base64 -d | openssl x509 ...
    [check] = [c for c in shell_commands(section(OPERATIONS_MD, "Checking and forcing")) if "openssl" in c]
    get, pipeline = (part.strip() for part in check.split("|", 1))
    words = shlex.split(get)
    assert words[:5] == ["kubectl", "-n", namespace, "get", "secret"] and words[5] == name, check
    admin = Kube.from_kubeconfig(str(cluster.kubeconfig("admin")))
    try:
        printed = jsonpath(
            words[words.index("-o") + 1].removeprefix("jsonpath="),
            admin.get(f"/api/v1/namespaces/{namespace}/secrets/{name}"),
        )
    finally:
        admin.close()
    serving, ca = load_certs(data[TLS_CRT])[0], load_certs(data[CA_CRT])[0]
    lines = print_dates(pipeline, printed)
    assert lines["subject"] == f"CN={common_name(serving.subject)}"
    assert lines["issuer"] == f"CN={common_name(ca.subject)}"
    assert (
        dt.datetime.strptime(" ".join(lines["notAfter"].split()), "%b %d %H:%M:%S %Y GMT").replace(
            tzinfo=dt.UTC
        )
        == serving.not_valid_after_utc
    )

    install.mount_secret()
    admitted_through_both_webhooks(install, executors, "forced-exec-1")

    # "Something overwrote caBundle": a `kubectl replace` of the mutating configuration from the manifests.
    store = cluster.store
    [rendered] = [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    current = store.get("mutatingwebhookconfigurations", None, rendered["metadata"]["name"])
    replaced = patient_webhook(rendered)
    replaced["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    store.replace("mutatingwebhookconfigurations", None, rendered["metadata"]["name"], replaced)
    assert admitted_without_sparkgate(install, executors, "blanked-exec-1")
    assert kubectl_exec(cluster, objects, command, monkeypatch) == 0
    assert capsys.readouterr().out == "certs sync: inject mutating/sparkgate/executors.sparkgate.io\n"
    assert set(sparkgate_bundles(cluster, objects).values()) == {data[CA_CRT]}
    admitted_through_both_webhooks(install, executors, "repaired-exec-1")
    assert kubectl_exec(cluster, objects, command, monkeypatch) == 0
    assert capsys.readouterr().out == "certs sync: nothing to do\n"


def print_dates(pipeline: str, printed: str) -> dict[str, str]:
    """The rest of the check's pipeline (`base64 -d | openssl x509 -noout ...`) run by bash as typed, fed
    what kubectl printed; its `key=value` lines (spaces around `=` in a name dropped)."""
    if shutil.which("openssl"):
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", pipeline],
            input=printed.encode(),
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr.decode()
        output = done.stdout.decode()
    else:  # not silently: the jsonpath and base64 part, and what openssl would print, from Python
        warnings.warn("openssl is not installed: the check's openssl part is read with Python", stacklevel=1)
        assert pipeline.startswith("base64 -d | openssl x509 -noout"), pipeline
        cert = x509.load_pem_x509_certificate(base64.b64decode(printed))
        options = pipeline.split("-noout", 1)[1].split()
        values = {
            "-subject": f"subject=CN = {common_name(cert.subject)}",
            "-issuer": f"issuer=CN = {common_name(cert.issuer)}",
            "-enddate": f"notAfter={cert.not_valid_after_utc:%b %e %H:%M:%S %Y} GMT",
        }
        output = "".join(values[o] + "\n" for o in options)
    lines = {}
    for line in output.splitlines():
        key, _, value = line.partition("=")
        lines[key] = value if key == "notAfter" else value.replace(" = ", "=")
    assert set(lines) == {"subject", "issuer", "notAfter"}, output
    return lines


@pytest.mark.parametrize("command", forcing_commands())
def test_starting_over_by_deleting_the_secret_puts_a_new_ca_everywhere(
    webhook_install: tuple[Install, list[Obj]],
    executors: Any,
    command: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The section's last paragraph, its Secret deleted as `kubectl delete secret` deletes it and its cycle
    forced with the section's command."""
    text = " ".join(section(OPERATIONS_MD, "Checking and forcing").split())
    assert (
        "To start over (e.g. a leaked CA key): delete the Secret. The next cycle creates a new CA and injects"
        " it; until the kubelet updates the webhook's volume (about a minute) admissions fail open." in text
    )
    install, objects = webhook_install
    cluster = install.cluster
    assert install.sync() == (Step.CREATE,)
    install.mount_secret()
    admitted_through_both_webhooks(install, executors, "before-exec-1")
    leaked = install.secret()[CA_CRT]

    namespace, name, _ = the_secret()
    admin = Kube.from_kubeconfig(str(cluster.kubeconfig("admin")))
    try:  # kubectl -n NAMESPACE delete secret NAME
        admin.delete(f"/api/v1/namespaces/{namespace}/secrets/{name}")
    finally:
        admin.close()
    assert kubectl_exec(cluster, objects, command, monkeypatch) == 0
    assert capsys.readouterr().out.startswith("certs sync: create, inject ")
    fresh = install.secret()[CA_CRT]
    assert load_certs(fresh) and load_certs(fresh)[0] != load_certs(leaked)[0]
    bundles = sparkgate_bundles(cluster, objects)
    assert len(bundles) == 2 and set(bundles.values()) == {fresh}, bundles
    # The webhook still serves the certificate of the leaked CA, which no caBundle trusts any more.
    assert admitted_without_sparkgate(install, executors, "meanwhile-exec-1")
    install.mount_secret()  # the kubelet updates the webhook's Secret volume
    admitted_through_both_webhooks(install, executors, "after-exec-1")


# --- Upgrading -------------------------------------------------------------------------------------------


def with_new_tag(kustomize: ModuleType, how: str, workdir: Path) -> list[Obj]:
    """The install rendered with the image tag NEW_TAG, set as docs/install.md ("1. Build and push the
    image") says: in the base's `images:` entry (of a copy of the repository's manifests), or in an
    `images:` entry of the admin's own kustomization."""
    text = " ".join(section(INSTALL_MD, "1. Build and push the image").split())
    if how == "base":
        match = re.search(r"editing the `images:` entry of `([^`]+)`", text)
        assert match, text
        manifests = workdir / "manifests"
        shutil.copytree(REPO / "manifests", manifests)
        path = workdir / match.group(1)
        document = yaml.safe_load(path.read_text())
        [entry] = document["images"]
        entry["newTag"] = NEW_TAG
        path.write_text(yaml.safe_dump(document))
        rendered: list[Obj] = kustomize.build(manifests)
        return rendered
    match = re.search(
        r"add an `images:` entry with (?:the same )?`name: ([^`]+)`.*? to your own kustomization", text, re.S
    )
    assert match, text
    own = workdir / "my-sparkgate"
    own.mkdir()
    document = kustomize.kustomization(own, ())
    document["images"] = [{"name": match.group(1), "newTag": NEW_TAG}]
    (own / "kustomization.yaml").write_text(yaml.safe_dump(document))
    rendered = kustomize.build(own)
    return rendered


def images(objects: list[Obj]) -> set[str]:
    found = set()
    for obj in objects:
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == "sparkgate":
            spec = obj["spec"]["template"]["spec"]
            found |= {c["image"] for c in spec["containers"] + spec.get("initContainers", [])}
    return found


@pytest.mark.parametrize(
    "how",
    ["base", "own"],
)
def test_an_upgrade_keeps_the_secret_and_the_injected_ca_bundle(
    kustomize: ModuleType,
    tmp_path: Path,
    how: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = " ".join(section(OPERATIONS_MD, "Upgrading").split())
    assert "`kubectl apply -k manifests/` with the new image tag" in text
    assert (
        "The Secret is not part of the manifests, so an upgrade keeps the certificates; the caBundle"
        " survives `kubectl apply`." in text
    )
    old = kustomize.build(REPO / "manifests")
    new = with_new_tag(kustomize, how, tmp_path)
    [image] = images(old)
    assert images(new) == {f"{image.rpartition(':')[0]}:{NEW_TAG}"}, images(new)
    assert not [o for o in new if o["kind"] == "Secret"]

    with Cluster(nodes=1, namespaces=("default", "kube-system"), workdir=tmp_path) as cluster:
        admin = Kube.from_kubeconfig(str(cluster.kubeconfig("admin")))
        try:
            apply_all(admin, served(old))
            deployment, certs = init_container(old, "certs")
            assert run_in_container(cluster, deployment, certs, certs["args"], monkeypatch) == 0
            assert capsys.readouterr().out.startswith("certs sync: create, inject ")
            namespace, name, _ = the_secret()
            before = cluster.store.get("secrets", namespace, name)
            bundles = sparkgate_bundles(cluster, old)
            assert len(bundles) == 1 and set(bundles.values()) == {base64.b64decode(before["data"][CA_CRT])}

            apply_all(admin, served(new))  # kubectl apply -k, server-side as test_apply.py applies it
            assert cluster.store.get("secrets", namespace, name) == before
            assert sparkgate_bundles(cluster, new) == bundles
            # The new pods' init container finds everything in place.
            deployment, certs = init_container(new, "certs")
            assert run_in_container(cluster, deployment, certs, certs["args"], monkeypatch) == 0
            assert capsys.readouterr().out == "certs sync: nothing to do\n"
            assert cluster.store.get("secrets", namespace, name) == before
        finally:
            admin.close()


# --- Uninstall with components/scheduler -----------------------------------------------------------------


def spark_creates(spark: Kube, app: str, exec_id: int) -> Obj:
    """An executor pod of `app` in spark-a, as Spark's driver creates it (no gate of its own)."""
    pod = executor("spark-a", app, exec_id)
    del pod["spec"]["schedulingGates"]
    created: Obj = spark.create("/api/v1/namespaces/spark-a/pods", pod)
    return created


def test_the_uninstall_with_the_scheduler_component_runs_as_documented(
    kustomize: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    patient_webhook: Callable[[Obj], Obj],
    secret_volume: Callable[[Path, dict[str, bytes]], None],
) -> None:
    text = section(INSTALL_MD, "With the webhook (the default)")
    assert shell_commands(text) == UNINSTALL  # "then uninstall as above"
    [paragraph] = [
        " ".join(p.split()) for p in text.split("\n\n") if p.startswith("With `components/scheduler`")
    ]
    assert "Remove `schedulerName` from the policy's profiles and apply it" in paragraph
    assert "then uninstall as above" in paragraph
    [listing] = re.findall(r"`(kubectl get pods -A --field-selector [^`]+)`", paragraph)
    words = shlex.split(listing)
    selector = words[words.index("--field-selector") + 1]

    objects = [
        patient_webhook(o) if o["kind"] == "MutatingWebhookConfiguration" else o
        for o in installed(kustomize, ("scheduler",))
    ]
    [scheduler_config] = [o for o in objects if o["metadata"]["name"] == "sparkgate-scheduler-config"]
    [profile] = yaml.safe_load(scheduler_config["data"]["scheduler-config.yaml"])["profiles"]
    scheduler = profile["schedulerName"]
    # The admin's policy sends every profile's executors to it, as docs/install.md says to.
    assert f"`scheduling: {{schedulerName: {scheduler}}}`" in INSTALL_MD.read_text()
    [config_map] = [o for o in objects if o["metadata"]["name"] == "sparkgate-policy"]
    policy = yaml.safe_load(config_map["data"]["policy.yaml"])
    for p in policy["profiles"]:
        p.setdefault("scheduling", {})["schedulerName"] = scheduler
    config_map["data"]["policy.yaml"] = yaml.safe_dump(policy)

    with installed_on_kubesim(objects, tmp_path) as cluster:
        # kubesim's scheduler serves only default-scheduler: the second scheduler, running until the uninstall
        # deletes it, binds nothing meanwhile (a full cluster), so its executors wait as the document says.
        assert not cluster.scheduler.serves({"spec": {"schedulerName": scheduler}})
        volume = tmp_path / "policy"  # the ConfigMap volume of the webhook container
        volume.mkdir()

        def kubelet_updates_the_policy_volume() -> None:
            live = cluster.store.get("configmaps", contract.INSTALL_NAMESPACE, "sparkgate-policy")
            secret_volume(volume, {k: v.encode() for k, v in live["data"].items()})

        kubelet_updates_the_policy_volume()
        with LocalWebhook(volume / "policy.yaml", tmp_path / "webhook", workers=1) as webhook:
            cluster.register_service(contract.INSTALL_NAMESPACE, contract.WEBHOOK_SERVICE, webhook.url)
            allocator = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
            install = Install(cluster, webhook, allocator, Target(), secret_volume)
            assert install.sync() == (Step.CREATE,)
            install.mount_secret()
            spark = Kube.from_kubeconfig(str(cluster.add_user("system:serviceaccount:spark-a:spark")))
            ops = cluster.add_user("ops@example.com")  # not in sparkgate:break-glass
            monkeypatch.setenv("KUBECONFIG", str(ops))
            kube = Kube.from_kubeconfig(str(ops))

            def waiting() -> list[Obj]:
                # The document's selector, sent as kubectl sends it (a field kube-apiserver cannot select
                # pods by is a 400, in kubesim too: kubesim/selectors.py).
                found: list[Obj] = kube.request("GET", "/api/v1/pods", query={"fieldSelector": selector})[
                    "items"
                ]
                return found

            def dry_run_scheduler() -> str:
                pod = executor("spark-a", "app-probe", 1)
                del pod["spec"]["schedulingGates"]
                answer = spark.request(
                    "POST", "/api/v1/namespaces/spark-a/pods", query={"dryRun": "All"}, body=pod
                )
                return str(answer["spec"].get("schedulerName"))

            try:
                for exec_id in (1, 2):
                    pod = spark_creates(spark, "app-s", exec_id)
                    assert contract.gate_index(pod) is not None and pod["spec"]["schedulerName"] == scheduler
                assert {p["metadata"]["name"] for p in waiting()} == {"app-s-exec-1", "app-s-exec-2"}

                # Remove schedulerName from the policy's profiles and apply it; the webhook reloads it.
                for p in policy["profiles"]:
                    del p["scheduling"]["schedulerName"]
                config_map["data"]["policy.yaml"] = yaml.safe_dump(policy)
                apply_all(kube, served(objects))
                kubelet_updates_the_policy_volume()
                cluster.wait_for(
                    lambda: dry_run_scheduler() == "default-scheduler",
                    timeout=30,
                    what="the webhook to reload the policy",
                )
                # Wait until no executor waits for that scheduler; Spark replaces any you delete.
                exec_id = 3
                for _ in range(3):
                    for pod in waiting():
                        meta = pod["metadata"]
                        kube.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")
                        replacement = spark_creates(spark, meta["labels"][contract.LABEL_APP_ID], exec_id)
                        exec_id += 1
                        assert contract.gate_index(replacement) is not None
                assert waiting() == []
                assert exec_id == 5  # the two waiting executors, each replaced once

                for line in UNINSTALL:
                    words = shlex.split(line)
                    if words[0] == "sparkgate":
                        assert main(words[1:]) == 0, line
                    else:  # `kubectl delete -k`: the admin's kustomization, with the scheduler component
                        kubectl(kube, line, objects)
                assert_uninstalled(cluster, kube)
                # Every released executor is for a scheduler that still runs, and is bound.
                pods, _, _ = cluster.store.list_objects("pods")
                released = [p for p in pods if not p["spec"].get("schedulingGates")]
                assert [p["metadata"]["name"] for p in released if not cluster.scheduler.serves(p)] == []
                cluster.wait_for(
                    lambda: all(
                        p["spec"].get("nodeName")
                        for p in cluster.store.list_objects("pods")[0]
                        if not p["spec"].get("schedulingGates")
                    ),
                    timeout=30,
                    what="the released executors bound",
                )
                assert {"app-s-exec-3", "app-s-exec-4"} <= {p["metadata"]["name"] for p in released}
            finally:
                kube.close()
                spark.close()
                allocator.close()
