"""The gauges of what the allocator tracks are written at each scrape by allocator/status.py `AppsCollector`,
in the text format prometheus_client's own writer produces (exposition.py `generate_latest`, format 0.0.4),
and an app's lines are written again only when its view or its pacing window changed."""

from __future__ import annotations

import functools
import gc
import shutil
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from allocator import metrics as metrics_module
from allocator import status as status_module
from allocator.decision import AppSettings
from allocator.metrics import NAMESPACE_GRACE_SECONDS, AllocatorMetrics, RegistryText
from allocator.model import AppMemory, AppView, PodRecord, Snapshot
from allocator.pacing import Reason, Window
from allocator.status import AppsCollector, Status
from sparkgate.contract import AppKey
from sparkgate.policy import Allocation

# A label value with every character the format escapes.
ODD = AppKey("spark", 'odd"app\\with\nnewline')
A = AppKey("spark", "app-a")
B = AppKey("team-b", "app-b")


def pod(
    key: AppKey, n: int, *, gated: bool = False, phase: str = "Running", profile: str | None = "p"
) -> PodRecord:
    return PodRecord(
        key.namespace, f"{key.app_id}-{n}", f"{key.app_id}-{n}", key.app_id, n, "0", gated, profile,
        None if gated or phase == "Pending" else "n1", phase, False, 0.0,
    )  # fmt: skip


def views() -> dict[AppKey, AppView]:
    return {
        A: AppView(
            A, (pod(A, 1), pod(A, 2, gated=True), pod(A, 3, phase="Pending")), None, True, frozenset()
        ),
        B: AppView(B, (pod(B, 1, profile=None), pod(B, 2, phase="Failed")), None, True, frozenset()),
        ODD: AppView(ODD, (pod(ODD, 1),), None, False, frozenset()),
    }


def status(apps: dict[AppKey, AppView], memory: dict[AppKey, AppMemory]) -> Status:
    held = AppSettings(Allocation(10, 1.0, 20), "waiting", "log4j", "source")
    return Status(
        Snapshot(apps, frozenset()),
        {B: held},
        memory,
        {"cluster": 1000, "namespace": 100},
        {A: (2, 1.5), B: (1, 0.0)},
        3,
        7,
    )


def reference(s: Status) -> bytes:
    """The same gauges written by prometheus_client's Gauge and generate_latest."""
    r = CollectorRegistry()
    executors = Gauge(
        "sparkgate_allocator_executors",
        status_module.EXECUTORS.help,
        ["namespace", "app", "state"],
        registry=r,
    )
    in_flight = Gauge(
        "sparkgate_allocator_in_flight", status_module.IN_FLIGHT.help, ["namespace"], registry=r
    )
    bypassed = Gauge(
        "sparkgate_allocator_bypassed_pods", status_module.BYPASSED.help, ["namespace"], registry=r
    )
    window = Gauge(
        "sparkgate_allocator_pacing_window",
        status_module.PACING_WINDOW.help,
        ["namespace", "app"],
        registry=r,
    )
    state = Gauge(
        "sparkgate_allocator_pacing_state",
        status_module.PACING_STATE.help,
        ["namespace", "app", "reason"],
        registry=r,
    )
    missing = Gauge(
        "sparkgate_allocator_source_configmap_missing", status_module.MISSING.help, ["source"], registry=r
    )
    limit = Gauge("sparkgate_allocator_limit", status_module.LIMIT.help, ["scope"], registry=r)
    apps = Gauge("sparkgate_allocator_apps", status_module.APPS.help, registry=r)
    backing = Gauge("sparkgate_allocator_apps_backing_off", status_module.BACKING_OFF.help, registry=r)
    unsaved = Gauge("sparkgate_allocator_history_unsaved", status_module.UNSAVED.help, registry=r)
    histories = Gauge("sparkgate_allocator_histories", status_module.HISTORIES.help, registry=r)
    requests = Gauge(
        "sparkgate_allocator_provisioning_requests", status_module.REQUESTS.help, ["state"], registry=r
    )
    for key, view in s.snapshot.apps.items():
        for name, n in view.counts.by_state().items():
            executors.labels(key.namespace, key.app_id, name).set(n)
    for namespace in sorted({k.namespace for k in s.snapshot.apps}):
        ours = [v for k, v in s.snapshot.apps.items() if k.namespace == namespace]
        in_flight.labels(namespace).set(sum(1 for v in ours for p in v.pods if p.in_flight))
        bypassed.labels(namespace).set(sum(1 for v in ours for p in v.pods if p.bypassed))
    for key in s.snapshot.apps:
        memory = s.memory.get(key)
        if memory is not None and memory.pacing is not None:
            window.labels(key.namespace, key.app_id).set(memory.pacing.size)
            state.labels(key.namespace, key.app_id, memory.pacing.reason.value).set(1)
    missing.labels("log4j").set(1)
    limit.labels("namespace").set(100)
    limit.labels("cluster").set(1000)
    apps.set(3)
    backing.set(1)
    unsaved.set(3)
    histories.set(7)
    for state in status_module.REQUEST_STATES:
        requests.labels(state).set(
            sum(1 for v in s.snapshot.apps.values() for q in v.requests if q.state == state)
        )
    return generate_latest(r)


