"""Admission, scheduler, kubelets and simulated Spark drivers: the cluster as sparkgate sees it."""

from __future__ import annotations

import base64
import datetime as dt
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from certs.pki import make_ca, make_serving_cert
from kubesim.cluster import Cluster
from sparkgate.ratelimit import TokenBucket

from .conftest import pod

Answer = Callable[[dict[str, Any]], dict[str, Any]]


class TinyWebhook:
    """An HTTPS admission webhook answering with `answer(request)`; records the requests it got.

    Its configurations allow the API server 30 s (the most `timeoutSeconds` accepts) with `failurePolicy:
    Fail`: the webhook answers at once, so the timeout is only a safety net and a pause of the busy test
    process never turns an answer into a failed call. No test here is about the timeout itself.

    `framing` is how an answer's end is told: "length" (Content-Length, the connection kept), "chunked"
    (Transfer-Encoding: chunked), "close" (Connection: close, the body ends with the connection), "dropped"
    (Content-Length and HTTP/1.1 keep-alive, then the connection closed all the same, as an idle timeout of
    the server does). `connections` counts the connections it accepted."""

    def __init__(self, answer: Answer, framing: str = "length") -> None:
        now = dt.datetime.now(dt.UTC)
        self.ca = make_ca("test-ca", now, dt.timedelta(hours=1))
        serving = make_serving_cert(
            self.ca, ["localhost"], now, dt.timedelta(hours=1), ip_addresses=("127.0.0.1",)
        )
        self.requests: list[dict[str, Any]] = []
        self.connections = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return

            def setup(self) -> None:
                outer.connections += 1
                super().setup()

            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(review["request"])
                body = json.dumps(
                    {
                        "apiVersion": "admission.k8s.io/v1",
                        "kind": "AdmissionReview",
                        "response": {"uid": review["request"]["uid"], **answer(review["request"])},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if framing == "chunked":
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    half = len(body) // 2
                    for part in (body[:half], body[half:], b""):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                    return
                if framing == "close":
                    self.send_header("Connection", "close")
                else:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = framing in ("close", "dropped")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        import tempfile

        with tempfile.NamedTemporaryFile() as cert, tempfile.NamedTemporaryFile() as key:
            cert.write(serving.cert_pem)
            key.write(serving.key_pem)
            cert.flush()
            key.flush()
            context.load_cert_chain(cert.name, key.name)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def config(self, name: str = "test.example.com", **webhook: Any) -> dict[str, Any]:
        hook = {
            "name": name,
            "clientConfig": {
                "url": self.url + "/mutate",
                "caBundle": base64.b64encode(self.ca.cert_pem).decode(),
            },
            "rules": [
                {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
            ],
            "objectSelector": {"matchLabels": {"spark-role": "executor"}},
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 30,
            **webhook,
        }
        return {"metadata": {"name": name}, "webhooks": [hook]}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def gate_patch(request: dict[str, Any]) -> dict[str, Any]:
    ops = [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "sparkgate.io/allocator"}]}]
    return {
        "allowed": True,
        "patchType": "JSONPatch",
        "patch": base64.b64encode(json.dumps(ops).encode()).decode(),
    }


@pytest.fixture
def webhook() -> Iterator[TinyWebhook]:
    w = TinyWebhook(gate_patch)
    yield w
    w.close()


def executor_pod(name: str) -> dict[str, Any]:
    return pod(name, {"spark-role": "executor", "spark-app-selector": "spark-1"})


