"""A soak on kubesim: several Spark apps ramp, lose executors, scale down and end while faults are injected
at random (fixed seed) into the API server, and one reflector is made to raise.

The allocator is assembled in this process as `sparkgate allocator` assembles it (allocator/commands.py),
behind the real webhook (gunicorn, TLS) and kubesim over HTTP. The run is bounded by counts, not time: the
faults are paced by executor pod changes (one every CHANGES_PER_FAULT; each round also deletes a running
executor, which Spark replaces, so there is always churn), and the run ends when every fault was injected
and every live app runs all its executors. Checked:

- the limits hold at every committed change (conftest.Observer: per app, per namespace, cluster, one
  unbound batch per app), no gate is removed twice;
- every gated pod of a live app is released once there is room (all running at the end), including those
  of the app whose releases were refused with a persistent 403 once the refusal ends;
- no deletion record is lost: for every app, the deletions the allocator recorded (and persisted in its
  history ConfigMap) are the executor pods that went away;
- under a persistent 403 on gate removals (one app) and on deletes (an ended app), the allocator's writes
  are bounded by its backoff: their count is at most the number of attempts the backoff schedule allows
  in the span between the first and the last of them (kubesim's own timestamps);
- `sparkgate status -o json`, `/apps` and the metrics agree on every count.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import threading
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import kubesim.apiserver
from allocator.commands import assemble
from allocator.deletions import history_name
from allocator.http import StatusServer
from allocator.loop import Options
from allocator.metrics import AllocatorMetrics
from allocator.workqueue import Backoff
from kubesim.cluster import Cluster
from kubesim.errors import ApiError
from sandbox.local_webhook import LocalWebhook
from sandbox.localsystem import webhook_configurations
from sparkgate import contract
from sparkgate.cli import main
from sparkgate.contract import AppKey
from sparkgate.kube import Kube
from sparkgate.policy_file import PolicySource

from .conftest import Observer, write_policy

SEED = 20261123
BATCH, PER_APP, PER_NS, CLUSTER = 5, 10, 15, 25
EXECUTORS = 16
FAULTS = 300
CHANGES_PER_FAULT = 4
BACKOFF = Backoff(base=0.2, cap=4.0)
DENIED = "spark-denied"


def allowed_attempts(span: float, backoff: Backoff) -> int:
    """The most attempts a backoff schedule allows within `span` seconds: the first, then one after each
    backoff delay (1st, 2nd, ... failure)."""
    attempts, elapsed = 1, 0.0
    while elapsed + backoff.delay(attempts) <= span:
        elapsed += backoff.delay(attempts)
        attempts += 1
    return attempts


class DeletionCount:
    """Executor pods that went away (DELETED), by app, as the store commits them."""

    def __init__(self, cluster: Cluster) -> None:
        self.lock = threading.Lock()
        self.by_app: dict[AppKey, set[str]] = {}  # uids
        self.changes = 0
        self.unsubscribe = cluster.store.subscribe(self.on_change)

    def on_change(self, kind: str, resource: str, obj: dict[str, Any]) -> None:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if resource != "pods" or labels.get(contract.LABEL_ROLE) != contract.ROLE_EXECUTOR:
            return
        with self.lock:
            self.changes += 1
            if kind == "DELETED":
                key = AppKey(obj["metadata"]["namespace"], labels[contract.LABEL_APP_ID])
                self.by_app.setdefault(key, set()).add(obj["metadata"]["uid"])


@pytest.fixture
def soak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    monkeypatch.setattr(kubesim.apiserver._Handler, "disable_nagle_algorithm", True, raising=False)
    policy = write_policy(
        tmp_path / "policy.yaml", batch=BATCH, delay=0, per_app=PER_APP, per_ns=PER_NS, cluster=CLUSTER
    )
    with (
        Cluster(
            nodes=4, node_cpu="12", node_memory="64Gi", start_delay=0.2, bookmark_interval=0.5
        ) as cluster,
        LocalWebhook(policy, tmp_path / "webhook", allocator_users=(contract.ALLOCATOR_USER,)) as webhook,
    ):
        for namespace in ("spark", "spark-b", DENIED):
            cluster.add_namespace(namespace)
        mutating, validating = webhook_configurations(webhook.url, webhook.ca_pem)
        cluster.store.create("mutatingwebhookconfigurations", mutating)
        cluster.store.create("validatingwebhookconfigurations", validating)
        kube = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
        metrics = AllocatorMetrics()
        options = Options(
            identity="alloc-soak",
            tick=0.2,
            retry_period=0.3,
            backoff_base=BACKOFF.base,
            backoff_cap=BACKOFF.cap,
        )
        allocator = assemble(kube, PolicySource(str(policy), contract.INSTALL_NAMESPACE), options, metrics)
        server = StatusServer(allocator.controller, allocator.extender, "127.0.0.1", 0)
        server.start()
        allocator.start()
        loop = threading.Thread(target=allocator.controller.run, name="loop", daemon=True)
        loop.start()
        try:
            yield {"cluster": cluster, "allocator": allocator, "metrics": metrics, "server": server}
        finally:
            allocator.stop.set()
            loop.join(timeout=30)
            allocator.shutdown()
            server.stop()
            kube.close()


def server_get(server: StatusServer, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=10) as r:
        return str(r.read().decode())


def get_json(server: StatusServer, path: str) -> Any:
    return json.loads(server_get(server, path))


def test_soak_with_random_faults_keeps_the_limits_releases_everything_and_loses_no_deletion(
    soak: dict[str, Any],
) -> None:
    cluster: Cluster = soak["cluster"]
    metrics: AllocatorMetrics = soak["metrics"]
    server: StatusServer = soak["server"]
    controller = soak["allocator"].controller
    rng = random.Random(SEED)  # the faults
    victims = random.Random(SEED + 1)  # which executor is lost (from pods that depend on timing)
    observer = Observer(cluster, PER_APP, PER_NS, CLUSTER, BATCH)
    deleted = DeletionCount(cluster)
    faults = cluster.faults
    user = contract.ALLOCATOR_USER

    # One reflector raises once, on a random event: the "drivers" watch, at its n-th event.
    drivers = next(r for r in controller.reflectors if r.name == "drivers")
    handler, raise_at, events = drivers.on_event, rng.randint(3, 12), [0]

    def faulty(kind: str, obj: dict[str, Any]) -> None:
        events[0] += 1
        if events[0] == raise_at:
            raise RuntimeError("soak: a reflector made to raise")
        handler(kind, obj)

    drivers.on_event = faulty
    seen: set[str] = set()
    controller.cache.pod_observers.append(lambda old, new: seen.add((new or old).uid))

    # A pod admitted without sparkgate (the webhook bypassed): counted toward the limits and reported.
    bypass = {
        "metadata": {
            "name": "bypass-exec-1",
            "namespace": "spark-b",
            "labels": {contract.LABEL_ROLE: contract.ROLE_EXECUTOR, contract.LABEL_APP_ID: "bypass", contract.LABEL_EXEC_ID: "1"},
        },
        "spec": {"containers": [{"name": "spark-kubernetes-executor", "image": "spark", "resources": {"requests": {"cpu": "100m"}}}]},
    }  # fmt: skip
    cluster.store.create("pods", bypass)
    cluster.wait_for(
        lambda: (
            cluster.store.get("pods", "spark-b", "bypass-exec-1").get("status", {}).get("phase") == "Running"
        ),
        timeout=60,
        what="the bypassed pod running",
    )
    # Writes refused for good in one namespace: gate removals of one app, deletes of an app that ended.
    faults.fail("patch", "pods", 403, count=None, namespace=DENIED)
    faults.fail("delete", "pods", 403, count=None, namespace=DENIED)
    options = {"batch_size": EXECUTORS, "batch_delay": 0.2, "cpu": "500m", "memory": "512Mi"}
    refused = cluster.spark_driver(DENIED, "refused", executors=4, **options)
    ended = cluster.spark_driver(DENIED, "ended", executors=4, **options)
    cluster.wait_for(lambda: len(ended.pods()) == 4, timeout=60, what="the ended app's pods")
    ended.stop()
    cluster.store.patch(  # the driver finished: its gated pods are to be deleted (refused: 403)
        "pods", DENIED, ended.driver_name, {"status": {"phase": "Succeeded"}}, "application/merge-patch+json",
        subresource="status",
    )  # fmt: skip
    apps = [
        cluster.spark_driver(ns, f"app-{ns}-{i}", executors=EXECUTORS, **options)
        for ns in ("spark", "spark-b")
        for i in range(2)
    ]

    def executors_of(app_id: str) -> int:
        pods, _, _ = cluster.store.list("pods", DENIED, label_selector=f"{contract.LABEL_APP_ID}={app_id}")
        return sum(
            1 for p in pods if p["metadata"]["labels"].get(contract.LABEL_ROLE) == contract.ROLE_EXECUTOR
        )

    kinds = Counter[str]()
    writes: dict[str, tuple[int, int]] = {}

    def lose_an_executor() -> None:
        # Only an executor its driver has seen: one created and lost while the driver's watch was down
        # (dropped, then compacted away: the relist cannot show a deleted pod) is never replaced by Spark
        # either (SPARK-44609: kubesim/sparkdriver.py), which would stall the soak on Spark, not on
        # sparkgate.
        seen = {p["metadata"]["name"] for app in apps for p in app.pods().values()}
        running = [p for ns in ("spark", "spark-b") for p in cluster.store.list_objects("pods", ns)[0]
                   if (p.get("status") or {}).get("phase") == "Running"
                   and p["metadata"]["labels"].get(contract.LABEL_ROLE) == contract.ROLE_EXECUTOR
                   and p["metadata"]["name"] in seen]  # fmt: skip
        if running:
            victim = victims.choice(sorted(running, key=lambda p: p["metadata"]["name"]))
            with contextlib.suppress(ApiError):  # it may have gone meanwhile (a scale-down)
                cluster.store.delete("pods", victim["metadata"]["namespace"], victim["metadata"]["name"])

    def inject(kind: str) -> None:
        kinds[kind] += 1
        if kind == "500":
            faults.fail(
                rng.choice(["patch", "list", "update"]), rng.choice(["pods", "configmaps"]), 500, count=2
            )
        elif kind == "409":
            faults.fail("patch", "pods", 409, count=1)
        elif kind == "429":
            faults.fail(
                rng.choice(["patch", "list", "get"]),
                rng.choice(["pods", "configmaps"]),
                429,
                count=1,
                retry_after=1,
            )
        elif kind == "dropped watches":
            faults.drop_watches(rng.choice(["*", "pods", "configmaps"]))
        elif kind == "410":
            faults.drop_watches()
            cluster.store.compact()  # every resourceVersion too old: the watches get 410 and relist
        elif kind == "slow":
            faults.delay(rng.choice(["patch", "list", "watch", "create"]), "*", 0.3, count=3)
        elif kind == "executor lost":
            lose_an_executor()
        elif kind == "scale down and up":
            app = rng.choice(apps)
            app.scale_to(EXECUTORS // 2)
            threading.Timer(0.5, app.scale_to, args=(EXECUTORS,)).start()

    kinds_list = ["500", "409", "429", "dropped watches", "410", "slow", "executor lost", "scale down and up"]
    for n in range(FAULTS):
        with deleted.lock:
            target = deleted.changes + CHANGES_PER_FAULT
        inject(kinds_list[n % len(kinds_list)] if n < len(kinds_list) else rng.choice(kinds_list))
        lose_an_executor()  # churn, so that the next fault meets pods being created, released and bound
        cluster.wait_for(
            lambda t=target: deleted.changes >= t, timeout=60, what=f"{CHANGES_PER_FAULT} pod changes"
        )  # type: ignore[misc]
    faults.clear(keep_namespace=DENIED)  # the persistent refusals stay, without a gap

    def everything_runs() -> bool:
        """Every executor pod of every live app released and running. (After many faults a simulated driver
        may stop short of EXECUTORS pods: kubesim's driver lacks Spark's timeout for created executors it never
        saw, spark.kubernetes.allocation.executor.timeout; whatever the drivers created must run.)"""
        for app in apps:
            pods, _, _ = cluster.store.list(
                "pods",
                app.namespace,
                label_selector=f"{contract.LABEL_APP_ID}={app.app_id},{contract.LABEL_ROLE}=executor",
            )
            live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            if any((p.get("status") or {}).get("phase") != "Running" for p in live):
                return False
        return True

    def report() -> str:
        summary = [
            {k: a[k] for k in ("namespace", "appId", "gated", "inFlight", "running", "waitingFor", "backoff")}
            for a in get_json(server, "/apps")["apps"]
        ]
        drivers = [(a.running(), a.dead, a.failures, len(a.pods())) for a in apps]
        stuck = [
            (p["metadata"]["name"], p["spec"].get("nodeName"), p.get("status"))
            for ns in ("spark", "spark-b")
            for p in cluster.store.list_objects("pods", ns)[0]
            if (p.get("status") or {}).get("phase") == "Pending"
        ]
        drivers.append(stuck)  # type: ignore[arg-type]
        return f"drivers (running, dead, failures, pods) {drivers}; /apps {summary}"

    try:
        cluster.wait_for(everything_runs, timeout=120, what="every live app's executors running")
    except TimeoutError as e:
        raise AssertionError(report()) from e

    # The refused writes: bounded by each app's backoff (one failed write per attempt), whatever the decisions
    # and events meanwhile.
    for driver in (refused, ended):
        entries = [
            e
            for e in cluster.requests.entries()
            if e.user == user
            and e.verb in ("patch", "delete")
            and (e.name or "").startswith(f"{driver.app_name}-")
        ]
        times = [e.time for e in entries]
        allowed = allowed_attempts(times[-1] - times[0], BACKOFF)
        writes[driver.app_name] = (len(times), allowed)
        assert 2 <= len(times) <= allowed, (
            f"{driver.app_name}: {len(times)} writes in {times[-1] - times[0]:.1f}s (allowed {allowed}): "
            f"{[(round(e.time - times[0], 2), e.verb, e.code, e.name) for e in entries]}"
        )
    failures = metrics.registry.get_sample_value(
        "sparkgate_allocator_write_failures_total", {"namespace": DENIED}
    )
    assert (failures or 0) >= 2
    # The refusal ends: the refused app's pods are released, the ended app's pods deleted.
    faults.clear()
    cluster.wait_for(
        lambda: refused.running() == 4 and executors_of(ended.app_id) == 0,
        timeout=60,
        what="the refused writes done",
    )
    cluster.wait_for(everything_runs, timeout=60, what="every live app's executors running")

    assert observer.violations == [], observer.violations[:10]
    assert not any(n > 1 for n in observer.releases.values())
    assert (
        metrics.registry.get_sample_value("sparkgate_allocator_reflector_crashes_total", {"watch": "drivers"})
        == 1
    )

    # No deletion record lost: recorded (and persisted) = executor pods gone, app by app.
    def recorded(key: AppKey) -> int:
        document = get_json(server, f"/apps/{key.namespace}/{key.app_id}")
        return sum(document["deletions"].values())

    def persisted(key: AppKey) -> int:
        try:
            config = cluster.store.get("configmaps", contract.INSTALL_NAMESPACE, history_name(key))
        except Exception:
            return 0
        return sum(json.loads(config["data"]["history.json"])["counts"].values())

    # What the allocator's watch showed it (a pod created and deleted while a watch was being re-established
    # after a drop or a 410 is never seen: no informer can know it; counted and reported).
    with deleted.lock:
        gone = {k: len(uids & seen) for k, uids in deleted.by_app.items()}
        unseen = sum(len(uids - seen) for uids in deleted.by_app.values())
    assert sum(gone.values()) >= 10, gone
    try:
        cluster.wait_for(
            lambda: all(recorded(k) == n and persisted(k) == n for k, n in gone.items()), timeout=60
        )
    except TimeoutError as e:
        found = {k.app_id[-6:]: (n, recorded(k), persisted(k)) for k, n in gone.items()}
        raise AssertionError(f"(gone, recorded, persisted) by app: {found}") from e

    # sparkgate status, /apps and the metrics agree on every count.
    def agree() -> bool:
        document = get_json(server, "/apps")
        out = io.StringIO()
        with redirect_stdout(out):
            assert main(["status", "--url", f"http://127.0.0.1:{server.port}", "-o", "json"]) == 0
        if json.loads(out.getvalue())["apps"] != document["apps"]:
            return False
        scraped = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(server_get(server, "/metrics"))
            for s in family.samples
        }

        def sample(name: str, labels: dict[str, str] | None = None) -> float | None:
            return scraped.get((name, tuple(sorted((labels or {}).items()))))

        for app in document["apps"]:
            for state, field in (("gated", "gated"), ("in_flight", "inFlight"), ("running", "running")):
                labels = {"namespace": app["namespace"], "app": app["appId"], "state": state}
                if (sample("sparkgate_allocator_executors", labels) or 0) != app[field]:
                    return False
        cluster_doc = document["cluster"]
        for namespace in ("spark", "spark-b", DENIED):
            if (sample("sparkgate_allocator_in_flight", {"namespace": namespace}) or 0) != cluster_doc[
                "inFlightByNamespace"
            ].get(namespace, 0):
                return False
            if (sample("sparkgate_allocator_bypassed_pods", {"namespace": namespace}) or 0) != cluster_doc[
                "bypassedByNamespace"
            ].get(namespace, 0):
                return False
        return sample("sparkgate_allocator_apps") == len(document["apps"])

    cluster.wait_for(agree, timeout=30, what="status, /apps and the metrics to agree")
    assert get_json(server, "/apps")["cluster"]["bypassedByNamespace"] == {"spark-b": 1}
    assert set(kinds) == set(kinds_list) and sum(kinds.values()) == FAULTS
    print(
        f"soak: {FAULTS} faults {dict(kinds)}, {deleted.changes} executor pod changes, "
        f"{sum(gone.values())} deletions seen ({unseen} never seen), refused writes (made, allowed by the backoff) {writes}"
    )