def test_the_collector_writes_what_prometheus_clients_writer_writes() -> None:
    memory = {
        A: AppMemory(pacing=Window(20, Reason.SLOW_START)),
        ODD: AppMemory(pacing=Window(10, Reason.FIXED)),
    }
    s = status(views(), memory)
    assert AppsCollector(lambda: s).exposition() == reference(s)


def test_a_scrape_writes_again_only_the_apps_that_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[AppKey] = []
    app_lines = status_module._app_lines

    def counting(key: AppKey, view: AppView, window: Window | None) -> tuple[str, str, str]:
        written.append(key)
        return app_lines(key, view, window)

    monkeypatch.setattr(status_module, "_app_lines", counting)
    apps, memory = views(), {A: AppMemory(pacing=Window(20, Reason.SLOW_START))}
    current = [status(apps, memory)]
    collector = AppsCollector(lambda: current[0])
    first = collector.exposition()
    assert sorted(written) == sorted(apps)
    written.clear()
    assert collector.exposition() == first and written == []  # nothing changed: nothing written again
    apps = {**apps, B: replace(apps[B], pods=(pod(B, 1, profile=None),))}  # app-b changed
    memory = {A: AppMemory(pacing=Window(40, Reason.SLOW_START))}  # app-a's window grew
    current[0] = status(apps, memory)
    changed = collector.exposition()
    assert sorted(written) == sorted([A, B])
    assert changed == reference(current[0])
    del apps[B]  # app-b is over: its series are gone from the next scrape
    current[0] = status(apps, memory)
    assert b'app="app-b"' not in collector.exposition()


@pytest.fixture
def still_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process collectors' values held still between two reads: the process collector reads a copy of
    this process's /proc entries, and the garbage collector (whose counts the GC collector reports) is off."""
    proc = tmp_path / "proc"
    (proc / "self" / "fd").mkdir(parents=True)
    shutil.copyfile("/proc/stat", proc / "stat")
    for name in ("stat", "limits"):
        shutil.copyfile(f"/proc/self/{name}", proc / "self" / name)
    for fd in range(3):
        (proc / "self" / "fd" / str(fd)).touch()
    monkeypatch.setattr(
        metrics_module, "ProcessCollector", functools.partial(ProcessCollector, proc=str(proc))
    )
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_the_registry_s_text_is_prometheus_clients_and_keeps_only_live_series(still_process: None) -> None:
    """/metrics' registry part (metrics.py `RegistryText`, which keeps each series' formatted name and labels)
    is byte for byte what prometheus_client's `generate_latest` writes, at the first scrape and after values
    changed and series went, counters' and histograms' `_created` gauges included, the process's own
    collectors (process, platform, GC) too; a label value with a backslash, a double quote and a line feed is
    escaped as the text format says."""
    metrics = AllocatorMetrics()
    odd = Counter(
        "sparkgate_test_odd", "A help text with a \\ and\na line feed.", ["value"], registry=metrics.registry
    )
    odd.labels('a "quoted" \\ value\nover two lines').inc(2)
    # labels that sort before and after a bucket's `le`
    spread = Histogram(
        "sparkgate_test_spread", "Buckets amid labels.", ["app", "zone"], registry=metrics.registry
    )
    spread.labels("a", "z").observe(0.5)
    for i in range(30):
        namespace = f"spark-team-{i:03d}"
        metrics.releases.labels(namespace).inc(i)
        metrics.gate_wait.labels(namespace).observe(0.3 * i)
        metrics.release_to_bind.labels(namespace).observe(1e7 * i)  # Go's exponent form of large floats
        metrics.namespaces.add(namespace)
    text = RegistryText(metrics.registry)
    first = text.exposition()
    assert first == generate_latest(metrics.registry)
    for family in (b"process_open_fds 3.0", b"process_cpu_seconds_total", b"python_info{", b"python_gc_"):
        assert family in first
    metrics.releases.labels("spark-team-003").inc(0.5)
    metrics.gate_wait.labels("spark-team-004").observe(float("inf"))
    metrics.forget_namespaces({f"spark-team-{i:03d}" for i in range(10)}, 0.0)
    assert text.exposition() == generate_latest(metrics.registry)  # absent, not yet forgotten
    metrics.forget_namespaces({f"spark-team-{i:03d}" for i in range(10)}, NAMESPACE_GRACE_SECONDS)
    after = text.exposition()
    assert after == generate_latest(metrics.registry) and b"spark-team-010" not in after
    samples = [line for line in after.decode().splitlines() if not line.startswith("#")]
    kept = [t for _, t in text._series.values()]  # a histogram's child keeps the texts of all its series
    assert sum(1 if isinstance(t, str) else len(t) for t in kept) == len(samples)  # those written, no more


