"""An application's life and place in line as the loop keeps them, both clocks injected (issue 37: a
client-mode app that sparkgate itself held was ended as dead and sent to the back of the line; every duration
ran on the wall clock). The parts are assembled as `sparkgate allocator` assembles them (allocator/commands.py
`assemble`); the actor is test_dispatch's, whose work the test finishes; the watch's news is fed to the cache
by the test; the Lease is taken on kubesim over HTTP."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from allocator.commands import assemble
from allocator.loop import Controller, Options
from allocator.metrics import AllocatorMetrics
from allocator.model import DeletePod, Release
from kubesim.cluster import Cluster
from sparkgate.contract import AppKey
from sparkgate.kube import Kube
from sparkgate.policy_file import PolicySource

from .conftest import write_policy
from .test_dispatch import HeldActor, executor

A, B, C = AppKey("spark", "app-a"), AppKey("spark", "app-b"), AppKey("spark", "app-c")


@dataclass
class Clocks:
    """The loop's two clocks, moved by the test: `advance` moves both (time passes), `step` the wall clock
    alone (NTP, a VM resumed)."""

    monotonic: float = 1000.0
    wall: float = 1_800_000_000.0

    def advance(self, seconds: float) -> None:
        self.monotonic += seconds
        self.wall += seconds

    def step(self, seconds: float) -> None:
        self.wall += seconds


@dataclass
class Loop:
    c: Controller
    actor: HeldActor
    clocks: Clocks

    def pod(self, app: str, exec_id: int, **state: Any) -> None:
        """An executor pod as the watch reports it, created now by the wall clock: gated, or (`released`)
        without the gate and `node`, `phase`, `refused` (PodScheduled=False, Unschedulable) as given."""
        obj = executor(app, exec_id)
        created = dt.datetime.fromtimestamp(self.clocks.wall, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        obj["metadata"]["creationTimestamp"] = state.get("created", created)
        if state.get("released"):
            del obj["spec"]["schedulingGates"]
            obj["spec"]["nodeName"] = state.get("node")
            obj["status"] = {"phase": state.get("phase", "Pending")}
            if state.get("refused"):
                obj["status"]["conditions"] = [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
                ]
        self.c.cache.pod_event(state.get("kind", "MODIFIED"), obj)

    def settle(self) -> list[str]:
        """Decide every app that is due and finish their actions, until none is due: the releases given
        (each reported by the watch as the API server applied it: no gate, Pending, not bound yet)."""
        given = []
        while keys := self.c.queue.get(0):
            self.c.step(keys)
            given.extend(self.actor.given)
            for action in self.actor.given:
                if isinstance(action, Release):
                    self.pod(action.app.app_id, action.pod.exec_id or 0, released=True)
            self.actor.given = []
            for app in list(self.actor.pending):
                self.actor.finish(app, True)
        self.deleted.extend(a.pod.name for a in given if isinstance(a, DeletePod))
        return [a.pod.name for a in given if isinstance(a, Release)]

    def tick(self) -> list[str]:
        self.c.tick()
        return self.settle()

    def __post_init__(self) -> None:
        self.deleted: list[str] = []


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Callable[..., Loop]]:
    with Cluster(nodes=1) as cluster:
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig("admin")))

        def make(**policy: Any) -> Loop:
            source = PolicySource(str(write_policy(tmp_path / "policy.yaml", **policy)), "sparkgate-system")
            options = Options(backoff_base=0.0, batch_period=0.0, client_grace=300.0)
            c = assemble(kube, source, options, AllocatorMetrics()).controller
            c.actor.close()
            actor = HeldActor()
            c.actor = actor  # type: ignore[assignment]
            clocks = Clocks()
            c.clock = lambda: clocks.wall
            c.monotonic = c.queue.monotonic = lambda: clocks.monotonic
            c.cache.pods_replace([])
            c.cache.drivers_replace([])  # no driver pod: every app here is in client mode
            c.cache.config_maps_replace([], source=True)
            c.cache.config_maps_replace([], source=False)
            assert c.cache.is_synced and c.histories.load() and c.elector.try_acquire_or_renew()
            return Loop(c, actor, clocks)

        yield make
        kube.close()


def names(app: str, ids: range) -> list[str]:
    return [f"{app}-exec-{i}" for i in ids]


def ended(loop: Loop) -> float:
    return (
        loop.c.metrics.registry.get_sample_value("sparkgate_allocator_apps_ended_total", {"mode": "client"})
        or 0
    )


def test_a_client_mode_app_held_by_its_namespace_cap_for_ten_minutes_keeps_its_pods_and_its_place(
    loop: Callable[..., Loop],
) -> None:
    """Issue 37, finding 1: held by its namespace's cap for ten minutes, a notebook is neither ended nor
    sent to the back of the line; when it is truly dead, it is still ended within the grace."""
    t = loop(batch=4, delay=0, per_app=10, per_ns=4, cluster=100)
    for app in ("app-a", "app-b"):
        for i in range(1, 5):
            t.pod(app, i, kind="ADDED")
    t.c.tick()
    assert t.settle() == names("app-a", range(1, 5))  # the namespace's 4 to app-a; app-b waits
    for i in range(1, 5):  # app-a's executors bound, their containers starting: in flight, alive
        t.pod("app-a", i, released=True, node="node-1")
    assert t.settle() == [] and t.c.settings[B].waiting_on == "namespace"
    place = t.c.memory[B].waiting_since
    t.clocks.advance(30)
    for i in range(1, 5):  # a second notebook, held behind it
        t.pod("app-c", i, kind="ADDED")
    assert t.settle() == [] and t.c.settings[C].waiting_on == "namespace"
    for _ in range(10):  # ten minutes, a tick every minute
        t.clocks.advance(60)
        assert t.tick() == []
    assert t.deleted == [] and ended(t) == 0 and B not in t.c.ended
    assert t.c.memory[B].waiting_since == place and t.c.settings[B].waiting_on == "namespace"
    for i in range(1, 5):  # room: app-a's executors run; the app that waited longest goes first
        t.pod("app-a", i, released=True, node="node-1", phase="Running")
    assert t.settle() == names("app-b", range(1, 5))
    # The notebook is killed: its executors fail and nothing holds it. Ended within the grace, not before.
    for i in range(1, 5):
        t.pod("app-b", i, released=True, node="node-1", phase="Failed")
    t.settle()
    t.clocks.advance(299)
    t.tick()
    assert B not in t.c.ended
    t.clocks.advance(1)
    t.tick()
    assert B in t.c.ended and ended(t) == 1 and t.deleted == []  # its failed pods are the user's


def test_an_app_ended_that_lives_again_keeps_its_place_in_line(loop: Callable[..., Loop]) -> None:
    """An app that is ended and comes back (its executors refused past the bound and no other sign of life:
    ended, its pods deleted; its driver was alive after all and Spark creates them again) keeps its place:
    before, it came back at the back of the line."""
    t = loop(batch=4, delay=0, per_app=10, per_ns=100, cluster=4)
    for i in range(1, 9):
        t.pod("app-a", i, kind="ADDED")
    t.c.tick()
    assert t.settle() == names("app-a", range(1, 5))  # the cluster's 4
    for i in range(1, 5):  # the scheduler cannot place them
        t.pod("app-a", i, released=True, refused=True)
    t.settle()
    place = t.c.memory[A].waiting_since
    t.clocks.advance(10)
    for i in range(1, 9):  # a later app waits behind it
        t.pod("app-b", i, kind="ADDED")
    t.settle()
    t.clocks.advance(50)  # the refusals are 60 s old: the app is held back, and they are no sign of life
    t.tick()
    assert t.c.settings[A].waiting_on == "unschedulable" and t.c.settings[A].overdue == 4
    t.clocks.advance(300)
    t.tick()
    assert A in t.c.ended
    assert sorted(t.deleted) == sorted(names("app-a", range(1, 9)))  # its gated and its refused pods
    for i in range(1, 9):  # the deletions reach the watch: nothing of the app is left
        t.pod("app-a", i, kind="DELETED")
    t.tick()
    t.clocks.advance(1)
    for i in range(9, 13):  # the driver lives: Spark asks for its executors again
        t.pod("app-a", i, kind="ADDED")
    t.settle()
    assert A not in t.c.ended and t.c.memory[A].waiting_since == place
    assert t.c.memory[A].waiting_since < t.c.memory[B].waiting_since  # still ahead of app-b


@pytest.mark.parametrize("step", [3600.0, -3600.0])
def test_a_wall_clock_step_moves_no_batch_delay_and_no_due_time(
    loop: Callable[..., Loop], step: float
) -> None:
    """Issue 37, finding 3: the decisions ran on the wall clock; a step back held an app for the step's length,
    a step forward ended its batch delay at once. Both clocks injected: the step changes nothing."""
    t = loop(batch=2, delay=30, per_app=10, per_ns=100, cluster=100)
    for i in range(1, 7):
        t.pod("app-a", i, kind="ADDED")
    t.c.tick()
    assert t.settle() == names("app-a", range(1, 3))
    for i in range(1, 3):
        t.pod("app-a", i, released=True, node="node-1", phase="Running")
    assert t.settle() == [] and t.c.settings[A].waiting_on == "delay"
    t.clocks.advance(1)
    t.clocks.step(step)
    assert t.tick() == []
    t.clocks.advance(28.9)  # 29.9 s after the release
    assert t.tick() == []
    t.clocks.advance(0.1)  # 30 s: due now, decided from the queue's requeue-after
    assert t.settle() == names("app-a", range(3, 5))