@pytest.mark.parametrize(
    ("framing", "connections", "calls"),
    [("length", 1, 3), ("chunked", 1, 3), ("close", 3, 3), ("dropped", 3, 5)],
)
def test_a_webhooks_answer_is_read_however_it_is_framed_and_a_dropped_connection_is_retried_once(
    cluster: Cluster, core: client.CoreV1Api, framing: str, connections: int, calls: int
) -> None:
    """kubesim's webhook client (kubesim/admission.py `_Connection`) reads an answer framed by its length,
    chunked or by the end of the connection, keeps the connection where HTTP/1.1 lets it, and sends a
    review again once on a new connection when the kept one turns out closed (as Go's net/http retries a
    request on a kept connection the server closed before it answered)."""
    hook = TinyWebhook(gate_patch, framing)
    try:
        cluster.store.create("mutatingwebhookconfigurations", hook.config())
        created = [core.create_namespaced_pod("spark", executor_pod(f"e{i}")) for i in range(3)]
    finally:
        hook.close()
    assert all([g.name for g in p.spec.scheduling_gates] == ["sparkgate.io/allocator"] for p in created)
    assert len(hook.requests) == 3 and hook.connections == connections
    assert cluster.admission.calls == calls  # each dropped connection: one send on it, then one on a new one


def test_mutating_webhook_patch_is_applied_and_carries_the_users_identity(
    cluster: Cluster, core: client.CoreV1Api, webhook: TinyWebhook
) -> None:
    cluster.store.create("mutatingwebhookconfigurations", webhook.config())
    created = core.create_namespaced_pod("spark", executor_pod("e1"))
    assert [g.name for g in created.spec.scheduling_gates] == ["sparkgate.io/allocator"]
    assert (
        webhook.requests[0]["userInfo"]["username"] == "admin"
        and webhook.requests[0]["operation"] == "CREATE"
    )
    core.create_namespaced_pod("spark", pod("not-an-executor"))
    assert len(webhook.requests) == 1, "objectSelector: only executor pods are sent"


def test_namespace_selector_excludes_namespaces(
    cluster: Cluster, core: client.CoreV1Api, webhook: TinyWebhook
) -> None:
    """namespaceSelector matches the namespace's labels; every namespace has kubernetes.io/metadata.name."""
    selector = {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["spark"]}]
    }
    cluster.store.create("mutatingwebhookconfigurations", webhook.config(namespaceSelector=selector))
    assert core.create_namespaced_pod("spark", executor_pod("e1")).spec.scheduling_gates is None
    assert core.create_namespaced_pod("default", executor_pod("e2")).spec.scheduling_gates


def test_denial_reaches_the_client_with_the_real_message(cluster: Cluster, core: client.CoreV1Api) -> None:
    deny = TinyWebhook(lambda r: {"allowed": False, "status": {"code": 403, "message": "no executors today"}})
    try:
        cluster.store.create("validatingwebhookconfigurations", deny.config("deny.example.com"))
        with pytest.raises(client.ApiException) as e:
            core.create_namespaced_pod("spark", executor_pod("e1"))
        assert e.value.status == 403
        assert (
            json.loads(e.value.body)["message"]
            == 'admission webhook "deny.example.com" denied the request: no executors today'
        )
    finally:
        deny.close()


def test_a_webhook_that_is_down_fails_or_is_ignored_by_failure_policy(
    cluster: Cluster, core: client.CoreV1Api, webhook: TinyWebhook
) -> None:
    config = webhook.config()
    webhook.close()
    cluster.store.create("mutatingwebhookconfigurations", config)
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", executor_pod("e1"))
    assert (
        e.value.status == 500
        and 'failed calling webhook "test.example.com"' in json.loads(e.value.body)["message"]
    )
    config["webhooks"][0]["failurePolicy"] = "Ignore"
    cluster.store.replace("mutatingwebhookconfigurations", None, "test.example.com", config)
    assert core.create_namespaced_pod("spark", executor_pod("e2")).spec.scheduling_gates is None


