"""Failures contained and visible, with the allocator assembled in this process exactly as `sparkgate
allocator` assembles it (allocator/commands.py `assemble`), against kubesim over HTTP:

- a reflector whose handler raises is restarted from a fresh list and counted, and the cache goes on;
- `/healthz` fails, naming the watch, while a reflector is wedged, and is healthy again once it moves; the
  same for the leader thread;
  `/readyz` fails while a watch cannot be re-established, and recovers;
- a corrupt deletion history is logged, counted, set aside and replaced: the allocator starts and acts;
- a history write that hangs does not hold the loop's releases;
- an exception in one app's decision does not stop the others (decision.py).
"""

from __future__ import annotations

import functools
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from allocator import decision
from allocator.commands import Allocator, assemble
from allocator.deletions import HISTORY_LABEL, History, history_name
from allocator.http import StatusServer
from allocator.loop import Options
from allocator.metrics import AllocatorMetrics
from allocator.model import AppView, PodRecord, Release, Snapshot
from kubesim.cluster import Cluster
from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.kube import Kube
from sparkgate.policy_file import PolicySource

from .conftest import write_policy

NS = contract.INSTALL_NAMESPACE


@dataclass
class Running:
    cluster: Cluster
    allocator: Allocator
    metrics: AllocatorMetrics
    server: StatusServer

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.server.port}{path}", timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        return self.metrics.registry.get_sample_value(name, labels or {}) or 0.0


class FakeClock:
    """A monotonic clock that stands still until the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    """start(before=callback(cluster), health_clock=monotonic clock of Health, **options) -> Running;
    everything stopped after the test."""
    started: list[tuple[Running, threading.Thread, Kube]] = []
    clusters: list[Cluster] = []

    def run(before: Any = None, health_clock: FakeClock | None = None, **options: Any) -> Running:
        cluster = Cluster(nodes=2, bookmark_interval=0.2).start()
        clusters.append(cluster)
        cluster.add_namespace("spark")
        if before is not None:
            before(cluster)
        kube = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
        metrics = AllocatorMetrics()
        policy = PolicySource(str(write_policy(tmp_path / "policy.yaml")), NS)
        allocator = assemble(
            kube, policy, Options(identity="alloc-1", tick=0.2, retry_period=0.2, **options), metrics
        )
        if health_clock is not None:  # before any part beats
            allocator.controller.health.monotonic = health_clock
        server = StatusServer(allocator.controller, allocator.extender, "127.0.0.1", 0)
        server.start()
        allocator.start()
        loop = threading.Thread(target=allocator.controller.run, daemon=True)
        loop.start()
        running = Running(cluster, allocator, metrics, server)
        started.append((running, loop, kube))
        cluster.wait_for(lambda: running.get("/readyz")[0] == 200, timeout=30, what="the allocator ready")
        return running

    yield run
    for running, loop, kube in started:
        running.allocator.stop.set()
        loop.join(timeout=30)
        running.allocator.shutdown()
        running.server.stop()
        kube.close()
    for cluster in clusters:
        cluster.stop()


def executor(name: str, app: str = "app-1", exec_id: int = 1) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "spark",
            "labels": {
                contract.LABEL_ROLE: contract.ROLE_EXECUTOR,
                contract.LABEL_APP_ID: app,
                contract.LABEL_EXEC_ID: str(exec_id),
            },
            "annotations": {contract.ANNOTATION_PROFILE: "spark"},
        },
        "spec": {
            "containers": [{"name": "spark-kubernetes-executor", "image": "spark"}],
            "schedulingGates": [{"name": contract.GATE}],
        },
    }


def test_a_reflector_that_raises_is_restarted_counted_and_the_cache_goes_on(start: Any) -> None:
    running = start()
    reflector = next(r for r in running.allocator.controller.reflectors if r.name == "executors")
    handler = reflector.on_event
    raised = threading.Event()

    def faulty(kind: str, obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"] == "poison" and not raised.is_set():
            raised.set()
            raise KeyError("a handler's bug")
        handler(kind, obj)

    reflector.on_event = faulty
    running.cluster.store.create("pods", executor("poison"))
    running.cluster.store.create("pods", executor("after", exec_id=2))
    cache = running.allocator.controller.cache
    running.cluster.wait_for(
        lambda: {"poison", "after"} <= {p.name for v in cache.snapshot().apps.values() for p in v.pods},
        timeout=30,
        what="both pods in the cache after the restart",
    )
    assert running.sample("sparkgate_allocator_reflector_crashes_total", {"watch": "executors"}) == 1
    assert reflector.thread.is_alive()
    running.cluster.wait_for(lambda: running.get("/readyz")[0] == 200, timeout=30, what="ready again")


class Wedge:
    """Holds a part's thread inside `hold()` from the moment it enters until `release()`."""

    def __init__(self) -> None:
        self.entered, self.released = threading.Event(), threading.Event()

    def hold(self) -> None:
        self.entered.set()
        self.released.wait(120)

    def release(self) -> None:
        self.released.set()