def test_a_scrape_leaves_no_new_long_lived_objects_behind() -> None:
    """What the registry's text keeps from one scrape to the next (each series' key and formatted text) is the
    objects made when the series first came, not a copy made by every scrape: at 100,000 pods a scrape's
    ~30,000 kept copies survived into the GC's oldest generation and set off a full collection of the whole
    heap every other scrape (bench/scale.py)."""
    metrics = AllocatorMetrics()
    for i in range(20):
        metrics.gate_wait.labels(f"spark-team-{i:03d}").observe(0.3 * i)
    text = RegistryText(metrics.registry)
    text.exposition()
    first = {id(key): key for key in text._series}
    metrics.gate_wait.labels("spark-team-001").observe(2.0)  # a value changes, the series stay
    text.exposition()
    assert len(text._series) == len(first)
    assert all(first.get(id(key)) is key for key in text._series)


def test_a_namespace_is_not_forgotten_between_its_addition_and_a_write_of_its_series() -> None:
    """Per-namespace series are written by the actor's, the reflector's and the loop's threads and forgotten
    by the loop when no app of the namespace is left: a series written after its namespace's removal would
    stay for good (nothing adds the namespace back). The write and the forgetting exclude each other."""
    metrics = AllocatorMetrics(namespace_grace=0.0)
    forgetting = threading.Event()
    with metrics.in_namespace("gone"):
        loop = threading.Thread(target=lambda: (forgetting.set(), metrics.forget_namespaces(set(), 0.0)))
        loop.start()
        assert forgetting.wait(10)
        metrics.releases.labels("gone").inc()  # the forgetting waits for this write
    loop.join(10)
    assert not loop.is_alive()
    assert "gone" not in metrics.namespaces
    assert metrics.sample("sparkgate_allocator_releases_total", {"namespace": "gone"}) is None


def test_a_namespace_without_apps_keeps_its_series_for_the_grace_period() -> None:
    """A namespace whose last app ended keeps its per-namespace series for NAMESPACE_GRACE_SECONDS, so the
    increments of its end (app_finished deletions, the last releases) are scraped before they go; an app
    or a write meanwhile keeps it. A namespace's counters exist from 0 from its first write, so rate()
    sees its first increment."""
    metrics = AllocatorMetrics()
    with metrics.in_namespace("spark"):
        metrics.deletions.labels("spark", "app_finished").inc()
    assert metrics.sample("sparkgate_allocator_releases_total", {"namespace": "spark"}) == 0.0
    metrics.forget_namespaces(set(), 100.0)
    metrics.forget_namespaces(set(), 100.0 + NAMESPACE_GRACE_SECONDS - 1)
    assert (
        metrics.sample(
            "sparkgate_allocator_deletions_total", {"namespace": "spark", "reason": "app_finished"}
        )
        == 1.0
    )
    with metrics.in_namespace("spark"):  # a write: the namespace is busy again
        metrics.releases.labels("spark").inc()
    metrics.forget_namespaces(set(), 100.0 + NAMESPACE_GRACE_SECONDS + 1)
    assert metrics.sample("sparkgate_allocator_releases_total", {"namespace": "spark"}) == 1.0
    metrics.forget_namespaces({"spark"}, 2000.0)  # an app again
    metrics.forget_namespaces(set(), 3000.0)
    metrics.forget_namespaces(set(), 3000.0 + NAMESPACE_GRACE_SECONDS)
    assert metrics.sample("sparkgate_allocator_releases_total", {"namespace": "spark"}) is None
    assert "spark" not in metrics.namespaces
