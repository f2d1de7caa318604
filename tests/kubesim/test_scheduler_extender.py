"""kubesim's scheduler calling extenders as kube-scheduler 1.36 does (pkg/scheduler/schedule_one.go,
pkg/scheduler/extender.go), against a scripted extender served over HTTP by the test."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kubesim.cluster import Cluster
from kubesim.scheduler import Extender


class Scripted:
    """An extender answering what the test sets, and keeping what it was asked."""

    def __init__(self) -> None:
        self.filter: Any = None  # the answer, or an HTTP status code to fail with
        self.prioritize: Any = []
        self.requests: list[tuple[str, dict[str, Any]]] = []
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                verb = self.path.rsplit("/", 1)[-1]
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                scripted.requests.append((verb, body))
                answer = scripted.filter if verb == "filter" else scripted.prioritize
                if callable(answer):
                    answer = answer(body)
                if isinstance(answer, int):
                    self.send_response(answer)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/ext"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    s = Scripted()
    yield s
    s.http.shutdown()
    s.http.server_close()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with Cluster(nodes=0, namespaces=("default",)) as c:
        c.add_node("node-1", cpu="10", memory="100Gi")
        c.add_node("node-2", cpu="10", memory="100Gi")
        yield c


def pod(name: str, *, scheduler: str = "ext", cpu: str = "1", node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu, "memory": "0"}}}],
    }
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec}


def node_of(cluster: Cluster, name: str) -> str | None:
    node: str | None = cluster.store.get("pods", "default", name)["spec"].get("nodeName")
    return node


def scheduled(cluster: Cluster, name: str) -> str:
    cluster.wait_for(lambda: node_of(cluster, name) is not None, what=f"{name} bound")
    return node_of(cluster, name) or ""


def failure(cluster: Cluster, name: str) -> dict[str, Any]:
    def condition() -> dict[str, Any] | None:
        conditions = cluster.store.get("pods", "default", name)["status"].get("conditions") or []
        return next((c for c in conditions if c["type"] == "PodScheduled" and c["status"] == "False"), None)

    cluster.wait_for(lambda: condition() is not None, what=f"{name} failing to schedule")
    found = condition()
    assert found is not None
    return found


def test_extender_scores_are_scaled_by_weight_and_max_node_score_and_added(
    cluster: Cluster, scripted: Scripted
) -> None:
    """prioritizeNodes: finalscore = score * weight * (MaxNodeScore 100 / MaxExtenderPriority 10), added to
    NodeResourcesFit's LeastAllocated score, (allocatable - requested) * 100 / allocatable per resource,
    averaged. node-2 carries 1 CPU already: LeastAllocated gives node-1 (90 + 100) / 2 = 95 and node-2 90."""
    cluster.store.create("pods", pod("load", scheduler="none", cpu="1", node="node-2"))
    scripted.filter = lambda body: {"NodeNames": body["NodeNames"], "FailedNodes": {}, "Error": ""}
    scripted.prioritize = [{"Host": "node-1", "Score": 0}, {"Host": "node-2", "Score": 1}]
    cluster.scheduler.add_profile("ext", [Extender(scripted.url, weight=1)])
    cluster.store.create("pods", pod("p1"))
    assert scheduled(cluster, "p1") == "node-2"
    verb, body = scripted.requests[-1]
    assert verb == "prioritize" and body["NodeNames"] == ["node-1", "node-2"] and body["Nodes"] is None
    assert body["Pod"]["metadata"]["name"] == "p1"
    # node-2 now carries 2 CPUs (LeastAllocated 85 + 0 vs 95 + 0 with the new pod): 1 x 1 x 10 is not enough
    cluster.store.create("pods", pod("load-2", scheduler="none", cpu="2", node="node-2"))
    cluster.store.create("pods", pod("p2"))
    assert scheduled(cluster, "p2") == "node-1"
    cluster.scheduler.add_profile("ext", [Extender(scripted.url, weight=3)])
    cluster.store.create("pods", pod("p3"))
    assert scheduled(cluster, "p3") == "node-2"


def test_extender_failed_nodes_go_into_the_fit_error_event_and_condition(
    cluster: Cluster, scripted: Scripted
) -> None:
    """findNodesThatPassExtenders puts FailedNodes (Unschedulable) and FailedAndUnresolvableNodes into the
    diagnosis; FitError.Error() counts the reasons, sorts and joins them; handleSchedulingFailure writes a
    FailedScheduling Warning event from the profile and the PodScheduled=False Unschedulable condition."""
    scripted.filter = {
        "NodeNames": [],
        "FailedNodes": {"node-1": "ext: no", "node-2": "ext: never"},
        "FailedAndUnresolvableNodes": {"node-2": "ext: never"},
        "Error": "",
    }
    cluster.scheduler.add_profile("ext", [Extender(scripted.url)])
    cluster.store.create("pods", pod("p"))
    condition = failure(cluster, "p")
    message = (
        "0/2 nodes are available: 1 ext: never, 1 ext: no. no new claims to deallocate, preemption: 0/2 nodes "
        "are available: 1 No preemption victims found for incoming pod, 1 Preemption is not helpful for "
        "scheduling."
    )
    assert condition["reason"] == "Unschedulable" and condition["message"] == message
    events, _, _ = cluster.store.list_objects("events", "default")
    assert [(e["type"], e["reason"], e["message"], e["source"]["component"]) for e in events] == [
        ("Warning", "FailedScheduling", message, "ext")
    ]


def test_an_extender_error_fails_the_attempt_unless_ignorable(cluster: Cluster, scripted: Scripted) -> None:
    """HTTPExtender.send: a non-200 answer is `failed <verb> with extender at URL <url>, code <code>`; an
    `Error` in the answer is the error itself; findNodesThatPassExtenders skips an ignorable extender that
    errs; the failure is reason SchedulerError."""
    scripted.filter = 500
    cluster.scheduler.add_profile("ext", [Extender(scripted.url)])
    cluster.scheduler.add_profile("lenient", [Extender(scripted.url, ignorable=True)])
    cluster.store.create("pods", pod("strict"))
    cluster.store.create("pods", pod("lenient", scheduler="lenient"))
    condition = failure(cluster, "strict")
    assert condition["reason"] == "SchedulerError"
    assert condition["message"] == f"failed filter with extender at URL {scripted.url}/filter, code 500"
    assert scheduled(cluster, "lenient")


def test_a_filter_answer_naming_an_unknown_node_is_an_error(cluster: Cluster, scripted: Scripted) -> None:
    """HTTPExtender.Filter refuses a NodeNames answer with a node it did not send."""
    scripted.filter = {"NodeNames": ["node-9"], "Error": ""}
    cluster.scheduler.add_profile("ext", [Extender(scripted.url)])
    cluster.store.create("pods", pod("p"))
    assert failure(cluster, "p")["message"] == (
        f'extender "{scripted.url}" claims a filtered node "node-9" which is not found in the input node list'
    )


def test_a_pod_for_a_scheduler_nobody_runs_stays_pending(cluster: Cluster) -> None:
    """Only the profiles a scheduler runs are served (pkg/scheduler/profile: a pod whose schedulerName
    matches no profile is not taken by that scheduler); the default profile still schedules its pods."""
    cluster.store.create("pods", pod("orphan", scheduler="nobody"))
    cluster.store.create("pods", pod("plain", scheduler="default-scheduler"))
    assert scheduled(cluster, "plain")
    pending = cluster.store.get("pods", "default", "orphan")
    assert not pending["spec"].get("nodeName") and not pending["status"].get("conditions")


def test_kubelets_fail_pods_on_a_bad_node(cluster: Cluster) -> None:
    """fail_on: matching pods that start on the node run, then terminate as the kubelet reports an
    OOM-killed container (phase Failed, exit 137, reason OOMKilled); heal ends it."""
    labels = {"spark-role": "executor"}
    cluster.kubelet.fail_on("node-1", labels={})
    cluster.store.create("pods", pod("doomed", scheduler="default-scheduler", node="node-1"))
    cluster.wait_for(
        lambda: cluster.store.get("pods", "default", "doomed")["status"].get("phase") == "Failed"
    )
    state = cluster.store.get("pods", "default", "doomed")["status"]["containerStatuses"][0]["state"]
    assert state["terminated"]["exitCode"] == 137 and state["terminated"]["reason"] == "OOMKilled"
    cluster.kubelet.fail_on("node-2", exit_code=3, reason="Error", labels=labels)
    cluster.kubelet.heal("node-1")
    cluster.store.create("pods", pod("fine", scheduler="default-scheduler", node="node-1"))
    cluster.wait_for(lambda: cluster.store.get("pods", "default", "fine")["status"].get("phase") == "Running")


def test_an_extender_is_configured_as_kube_scheduler_reads_its_configuration() -> None:
    """KubeSchedulerConfiguration v1 `extenders[]`: weight defaults to 1, httpTimeout to 5s (a
    metav1.Duration), nodeCacheCapable and ignorable to false, a missing verb to none."""
    extender = Extender.from_config(
        {"urlPrefix": "http://x/s", "filterVerb": "filter", "httpTimeout": "1m30s"}
    )
    assert extender == Extender("http://x/s", "filter", "", 1, False, False, 90.0)
    assert Extender.from_config({"urlPrefix": "u"}, "http://local").http_timeout == 5.0
    assert Extender.from_config({"urlPrefix": "u", "httpTimeout": "500ms"}).http_timeout == 0.5
    with pytest.raises(ValueError, match="not a duration"):
        Extender.from_config({"urlPrefix": "u", "httpTimeout": "5 seconds"})


def test_each_insufficient_resource_of_a_node_is_counted_on_its_own(cluster: Cluster) -> None:
    """noderesources/fit.go Filter returns one reason per insufficient resource, and FitError.Error counts
    every reason of every node's status (pkg/scheduler/framework/types.go): two nodes short of both cpu and
    memory are `2 Insufficient cpu, 2 Insufficient memory`, not one reason per node."""
    big = pod("big", scheduler="default-scheduler", cpu="20")
    big["spec"]["containers"][0]["resources"]["requests"]["memory"] = "200Gi"
    cluster.store.create("pods", big)
    assert failure(cluster, "big")["message"] == (
        "0/2 nodes are available: 2 Insufficient cpu, 2 Insufficient memory. no new claims to deallocate, "
        "preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."
    )