def stalled_then_healthy(running: Running, clock: FakeClock, wedge: Wedge, part: str, seconds: int) -> None:
    """With `part` wedged, the test's clock moves `seconds` on: every other part beats again at the new
    time, `part` cannot, so /healthz fails naming it alone; released, /healthz is healthy again."""
    health = running.allocator.controller.health
    try:
        running.cluster.wait_for(wedge.entered.is_set, timeout=60, what=f"{part} wedged")
        clock.advance(seconds)
        running.cluster.wait_for(
            lambda: list(health.stalled()) == [part], timeout=60, what=f"every part but {part} to beat again"
        )
        assert running.get("/healthz") == (503, f"{part}: no progress for {seconds}s\n")
    finally:
        wedge.release()
    running.cluster.wait_for(
        lambda: running.get("/healthz") == (200, "ok\n"), timeout=60, what="healthy again"
    )


def test_healthz_fails_while_a_reflector_is_wedged_and_recovers(start: Any) -> None:
    """The test's clock decides when a part counts as stalled: it stands still (nothing can stall, however
    slow the machine) until the test moves it past the bound while the executors' watch is wedged. Every
    other part beats again at the new time (bookmarks every 0.2 s, a turn of the loop every tick); the wedged
    watch cannot, so it alone is named, and once it moves /healthz is healthy again."""
    clock = FakeClock()
    running = start(health_clock=clock, stall_after=60.0)
    assert running.get("/healthz") == (200, "ok\n")
    reflector = next(r for r in running.allocator.controller.reflectors if r.name == "executors")
    handler, wedge = reflector.on_event, Wedge()

    def stuck(kind: str, obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"] == "wedge":
            wedge.hold()
        handler(kind, obj)

    reflector.on_event = stuck
    running.cluster.store.create("pods", executor("wedge"))
    stalled_then_healthy(running, clock, wedge, "watch executors", 61)


def test_healthz_fails_while_the_leader_thread_is_wedged_and_recovers(start: Any) -> None:
    """The leader thread beats at every turn of the Lease; one wedged for longer than a lease duration plus
    a renew deadline (here 120 + 60 s on the test's clock: the real Lease is far from lapsing) fails
    /healthz by name, while everything else beats on; healthy again once it turns."""
    clock = FakeClock()
    running = start(health_clock=clock, lease_duration=120.0, renew_deadline=60.0)
    controller = running.allocator.controller
    assert controller.health.bounds == {"leader": 180.0}
    running.cluster.wait_for(lambda: controller.elector.leading, timeout=30, what="leading")
    turn, wedge = controller.elector.turn, Wedge()

    def stuck() -> bool:
        wedge.hold()
        return turn()

    controller.elector.turn = stuck  # type: ignore[method-assign]
    stalled_then_healthy(running, clock, wedge, "leader", 181)
    assert controller.elector.leading


def test_readyz_fails_while_a_watch_cannot_be_re_established(start: Any) -> None:
    running = start()
    faults = running.cluster.faults
    faults.fail("watch", "configmaps", 403, count=None)
    faults.fail("list", "configmaps", 403, count=None)
    faults.drop_watches("configmaps")
    running.cluster.wait_for(lambda: running.get("/readyz")[0] == 503, timeout=30, what="not ready")
    faults.clear()
    running.cluster.wait_for(lambda: running.get("/readyz")[0] == 200, timeout=60, what="ready again")


def test_a_corrupt_history_is_set_aside_and_replaced_never_a_crash(start: Any) -> None:
    good_key, bad_key = AppKey("spark", "good"), AppKey("spark", "bad")

    def histories(cluster: Cluster) -> None:
        good = History()
        good.exec_ids = {1}
        for key, data in ((good_key, good.to_dict()), (bad_key, None)):
            cluster.store.create(
                "configmaps",
                {
                    "metadata": {
                        "name": history_name(key),
                        "namespace": NS,
                        "labels": {HISTORY_LABEL: "true"},
                        "annotations": {"sparkgate.io/app": str(key)},
                    },
                    "data": {"history.json": "{not json" if data is None else json.dumps(data)},
                },
            )

    running = start(before=histories)
    store = running.cluster.store
    # Set aside by the leader (a replica loads the histories at its start, before it may write: it leaves
    # them to the leader's read as it takes over, the same replica here).
    running.cluster.wait_for(
        lambda: running.sample("sparkgate_allocator_history_corrupt_total") == 1,
        timeout=30,
        what="the corrupt history set aside by the leader",
    )
    names = {c["metadata"]["name"]: c for c in store.list_objects("configmaps", NS)[0]}
    aside = [c for n, c in names.items() if n.startswith(history_name(bad_key) + "-corrupt-")]
    assert len(aside) == 1 and aside[0]["metadata"]["labels"][HISTORY_LABEL] == "corrupt"
    assert aside[0]["data"] == {"history.json": "{not json"}
    assert history_name(bad_key) not in names and history_name(good_key) in names
    # The good history is in force: executor id 1 of "good" was deleted before, so a new pod 1 is refused.
    store.create("pods", executor("good-exec-1", app="good", exec_id=1))
    running.cluster.wait_for(
        lambda: not store.list_objects("pods", "spark")[0], timeout=30, what="the reused id deleted"
    )


def test_a_history_write_that_hangs_does_not_hold_the_loop(start: Any) -> None:
    """The deletion histories are saved by a thread of their own: while the API server does not answer
    their writes, the loop goes on releasing; once it answers again, the history is saved."""
    running = start()
    store, faults = running.cluster.store, running.cluster.faults

    def released(name: str) -> bool:
        return not store.get("pods", "spark", name)["spec"].get("schedulingGates")

    store.create("pods", executor("exec-1", exec_id=1))
    running.cluster.wait_for(lambda: released("exec-1"), timeout=30, what="exec-1 released")
    faults.hang("update", "configmaps")
    faults.hang("create", "configmaps")
    try:
        store.delete("pods", "spark", "exec-1")  # a deletion: the app's history changes, a flush writes it
        running.cluster.wait_for(lambda: faults.holding() >= 1, timeout=30, what="a history write hanging")
        store.create("pods", executor("exec-2", exec_id=2))
        running.cluster.wait_for(lambda: released("exec-2"), timeout=30, what="exec-2 released meanwhile")
        assert faults.holding() >= 1  # the write still hangs: the release did not wait for it
    finally:
        faults.resume()
    saved = functools.partial(history_saved, store, AppKey("spark", "app-1"), {1})
    running.cluster.wait_for(saved, timeout=60, what="the history saved once the API answers")


def history_saved(store: Any, key: AppKey, exec_ids: set[int]) -> bool:
    """The app's deletion history is saved in its ConfigMap with these executor ids."""
    try:
        config = store.get("configmaps", NS, history_name(key))
    except Exception:
        return False
    return History.from_dict(json.loads(config["data"]["history.json"])).exec_ids == exec_ids


def test_an_exception_in_one_apps_decision_does_not_stop_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    from .test_decision import pod, policy, view

    original = decision._annotations

    def broken(pods: list[PodRecord]) -> Any:
        if pods and pods[0].app_id == "bad":
            raise ValueError("a record no rule expected")
        return original(pods)

    monkeypatch.setattr(decision, "_annotations", broken)
    views: list[AppView] = [view("bad", [pod("bad", 1)]), view("good", [pod("good", 1)])]
    snapshot = Snapshot({v.key: v for v in views}, frozenset())
    d = decision.decide(snapshot, policy(), 100.0, {})
    assert (
        list(d.errors) == [AppKey("spark", "bad")]
        and "a record no rule expected" in d.errors[AppKey("spark", "bad")]
    )
    assert [a.pod.name for a in d.actions if isinstance(a, Release)] == ["good-exec-1"]


def test_a_flush_of_the_histories_that_raises_is_counted_and_the_next_one_saves(
    start: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The histories thread outlives an unexpected exception of a flush (a bug): logged with its traceback,
    counted as a failed write, and the next flush saves what changed. A thread that ended there would leave
    every later history unsaved for the rest of the process's life."""
    running = start(history_flush=0.2)
    store, histories = running.cluster.store, running.allocator.controller.histories
    flush, raised = histories.flush, threading.Event()

    def failing() -> None:
        if not raised.is_set():
            raised.set()
            raise RuntimeError("a bug in the flush")
        flush()

    histories.flush = failing  # type: ignore[method-assign]
    store.create("pods", executor("exec-1", exec_id=1))
    running.cluster.wait_for(raised.is_set, timeout=30, what="a flush raising")
    store.delete("pods", "spark", "exec-1")  # the app's history changes: a later flush writes it
    saved = functools.partial(history_saved, store, AppKey("spark", "app-1"), {1})
    running.cluster.wait_for(saved, timeout=60, what="the history saved by a later flush")
    assert running.sample("sparkgate_allocator_history_write_failures_total") >= 1
    assert any(r.exc_info and "a bug in the flush" in str(r.exc_info[1]) for r in caplog.records)