def test_a_webhook_behind_a_service_is_verified_as_the_services_dns_name(
    cluster: Cluster, core: client.CoreV1Api, webhook: TinyWebhook
) -> None:
    """kube-apiserver dials a Service's endpoint but verifies the certificate as `<name>.<namespace>.svc`
    (Kubernetes docs, "Dynamic Admission Control": the server certificate must be valid for that host name).
    The webhook's certificate names only localhost and 127.0.0.1, so through a Service it is refused even
    though the same server is trusted by URL."""
    cluster.register_service("spark", "hooks", webhook.url)
    config = webhook.config()
    config["webhooks"][0]["clientConfig"] = {
        "service": {"namespace": "spark", "name": "hooks", "path": "/mutate"},
        "caBundle": config["webhooks"][0]["clientConfig"]["caBundle"],
    }
    cluster.store.create("mutatingwebhookconfigurations", config)
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", executor_pod("e1"))
    message = json.loads(e.value.body)["message"]
    assert 'failed calling webhook "test.example.com"' in message and "hooks.spark.svc" in message
    assert webhook.requests == []
    cluster.store.replace("mutatingwebhookconfigurations", None, "test.example.com", webhook.config())
    assert core.create_namespaced_pod("spark", executor_pod("e2")).spec.scheduling_gates is not None


