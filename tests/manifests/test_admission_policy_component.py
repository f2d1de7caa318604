"""The install without the webhook (manifests/components/admission-policy) and sparkgate in that mode on
kubesim: no webhook, certificate or admission Service in the objects; the allocator alone, told to keep the
rendered MutatingAdmissionPolicy applied. Then on kubesim, with no webhook running, a Spark app's executors
are shaped and gated by the API server, released by the allocator within the limits, and a policy edit
reaches the next executor pod without a restart.

The component is rendered by the real kustomize, listed beside the base as docs/install.md shows."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from allocator.admission_policy import TASK
from sandbox.localsystem import AllocatorProcess, lease_holder
from sparkgate import contract
from sparkgate.render import POLICY_NAME

from ..allocator.conftest import Observer, write_policy
from ..allocator.test_integration import gated, running

REPO = Path(__file__).resolve().parents[2]
COMPONENT = REPO / "manifests" / "components" / "admission-policy"
Obj = dict[str, Any]


def with_component(kustomize: ModuleType) -> dict[tuple[str, str], Obj]:
    component = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    by_kind: dict[tuple[str, str], Obj] = kustomize.by_kind(kustomize.install([kustomize.ADMISSION_POLICY]))
    return by_kind


def test_the_component_removes_the_webhook_and_lets_the_allocator_write_the_policy(
    kustomize: ModuleType,
) -> None:
    objects = with_component(kustomize)
    kinds = {kind for kind, _ in objects}
    assert "MutatingWebhookConfiguration" not in kinds
    assert ("Service", contract.WEBHOOK_SERVICE) not in objects
    assert [p["name"] for p in objects[("Service", "sparkgate-metrics")]["spec"]["ports"]] == [
        "allocator-http"
    ]
    pod = objects[("Deployment", "sparkgate")]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["allocator"] and "initContainers" not in pod
    assert [v["name"] for v in pod["volumes"]] == ["policy", "tmp", "api-token"]  # no certificate volume
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["SPARKGATE_ADMISSION"] == "policy" and env["SPARKGATE_CERTS_SYNC"] == "false"
    rules = objects[("ClusterRole", "sparkgate-allocator")]["rules"]
    written = [r for r in rules if r["apiGroups"] == ["admissionregistration.k8s.io"]]
    assert written == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["mutatingadmissionpolicies", "mutatingadmissionpolicybindings"],
            "resourceNames": [POLICY_NAME],
            "verbs": ["create", "patch"],
        }
    ]  # and no longer the webhook configurations' caBundle
    role = objects[("Role", "sparkgate-allocator")]["rules"]
    assert all("secrets" not in r["resources"] for r in role)
    # The gate protection stays: it is a ValidatingAdmissionPolicy, inside the API server already.
    assert ("ValidatingAdmissionPolicy", "sparkgate-gate") in objects


def test_on_kubesim_without_a_webhook_executors_are_shaped_gated_and_released_within_the_limits(
    kustomize: ModuleType, tmp_path: Path
) -> None:
    from kubesim.cluster import Cluster

    env = {
        e["name"]: e.get("value")
        for e in with_component(kustomize)[("Deployment", "sparkgate")]["spec"]["template"]["spec"][
            "containers"
        ][0]["env"]
    }
    policy = write_policy(tmp_path / "policy.yaml", batch=5, per_app=10, delay=0.1)
    with Cluster(nodes=4, node_cpu="10", node_memory="1000Gi", bookmark_interval=0.5) as cluster:
        cluster.add_namespace("spark")
        observer = Observer(cluster, 10, 200, 500, 5)
        allocator = AllocatorProcess(
            cluster, policy, tmp_path, tick=0.2, extra_args=("--admission", str(env["SPARKGATE_ADMISSION"]))
        )
        try:
            cluster.wait_for(
                lambda: lease_holder(cluster) is not None, timeout=60, what="the allocator's lease"
            )
            cluster.wait_for(
                lambda: bool(cluster.store.list_objects("mutatingadmissionpolicybindings")[0]),
                timeout=60,
                what="the allocator to apply the rendered MutatingAdmissionPolicy and then its binding",
            )
            assert not cluster.store.list_objects("mutatingwebhookconfigurations")[0]
            driver = cluster.spark_driver(
                "spark", "etl", executors=30, batch_size=30, batch_delay=0.2, cpu="1"
            )
            cluster.wait_for(
                lambda: running(cluster, driver.app_id) == 30, timeout=120, what="30 executors running"
            )
            assert observer.violations == [] and not observer.bypassed, sorted(observer.bypassed)[:3]
            assert observer.max_in_flight[driver.app_id] <= 10
            assert gated(cluster, driver.app_id) == 0
            pods, _, _ = cluster.store.list_objects(
                "pods", label_selector=f"spark-app-selector={driver.app_id},spark-role=executor"
            )
            assert {p["metadata"]["annotations"][contract.ANNOTATION_PROFILE] for p in pods} == {"spark"}

            # A policy edit: the leader re-renders and applies it; the next executor pod has it.
            text = policy.read_text().replace(
                "  - name: spark\n", "  - name: spark\n    labels: {tier: edited}\n"
            )
            policy.write_text(text)

            def edited() -> bool:
                found = cluster.store.list_objects("mutatingadmissionpolicies")[0]
                return bool(found) and "edited" in yaml.safe_dump(found[0]["spec"])

            cluster.wait_for(edited, timeout=60, what="the edited policy applied")
            driver.scale_to(32)
            cluster.wait_for(lambda: running(cluster, driver.app_id) == 32, timeout=120, what="32 running")
            pods, _, _ = cluster.store.list_objects(
                "pods", label_selector=f"spark-app-selector={driver.app_id},spark-role=executor"
            )
            tiers = sorted(p["metadata"]["labels"].get("tier", "-") for p in pods)
            assert tiers.count("edited") == 2 and tiers.count("-") == 30
            assert observer.violations == [] and not observer.bypassed
            status, body = allocator.get("/metrics")
            assert status == 200
            assert f'sparkgate_allocator_task_runs_total{{result="ok",task="{TASK}"}}' in body
        finally:
            observer.unsubscribe()
            allocator.stop()


def _secrets(value: Any) -> list[str]:
    """The Secrets an object names anywhere (`secret: {name}`)."""
    if isinstance(value, dict):
        named = [value["secret"]["name"]] if isinstance(value.get("secret"), dict) else []
        return named + [s for v in value.values() for s in _secrets(v)]
    if isinstance(value, list):
        return [s for v in value for s in _secrets(v)]
    return []


def test_the_allocator_is_scraped_in_either_mode_without_the_webhooks_secret(kustomize: ModuleType) -> None:
    """The Prometheus Operator skips a whole ServiceMonitor whose TLS Secret it cannot read (its log: `skipping
    servicemonitor ... failed to get ca ...: secrets "..." not found`, prometheus-operator issue #6018). The
    policy mode makes no sparkgate-webhook-tls, so the monitor of the allocator's port names no Secret, and
    finds its port on the metrics Service in both modes."""
    policy = kustomize.ADMISSION_POLICY
    for components in (
        ["prometheus-operator"],
        [policy, "prometheus-operator"],
        ["prometheus-operator", policy],
    ):
        objects = kustomize.by_kind(kustomize.install(components))
        ports = {p["name"] for p in objects[("Service", "sparkgate-metrics")]["spec"]["ports"]}
        monitors = {name: o for (kind, name), o in objects.items() if kind == "ServiceMonitor"}
        scraping = {name: {e["port"] for e in m["spec"]["endpoints"]} for name, m in monitors.items()}
        assert scraping["sparkgate"] == {"allocator-http"}
        assert _secrets(monitors["sparkgate"]) == [] and "allocator-http" in ports, components
        # Without the webhook its port is gone (and its Secret is never made). Listed after the monitors,
        # the component removes the webhook's too (docs/install.md); listed before, the operator skips it.
        assert ("webhook-https" in ports) == (policy not in components)
        if components[-1] == policy:
            assert "sparkgate-webhook" not in monitors
        else:
            assert scraping["sparkgate-webhook"] == {"webhook-https"}
            assert _secrets(monitors["sparkgate-webhook"]) == [contract.CERT_SECRET]
