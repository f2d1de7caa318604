"""Time and the allocator end to end (issue 37): the allocator assembled in this process as `sparkgate allocator`
assembles it (allocator/commands.py `assemble`: its watches, cache, loop and actor), against kubesim over HTTP,
with clocks the test moves: the monotonic one jumped ahead (time passing without the test waiting for it), the
wall one also stepped alone (an NTP step, a VM resumed). Each test waits for the loop's ticks, never for time.

- A step of the wall clock moves no decision: before, the loop decided on the wall clock, and a step back held
  an app's next batch for the step's length, a step forward released it at once.
- A client-mode app held by its namespace's cap is not ended however long it waits, and keeps its place:
  before, it was ended after the grace and its gated pods deleted."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from allocator.commands import assemble
from allocator.loop import Controller, Options
from allocator.metrics import AllocatorMetrics
from kubesim.cluster import Cluster
from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.kube import Kube
from sparkgate.policy_file import PolicySource

from .conftest import write_policy
from .test_containment import executor


class Clock:
    """A real clock the test moves: `offset` seconds ahead of `source`."""

    def __init__(self, source: Any) -> None:
        self.source, self.offset = source, 0.0

    def __call__(self) -> float:
        return float(self.source()) + self.offset


@dataclass
class Running:
    cluster: Cluster
    c: Controller
    wall: Clock
    monotonic: Clock
    ticks: list[int]
    released: list[
        tuple[str, float]
    ]  # each gate removal the API server applied, at the loop's monotonic time

    def ticked(self, n: int = 2) -> None:
        """Wait until the loop has ticked `n` more times (each looks at every app)."""
        after = self.ticks[0]
        self.cluster.wait_for(lambda: self.ticks[0] >= after + n, timeout=30, what=f"{n} ticks of the loop")

    def advance(self, seconds: float) -> None:
        """Time passes: both clocks move, then the loop ticks."""
        self.monotonic.offset += seconds
        self.wall.offset += seconds
        self.ticked()

    def names(self, app: str) -> list[str]:
        return [name for name, _ in self.released if name.startswith(f"{app}-")]


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Callable[..., Running]]:
    started: list[tuple[Any, threading.Thread, Kube, Callable[[], None]]] = []
    with Cluster(nodes=2, bookmark_interval=0.2) as cluster:
        cluster.add_namespace("spark")

        def start(**policy: Any) -> Running:
            kube = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
            source = PolicySource(
                str(write_policy(tmp_path / "policy.yaml", **policy)), contract.INSTALL_NAMESPACE
            )
            allocator = assemble(
                kube, source, Options(identity="alloc-1", tick=0.2, retry_period=0.2), AllocatorMetrics()
            )
            c = allocator.controller
            wall, monotonic = Clock(time.time), Clock(time.monotonic)
            c.clock, c.monotonic, c.queue.monotonic = wall, monotonic, monotonic
            ticks, released, seen = [0], [], set()
            tick = c.tick

            def counted() -> None:
                tick()
                ticks[0] += 1

            c.tick = counted  # type: ignore[method-assign]

            def on_change(kind: str, resource: str, obj: dict[str, Any]) -> None:
                name, labels = obj["metadata"]["name"], obj["metadata"].get("labels") or {}
                gated = (obj.get("spec") or {}).get("schedulingGates")
                executor = labels.get(contract.LABEL_ROLE) == contract.ROLE_EXECUTOR
                if resource == "pods" and kind == "MODIFIED" and executor and not gated and name not in seen:
                    seen.add(name)
                    released.append((name, monotonic()))

            unsubscribe = cluster.store.subscribe(on_change)
            allocator.start()
            loop = threading.Thread(target=c.run, daemon=True)
            loop.start()
            started.append((allocator, loop, kube, unsubscribe))
            return Running(cluster, c, wall, monotonic, ticks, released)

        yield start
        for allocator, loop, kube, unsubscribe in started:
            unsubscribe()
            allocator.stop.set()
            loop.join(timeout=30)
            allocator.shutdown()
            kube.close()


@pytest.mark.parametrize("step", [3600.0, -3600.0])
def test_a_wall_clock_step_of_an_hour_either_way_moves_no_batch_delay(
    running: Callable[..., Running], step: float
) -> None:
    t = running(batch=2, delay=30)
    for i in range(1, 7):
        t.cluster.store.create("pods", executor(f"app-1-exec-{i}", exec_id=i), namespace="spark")
    t.cluster.wait_for(lambda: len(t.released) == 2, timeout=60, what="the first batch")
    first = t.released[0][1]
    t.wall.offset += step  # the step
    t.monotonic.offset += 29 - (t.monotonic() - first)  # 29 s after the first release: still in its delay
    t.ticked()
    assert len(t.released) == 2  # a step forward no longer ends the delay at once
    t.monotonic.offset += 1.5  # past the delay: a step back no longer holds it for the hour
    t.cluster.wait_for(lambda: len(t.released) == 4, timeout=30, what="the second batch after the delay")
    assert t.released[2][1] - first >= 30  # never before its delay (and promptly after: the wait above)


def test_a_client_mode_app_held_by_its_namespace_cap_for_ten_minutes_is_not_ended_and_goes_first(
    running: Callable[..., Running],
) -> None:
    """Its namespace's cap is taken by a cluster-mode app whose executors no node can take (they stay Pending,
    in flight); a notebook (no driver pod) and then a second one wait behind it for ten minutes, five times
    the client grace (300 s). Neither is ended nor loses its pods; when room comes, the first goes first."""
    t = running(batch=4, delay=0, per_app=10, per_ns=4)
    driver = {
        "metadata": {
            "name": "app-a-driver",
            "labels": {contract.LABEL_ROLE: "driver", contract.LABEL_APP_ID: "app-a"},
        },
        "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "spark"}]},
    }
    t.cluster.store.create("pods", driver, namespace="spark")
    for i in range(1, 5):
        pod = executor(f"app-a-exec-{i}", app="app-a", exec_id=i)
        pod["spec"]["nodeSelector"] = {"example.com/pool": "none"}  # no node has it
        t.cluster.store.create("pods", pod, namespace="spark")
    t.cluster.wait_for(lambda: len(t.names("app-a")) == 4, timeout=60, what="app-a's batch released")
    for app in ("app-b", "app-c"):
        for i in range(1, 5):
            t.cluster.store.create("pods", executor(f"{app}-exec-{i}", app=app, exec_id=i), namespace="spark")
        t.advance(30)
    b, c = AppKey("spark", "app-b"), AppKey("spark", "app-c")
    assert t.c.settings[b].waiting_on == t.c.settings[c].waiting_on == "namespace"
    for _ in range(10):  # ten minutes
        t.advance(60)
    assert b not in t.c.ended and c not in t.c.ended and len(t.released) == 4
    ended = t.c.metrics.registry.get_sample_value("sparkgate_allocator_apps_ended_total", {"mode": "client"})
    assert not ended
    pods, _, _ = t.cluster.store.list_objects("pods", "spark")
    assert sum(1 for p in pods if p["metadata"]["name"].startswith(("app-b-", "app-c-"))) == 8  # none deleted
    for i in range(1, 5):  # app-a's executors go: room for one batch
        t.cluster.store.delete("pods", "spark", f"app-a-exec-{i}", grace_period_seconds=0)
    t.cluster.wait_for(lambda: len(t.released) == 8, timeout=30, what="the notebooks' releases")
    # The first slot freed goes to the first notebook. The four deletions may be decided one at a time on a
    # busy machine (a slot each): the notebook that just released is then behind the other (apps take
    # turns), so how the rest is shared depends on the timing, not what comes first.
    assert t.released[4][0].startswith("app-b-"), t.released