def test_scheduler_binds_ungated_pods_that_fit_respecting_taints(
    cluster: Cluster, core: client.CoreV1Api
) -> None:
    cluster.add_node(
        "tainted",
        cpu="64",
        memory="256Gi",
        taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
    )
    for i in range(10):  # 2 nodes x 4 CPU: room for 8 pods of 1 CPU
        core.create_namespaced_pod("spark", pod(f"p{i}"))
    core.create_namespaced_pod("spark", pod("gated", schedulingGates=[{"name": "x/y"}]))
    core.create_namespaced_pod(
        "spark",
        pod("tolerant", tolerations=[{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]),
    )
    store = cluster.store

    def where() -> dict[str, str | None]:
        return {
            p["metadata"]["name"]: p["spec"].get("nodeName") for p in store.list_objects("pods", "spark")[0]
        }

    cluster.wait_for(
        lambda: sum(1 for n in where().values() if n) == 9, what="8 pods + the tolerant one bound"
    )
    placed = where()
    assert placed["gated"] is None and placed["tolerant"] == "tainted"
    assert [n for n in placed.values()].count("tainted") == 1
    unbound = [
        p
        for p in store.list_objects("pods", "spark")[0]
        if not p["spec"].get("nodeName") and p["metadata"]["name"] != "gated"
    ]
    cluster.wait_for(
        lambda: all(
            c.get("reason") == "Unschedulable"
            for p in unbound
            for c in store.get("pods", "spark", p["metadata"]["name"])["status"].get("conditions", [])
        )
    )
    assert [p["metadata"]["name"] for p in unbound] == ["p8", "p9"], "first come, first served"


def test_a_pod_that_ends_or_is_deleted_frees_its_room_for_a_waiting_pod(
    cluster: Cluster, core: client.CoreV1Api
) -> None:
    """kube-scheduler counts a bound pod on its node until the pod is deleted or terminated: its informer of
    assigned pods leaves out Succeeded and Failed pods (pkg/scheduler/eventhandlers.go, the pod informer's
    field selector status.phase!=Succeeded,status.phase!=Failed). kubesim's scheduler keeps the same sums
    from the store's events (kubesim/scheduler.py `_account`)."""
    for i in range(10):  # 2 nodes x 4 CPU: room for 8 pods of 1 CPU
        core.create_namespaced_pod("spark", pod(f"p{i}"))
    store = cluster.store

    def bound() -> set[str]:
        return {
            p["metadata"]["name"] for p in store.list_objects("pods", "spark")[0] if p["spec"].get("nodeName")
        }

    def refused(name: str) -> bool:
        conditions = store.get("pods", "spark", name)["status"].get("conditions", [])
        return any(c.get("reason") == "Unschedulable" for c in conditions)

    cluster.wait_for(lambda: len(bound()) == 8 and refused("p8") and refused("p9"), what="8 bound, 2 refused")
    running = lambda n: store.get("pods", "spark", n)["status"]["phase"] == "Running"  # noqa: E731
    cluster.wait_for(lambda: running("p0") and running("p1"), what="p0 and p1 running")
    cluster.kubelet.succeed("spark", "p0")
    cluster.wait_for(lambda: "p8" in bound(), what="p8 bound in the room p0 left")
    assert not refused("p8") and "p9" not in bound()
    core.delete_namespaced_pod("p1", "spark", grace_period_seconds=0)
    cluster.wait_for(lambda: "p9" in bound(), what="p9 bound in the room p1 left")
    core.create_namespaced_pod("spark", pod("p10"))
    cluster.wait_for(lambda: refused("p10"), what="p10 refused: 8 live pods fill the nodes again")
    assert bound() == {f"p{i}" for i in range(10)} - {"p1"}


def test_kubelet_runs_fails_and_evicts_pods(cluster: Cluster, core: client.CoreV1Api) -> None:
    for name in ("a", "b", "c"):
        core.create_namespaced_pod("spark", pod(name))
    phase = lambda n: cluster.store.get("pods", "spark", n)["status"]["phase"]  # noqa: E731
    cluster.wait_for(lambda: all(phase(n) == "Running" for n in "abc"))
    cluster.kubelet.oom_kill("spark", "a")
    cluster.kubelet.evict("spark", "b")
    cluster.kubelet.succeed("spark", "c")
    a, b = cluster.store.get("pods", "spark", "a"), cluster.store.get("pods", "spark", "b")
    assert (
        a["status"]["phase"] == "Failed"
        and a["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] == "OOMKilled"
    )
    assert b["status"]["reason"] == "Evicted" and phase("c") == "Succeeded"


def test_a_pod_mounting_a_missing_config_map_waits_in_container_creating_until_it_exists(
    cluster: Cluster, core: client.CoreV1Api
) -> None:
    """As the kubelet's volume manager: the pod stays Pending, its container waiting (ContainerCreating),
    and starts once the ConfigMap exists; an `optional` one does not hold it."""
    volumes = [
        {"name": "conf", "configMap": {"name": "conf"}},
        {"name": "opt", "configMap": {"name": "no", "optional": True}},
    ]
    core.create_namespaced_pod("spark", pod("m", volumes=volumes))

    def waiting() -> str | None:
        status = cluster.store.get("pods", "spark", "m")["status"]
        states = [c["state"] for c in status.get("containerStatuses") or []]
        return states[0].get("waiting", {}).get("reason") if states and status["phase"] == "Pending" else None

    cluster.wait_for(lambda: waiting() == "ContainerCreating", what="the container waiting for its volume")
    cluster.store.create("configmaps", {"metadata": {"name": "conf", "namespace": "spark"}, "data": {}})
    cluster.wait_for(lambda: cluster.store.get("pods", "spark", "m")["status"]["phase"] == "Running")


def test_a_killed_client_mode_driver_leaves_its_pods_and_its_executors_exit(cluster: Cluster) -> None:
    """Client mode: no driver pod, nothing owned; kill -9 of the JVM deletes nothing, and its executors exit 1
    when they lose the driver (Spark's CoarseGrainedExecutorBackend)."""
    driver = cluster.spark_driver("spark", "nb", executors=3, batch_size=3, batch_delay=0.1, driver_pod=False)
    cluster.wait_for(lambda: driver.running() == 3, what="3 running executors")
    pods = lambda: cluster.store.list_objects("pods", "spark", label_selector="spark-role=executor")[0]  # noqa: E731
    assert all("ownerReferences" not in p["metadata"] for p in pods())
    assert not cluster.store.list_objects("pods", "spark", label_selector="spark-role=driver")[0]
    driver.kill(cluster.kubelet.fail)
    cluster.wait_for(
        lambda: [p["status"]["phase"] for p in pods()] == ["Failed"] * 3, what="the executors exited"
    )
    conf = cluster.store.list_objects(
        "configmaps", "spark", label_selector=f"spark-app-selector={driver.app_id}"
    )[0]
    assert len(conf) == 1 and "ownerReferences" not in conf[0]["metadata"]
    driver.stop()


def test_spark_driver_creates_batches_and_ends_with_all_running(cluster: Cluster) -> None:
    """Spark 4.x: one batch per cycle, the next only once the previous pods were seen (5, 5, 2)."""
    cluster.add_node("big", cpu="64", memory="256Gi")
    driver = cluster.spark_driver("spark", "etl", executors=12, batch_size=5, batch_delay=0.2, cpu="1")
    cluster.wait_for(lambda: driver.running() == 12, what="12 running executors")
    assert driver.batches == [5, 5, 2] and driver.created == list(range(1, 13))
    assert (
        cluster.requests.count(verb="create", resource="pods", user="system:serviceaccount:spark:spark") == 13
    )
    executors = [
        p for p in cluster.store.list_objects("pods", "spark", label_selector="spark-role=executor")[0]
    ]
    assert all(p["metadata"]["ownerReferences"][0]["name"] == "etl-driver" for p in executors)
    driver.scale_to(12)
    cluster.store.delete("pods", "spark", "etl-driver", grace_period_seconds=0)
    cluster.wait_for(
        lambda: not cluster.store.list_objects("pods", "spark")[0],
        what="executors garbage-collected with their driver",
    )


def test_a_pod_that_came_and_went_before_its_creation_returned_does_not_block_the_driver(
    cluster: Cluster,
) -> None:
    """The soak's stall (CI, a loaded machine): the creation's answer came after the watch had shown the pod
    added and deleted (released, run, lost). Spark sees such a pod in its snapshots (PodDeleted) and drops
    it from its newly created executors; the simulated driver, whose watch runs in its own thread, must not
    wait for it forever. Driven by hand: the cycle in this thread, the watch's events delivered inside the
    creation."""
    driver = cluster.spark_driver("spark", "slow", executors=2, batch_size=2, start=False)
    create = driver.kube.create

    def answered_late(path: str, body: dict[str, Any]) -> dict[str, Any]:
        created = create(path, body)
        gone = cluster.store.delete("pods", "spark", created["metadata"]["name"], grace_period_seconds=0)
        driver._event("ADDED", created)  # what the watch showed before the answer came
        driver._event("DELETED", gone)
        return created

    driver.kube.create = answered_late  # type: ignore[method-assign]
    driver._cycle()
    assert driver.created == [1, 2] and driver.unseen() == set() and driver.pods() == {}
    driver.kube.create = create  # type: ignore[method-assign]
    driver._cycle()  # both are gone: Spark asks for two more at once
    assert driver.created == [1, 2, 3, 4] and driver.unseen() == {3, 4}


def test_spark_deployment_allocator_creates_every_executor_at_once_and_replaces_deleted_ones(
    cluster: Cluster,
) -> None:
    """Spark 4.2+'s Deployment allocator (docs/real-cluster-facts.md): all replicas at once, whatever the batch
    size, with spark-exec-id EXECID, pod-template-hash and a pod-deletion-cost; a deleted one is recreated."""
    cluster.add_node("big", cpu="64", memory="256Gi")
    driver = cluster.spark_driver(
        "spark", "dep", executors=20, batch_size=5, batch_delay=0.2, cpu="1", allocator="deployment"
    )
    cluster.wait_for(lambda: driver.running() == 20, what="20 running executors")
    assert driver.batches == [20]
    executors = cluster.store.list_objects("pods", "spark", label_selector="spark-role=executor")[0]
    for p in executors:
        meta = p["metadata"]
        assert meta["labels"]["spark-exec-id"] == "EXECID" and meta["labels"]["pod-template-hash"]
        assert meta["annotations"]["controller.kubernetes.io/pod-deletion-cost"] == "0"
        assert meta["name"].startswith(f"spark-d-{driver.app_id}-0-")
    gone = executors[0]["metadata"]["name"]
    cluster.store.delete("pods", "spark", gone, grace_period_seconds=0)
    cluster.wait_for(
        lambda: driver.running() == 20 and len(driver.created) == 21, what="the deleted replica replaced"
    )
    names = {p["metadata"]["name"] for p in cluster.store.list_objects("pods", "spark")[0]}
    assert gone not in names and driver.batches == [20, 1]


def test_spark_deployment_allocator_creates_in_the_replicaset_controllers_slow_start_batches(
    cluster: Cluster,
) -> None:
    """replica_set.go `slowStartBatch`: 1, 2, 4, 8, ... creations, each batch's at once, the next batch when
    the whole batch is answered. The webhook holds each admission until its whole batch has arrived: a
    driver that created one pod at a time would leave the second call waiting for a third that never came,
    one that created every pod at once would have more than a batch in flight."""
    waves = [1, 2, 4, 8, 5]  # 20 replicas
    ends = [sum(waves[: i + 1]) for i in range(len(waves))]
    arrived, in_flight, peaks, stalled = 0, 0, [], []
    lock = threading.Condition()

    def hold_for_the_batch(_: dict[str, Any]) -> dict[str, Any]:
        nonlocal arrived, in_flight
        with lock:
            arrived += 1
            in_flight += 1
            peaks.append(in_flight)
            lock.notify_all()
            end = next(e for e in ends if e >= arrived)
            if not lock.wait_for(lambda: arrived >= end, timeout=30):
                stalled.append(arrived)
            in_flight -= 1
        return {"allowed": True}

    hook = TinyWebhook(hold_for_the_batch)
    try:
        cluster.store.create("mutatingwebhookconfigurations", hook.config("batches.example.com"))
        cluster.add_node("big", cpu="64", memory="256Gi")
        driver = cluster.spark_driver(
            "spark", "dep", executors=20, batch_size=5, batch_delay=0.2, cpu="1", allocator="deployment"
        )
        cluster.wait_for(lambda: driver.running() == 20, what="20 running executors")
    finally:
        hook.close()
    assert stalled == [] and arrived == 20
    assert max(peaks) == 8 and driver.batches == [20]


def test_the_deployment_drivers_share_one_replicaset_controller_client_and_its_rate_limit(
    cluster: Cluster,
) -> None:
    """kube-controller-manager runs one ReplicaSet controller whose client waits on one token bucket (QPS 20,
    burst 30 by default: kubesim/sparkdriver.py), whatever ReplicaSet a pod is for: every creation of both
    Deployment drivers takes a token from the cluster's bucket, and a direct-allocator driver (Spark's own
    client) takes none. The bucket's clock stands still, so the waits are the bucket's arithmetic alone."""

    class Counted(TokenBucket):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.delays: list[float] = []

        def reserve(self) -> float:
            delay = super().reserve()
            self.delays.append(delay)
            return delay

    assert cluster.replicaset_client is not None
    assert (cluster.replicaset_client.qps, cluster.replicaset_client.burst) == (20.0, 30)
    bucket = cluster.replicaset_client = Counted(1000.0, 5, monotonic=lambda: 0.0)
    cluster.add_node("big", cpu="64", memory="256Gi")
    deployments = [
        cluster.spark_driver(
            "spark", f"dep-{i}", executors=10, batch_delay=0.2, cpu="1", allocator="deployment"
        )
        for i in range(2)
    ]
    direct = cluster.spark_driver("spark", "direct", executors=3, batch_size=3, batch_delay=0.2, cpu="1")
    cluster.wait_for(
        lambda: all(d.running() == 10 for d in deployments) and direct.running() == 3,
        what="every executor of the three apps running",
    )
    assert [len(d.created) for d in deployments] == [10, 10]
    assert sorted(bucket.delays) == pytest.approx([0.0] * 5 + [i / 1000 for i in range(1, 16)])


def test_spark_driver_dies_after_twice_its_executors_denied_creations(cluster: Cluster) -> None:
    """Measured on Spark 4.3: every denied creation is an executor failure; the app dies at 2 x executors."""
    deny = TinyWebhook(lambda r: {"allowed": False, "status": {"code": 403, "message": "no"}})
    try:
        cluster.store.create("validatingwebhookconfigurations", deny.config("deny.example.com"))
        driver = cluster.spark_driver("spark", "doomed", executors=12, batch_size=5, batch_delay=0.05)
        cluster.wait_for(lambda: driver.dead, timeout=60, what="the app to die")
        assert driver.failures == 24 and driver.created == []
    finally:
        deny.close()
