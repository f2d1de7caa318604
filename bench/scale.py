"""Allocator scale: the reflector cache and the decision, fed a synthetic watch stream, no HTTP.

10,000 executor pods across 500 applications (50 namespaces of 10 apps, 20 executors each) go through their
whole life as watch events, in the allocator's own order of work: each event is parsed from its JSON line (as
`sparkgate.kube` does) and applied to `allocator.cache.Cache`, then `allocator.decision.decide` runs on
`Cache.snapshot()` for the apps the events touched, with what allocator/loop.py's step keeps in between (the
apps' memory, and the expectations (allocator/expectations.py) for gate removals the watch has not reported yet). Every simulated second
a decision covers all apps (the loop's tick). The stream is closed-loop: a `Release` the decision returns
comes back as the watch event of the gate removal, then the pod is bound, then Running; at the end every
driver finishes and every executor pod is deleted (deletionTimestamp, then DELETED). The pods are the captured
Spark 4.3 executor pod admitted by the real webhook mutation (gate, profile annotation, template): real sizes,
real fields.

Two timed passes over the same stream:
- loop: the gate removals of one decision come back as one chunk followed by one decision, as the loop takes
  them (its actor sends a step's PATCHes while the reflector queues their events); every other event gets a
  decision of its own;
- every_event: a decision after every single event, the loop's worst case.

Measured: events per second (parse + cache + decision, ticks included), the decision latency per step, the
tick's latency, and the memory the cache and the allocator's memory hold per tracked pod (tracemalloc: what
is freed when they are dropped, with all pods tracked, in a separate untimed pass). Also measured, not part
of the target: allocator/loop.py's own passes over every pod on each step (the expectations while a gate
removal is unseen, and `_observe`'s per-app counts and gauges).

Targets (issue 7): >= 5,000 events/s; <= 2 KB per tracked pod.

    python -m bench.scale [--apps 500] [--executors 20] [--smoke]
"""

from __future__ import annotations

import argparse
import collections
import copy
import gc
import json
import sys
import time
import tracemalloc
import uuid
from dataclasses import dataclass, field
from typing import Any

from allocator.cache import Cache
from allocator.decision import decide
from allocator.expectations import Expectations
from allocator.metrics import AllocatorMetrics
from allocator.model import Action, AppMemory, PodRecord, Release
from allocator.status import AppsCollector, Status
from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.json_patch import apply_patch
from sparkgate.mutation import mutate
from sparkgate.policy import Policy, load_policy

from . import common
from .common import Row, fmt

NAME = "scale"
EVENTS_TARGET = 5000.0
BYTES_PER_POD_TARGET = 2048.0
FIXTURE = "etl-nightly-exec-1.admissionreview.json"

POLICY = """\
apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation:
  batchSize: 10
  batchDelaySeconds: 0.5
  maxPendingPerApp: 20
  maxPendingPerNamespace: 100
  maxPendingCluster: 1000
caps:
  batchSize: 50
  maxPendingPerApp: 100
profiles:
  - name: analytics
    match:
      labels:
        team: analytics
    template:
      spec:
        tolerations:
          - key: spark
            operator: Exists
            effect: NoSchedule
    labels:
      sparkgate.io/tier: batch
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--apps", type=int, default=500)
    parser.add_argument("--executors", type=int, default=20, help="per app")
    parser.add_argument("--apps-per-namespace", type=int, default=10)
    parser.add_argument("--spark-batch", type=int, default=10, help="pods a driver creates per turn")
    parser.add_argument(
        "--event-interval", type=float, default=0.0002, help="simulated seconds between two events"
    )
    parser.add_argument("--tick", type=float, default=1.0, help="simulated seconds between full decisions")


def admitted_pod(policy: Policy) -> dict[str, Any]:
    """The captured executor pod as the API server stores it after the webhook's mutation."""
    review = json.loads((common.FIXTURES / FIXTURE).read_text())
    request = review["request"]
    pod: dict[str, Any] = apply_patch(request["object"], mutate(request, policy).ops)
    pod["metadata"].update(resourceVersion="1", creationTimestamp="2026-01-01T00:00:00Z")
    pod["status"] = {"phase": "Pending", "qosClass": "Burstable"}
    if not any(g.get("name") == contract.GATE for g in pod["spec"].get("schedulingGates") or ()):
        raise RuntimeError("the mutation did not gate the captured pod")
    return pod


@dataclass
class PodState:
    namespace: str
    app_id: str
    name: str
    uid: str
    exec_id: int
    gated: bool = True
    node: str | None = None
    phase: str = "Pending"
    deleting: bool = False


class Stream:
    """The simulated cluster: it writes watch event lines, and reacts to the allocator's releases."""

    def __init__(self, template: dict[str, Any], args: argparse.Namespace) -> None:
        self.template = template
        self.args = args
        self.resource_version = 1
        self.apps: list[tuple[str, str]] = [
            (f"spark-team-{i // args.apps_per_namespace:03d}", f"spark-{uuid.uuid4().hex}")
            for i in range(args.apps)
        ]
        self.pods: dict[str, PodState] = {}  # by uid
        self._gated = 0
        self.echoes: collections.deque[bytes] = (
            collections.deque()
        )  # gate removals: the watch reports at once
        self.queue: collections.deque[bytes] = collections.deque()  # binds and starts: they take a while

    def _line(self, kind: str, obj: dict[str, Any]) -> bytes:
        return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode()

    def _rv(self) -> str:
        self.resource_version += 1
        return str(self.resource_version)

    def pod_line(self, kind: str, pod: PodState) -> bytes:
        t = self.template
        meta = dict(t["metadata"])
        labels = dict(meta["labels"])
        labels[contract.LABEL_APP_ID] = pod.app_id
        labels[contract.LABEL_EXEC_ID] = str(pod.exec_id)
        meta.update(
            name=pod.name, namespace=pod.namespace, uid=pod.uid, labels=labels, resourceVersion=self._rv()
        )
        if pod.deleting:
            meta["deletionTimestamp"] = "2026-01-01T01:00:00Z"
        spec = dict(t["spec"])
        if pod.gated:
            spec["schedulingGates"] = [{"name": contract.GATE}]
        else:
            spec.pop("schedulingGates", None)
        if pod.node:
            spec["nodeName"] = pod.node
        status: dict[str, Any] = {"phase": pod.phase, "qosClass": "Burstable"}
        if pod.phase == "Running":
            status["containerStatuses"] = [
                {"name": contract.SPARK_CONTAINER_NAME, "ready": True, "state": {"running": {}}}
            ]
        return self._line(kind, {**t, "metadata": meta, "spec": spec, "status": status})

    def driver_line(self, kind: str, index: int, phase: str) -> bytes:
        namespace, app_id = self.apps[index]
        meta = {
            "name": f"app-{index}-driver",
            "namespace": namespace,
            "uid": f"driver-{index}",
            "resourceVersion": self._rv(),
            "labels": {contract.LABEL_ROLE: contract.ROLE_DRIVER, contract.LABEL_APP_ID: app_id},
        }
        return self._line(kind, {"metadata": meta, "spec": {}, "status": {"phase": phase}})

    def creations(self) -> list[tuple[str, bytes]]:
        """("driver"|"executor", line): the drivers, then their executors, `spark_batch` per app per turn."""
        out = [("driver", self.driver_line("ADDED", i, "Running")) for i in range(len(self.apps))]
        created = [0] * len(self.apps)
        while any(n < self.args.executors for n in created):
            for i, (namespace, app_id) in enumerate(self.apps):
                for _ in range(min(self.args.spark_batch, self.args.executors - created[i])):
                    created[i] += 1
                    pod = PodState(
                        namespace, app_id, f"app-{i}-exec-{created[i]}", str(uuid.uuid4()), created[i]
                    )
                    self.pods[pod.uid] = pod
                    self._gated += 1
                    out.append(("executor", self.pod_line("ADDED", pod)))
        return out

    def gated(self) -> int:
        return self._gated

    def react(self, actions: tuple[Action, ...]) -> None:
        """The gate removals the decision asked for, as the watch will report them, and their consequences."""
        for action in actions:
            if isinstance(action, Release):
                pod = self.pods[action.pod.uid]
                if not pod.gated:
                    raise RuntimeError(f"pod {pod.name} released twice")
                pod.gated = False
                self._gated -= 1
                self.echoes.append(self.pod_line("MODIFIED", pod))
                pod.node = f"node-{hash(pod.uid) % 100}"
                self.queue.append(self.pod_line("MODIFIED", pod))
                pod.phase = "Running"
                self.queue.append(self.pod_line("MODIFIED", pod))

    def teardown(self) -> list[tuple[str, bytes]]:
        out = [("driver", self.driver_line("MODIFIED", i, "Succeeded")) for i in range(len(self.apps))]
        for pod in self.pods.values():
            pod.deleting = True
            out.append(("executor", self.pod_line("MODIFIED", pod)))
            out.append(("executor", self.pod_line("DELETED", pod)))
        out += [("driver", self.driver_line("DELETED", i, "Succeeded")) for i in range(len(self.apps))]
        return out


class Allocator:
    """The part of the allocator under test: the cache, the decision, and what the loop keeps between them
    (allocator/loop.py's step: the dirty apps, the memory, and the gate removals the watch has not reported
    yet, which the expectations apply to the snapshot so that a pod is never released twice)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.dirty: set[AppKey] = set()
        self.gone: list[PodRecord] = []
        self.memory: dict[AppKey, AppMemory] = {}
        self.now = 0.0
        self.expectations = Expectations(monotonic=lambda: self.now)
        self.actions: tuple[Action, ...] = ()
        self.expect_seconds = 0.0  # of the decisions' time, what expect_released took
        self.cache = Cache(self.dirty.update, lambda record, removed: self.gone.append(record))
        self.cache.pod_observers.append(self.expectations.observe)
        for name in ("pods", "drivers", "sources", "copies"):
            self.cache.synced[name] = True

    def ingest(self, chunk: list[tuple[str, bytes]]) -> tuple[float, float, float]:
        """(parse, cache, decision) seconds for a chunk of events followed by one decision for the apps they
        touched; the decision's actions are left in `actions`."""
        parse = cache = 0.0
        for kind, line in chunk:
            t0 = time.perf_counter()
            event = json.loads(line)
            t1 = time.perf_counter()
            obj = event["object"]
            if kind == "driver":
                self.cache.driver_event(event["type"], obj)
            else:
                self.cache.pod_event(event["type"], obj)
            parse += t1 - t0
            cache += time.perf_counter() - t1
        t2 = time.perf_counter()
        self.actions = self.decide(self.dirty)
        return parse, cache, time.perf_counter() - t2

    def decide(self, apps: set[AppKey] | None) -> tuple[Action, ...]:
        """One decision for `apps` (None: every app, the tick), as the loop takes it."""
        snapshot = self.cache.snapshot()
        started = time.perf_counter()
        snapshot = self.expectations.apply(snapshot, self.expectations.pending())
        self.expect_seconds += time.perf_counter() - started
        decision = decide(snapshot, self.policy, self.now, self.memory, apps)
        self.memory.update(decision.memory)
        self.dirty.clear()
        self.expectations.released((a.app, a.pod.uid) for a in decision.actions if isinstance(a, Release))
        return decision.actions


@dataclass
class Timings:
    """Per step (a chunk of events and the decision after it): events, and seconds of each part."""

    events: list[int] = field(default_factory=list)
    parse: list[float] = field(default_factory=list)
    cache: list[float] = field(default_factory=list)
    decision: list[float] = field(default_factory=list)
    ticks: list[float] = field(default_factory=list)


def drive(
    allocator: Allocator,
    stream: Stream,
    lines: list[tuple[str, bytes]],
    timings: Timings,
    args: argparse.Namespace,
    next_tick: list[float],
    *,
    coalesce: bool,
) -> None:
    """Feed `lines`, each followed by the cluster's reactions to what the allocator released.

    The watch reports the allocator's own gate removals at once; with `coalesce` those of one decision come
    in as one chunk followed by one decision, as the loop takes them (its actor sends the PATCHes of a step
    while the reflector queues their events, so the next step sees them together); without it every event
    gets its own decision (the loop's worst case). Binds and starts interleave with the drivers' creations,
    one each with its own decision, so pods stay in flight for a while and the budgets bind now and then.
    When nothing happens and pods still wait (for the batch delay), time moves on to the next tick."""
    pending = collections.deque(lines)

    def tick() -> None:
        next_tick[0] = allocator.now + args.tick
        started = time.perf_counter()
        actions = allocator.decide(None)
        timings.ticks.append(time.perf_counter() - started)
        stream.react(actions)

    def step(chunk: list[tuple[str, bytes]]) -> None:
        parse, cache, decision = allocator.ingest(chunk)
        timings.events.append(len(chunk))
        timings.parse.append(parse)
        timings.cache.append(cache)
        timings.decision.append(decision)
        stream.react(allocator.actions)
        allocator.now += args.event_interval * len(chunk)
        if allocator.now >= next_tick[0]:
            tick()

    idle_ticks = 0
    while pending or stream.queue or stream.echoes or stream.gated():
        while stream.echoes:
            if coalesce:
                chunk = [("executor", line) for line in stream.echoes]
                stream.echoes.clear()
                step(chunk)
            else:
                step([("executor", stream.echoes.popleft())])
        if not pending and not stream.queue:
            if not stream.gated():
                break
            idle_ticks += 1
            if idle_ticks > 1000:
                raise RuntimeError(f"{stream.gated()} pods stay gated: the allocator releases nothing")
            allocator.now = max(allocator.now, next_tick[0])
            tick()
            continue
        if stream.queue:
            step([("executor", stream.queue.popleft())])
        if pending:
            step([pending.popleft()])


def loop_overheads(allocator: Allocator) -> dict[str, float]:
    """What allocator/loop.py adds to every step, measured with every pod tracked: the expectations with one
    removed gate not yet seen by the watch, and `_observe`'s per-app work (counts by state, the per-app
    gauges, the bypass count); both walk every pod of every app."""
    snapshot = allocator.cache.snapshot()
    metrics = AllocatorMetrics()
    rounds = 20
    started = time.perf_counter()
    expectations = Expectations()
    some = next(view for view in snapshot.apps.values() if view.pods)
    expectations.released([(some.key, some.pods[0].uid)])
    for _ in range(rounds):
        expectations.apply(snapshot, expectations.pending())
    expect = (time.perf_counter() - started) / rounds
    started = time.perf_counter()
    metrics.tracked = AppsCollector(lambda: Status(snapshot, {}, {}, {}, {}, 0, 0)).exposition
    for _ in range(rounds):
        metrics.exposition()
    observed = (time.perf_counter() - started) / rounds
    return {"expect_released_ms": round(expect * 1000, 3), "observe_ms": round(observed * 1000, 3)}


def timed_pass(
    template: dict[str, Any], policy: Policy, args: argparse.Namespace, *, coalesce: bool
) -> dict[str, Any]:
    stream = Stream(template, args)
    creations = stream.creations()
    allocator = Allocator(policy)
    timings = Timings()
    next_tick = [args.tick]
    gc.collect()
    drive(allocator, stream, creations, timings, args, next_tick, coalesce=coalesce)
    views = allocator.cache.snapshot().apps.values()
    tracked = sum(len(v.pods) for v in views)
    all_running = all(v.counts.running == args.executors for v in views)
    overheads = loop_overheads(allocator)
    drive(allocator, stream, stream.teardown(), timings, args, next_tick, coalesce=coalesce)
    events = sum(timings.events)
    busy = sum(timings.parse) + sum(timings.cache) + sum(timings.decision) + sum(timings.ticks)
    step_ms = [
        (p + c + d) * 1000 for p, c, d in zip(timings.parse, timings.cache, timings.decision, strict=True)
    ]
    return {
        "events": events,
        "steps": len(timings.events),
        "tracked_pods_at_peak": tracked,
        "all_running_at_peak": all_running,
        "left_after_teardown": len(allocator.cache.snapshot().apps),
        "deletions_seen": len(allocator.gone),
        "events_per_second": round(events / busy, 1),
        "seconds": round(busy, 3),
        "share_of_time": {
            "parse": round(sum(timings.parse) / busy, 3),
            "cache": round(sum(timings.cache) / busy, 3),
            "decision": round(sum(timings.decision) / busy, 3),
            "ticks": round(sum(timings.ticks) / busy, 3),
        },
        "share_of_time_in_expect_released": round(allocator.expect_seconds / busy, 3),
        "step_ms": _quantiles(step_ms),
        "decision_per_step_ms": _quantiles([d * 1000 for d in timings.decision]),
        "tick_ms": _quantiles([t * 1000 for t in timings.ticks]) | {"count": len(timings.ticks)},
        "loop_py_per_step_at_peak": overheads,
    }


def memory_pass(template: dict[str, Any], policy: Policy, args: argparse.Namespace) -> dict[str, Any]:
    """Bytes held by the cache and the allocator's memory per tracked pod, every pod tracked and Running."""
    stream = Stream(template, args)
    creations = stream.creations()
    gc.collect()
    tracemalloc.start()
    try:
        allocator = Allocator(policy)
        drive(allocator, stream, creations, Timings(), args, [args.tick], coalesce=True)
        tracked = sum(len(v.pods) for v in allocator.cache.snapshot().apps.values())
        gc.collect()
        with_cache, _ = tracemalloc.get_traced_memory()
        del allocator  # with it, its in-flight counter (which remembers the last snapshot's views)
        gc.collect()
        without, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    held = with_cache - without
    return {"tracked_pods": tracked, "bytes_held": held, "bytes_per_pod": round(held / max(1, tracked), 1)}


def _quantiles(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(common.percentile(values, 0.50), 4),
        "p99": round(common.percentile(values, 0.99), 4),
        "max": round(max(values, default=float("nan")), 4),
        "mean": round(sum(values) / len(values), 4) if values else float("nan"),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.smoke:
        args.apps, args.executors, args.apps_per_namespace = 20, 10, 5
    policy = load_policy(POLICY)
    template = admitted_pod(policy)
    return {
        "config": {
            "apps": args.apps,
            "executors_per_app": args.executors,
            "pods": args.apps * args.executors,
            "namespaces": -(-args.apps // args.apps_per_namespace),
            "spark_batch": args.spark_batch,
            "pod_json_bytes": len(json.dumps(template)),
            "simulated_event_interval_s": args.event_interval,
            "tick_s": args.tick,
            "policy": POLICY,
        },
        "loop": timed_pass(copy.deepcopy(template), policy, args, coalesce=True),
        "every_event": timed_pass(copy.deepcopy(template), policy, args, coalesce=False),
        "memory": memory_pass(template, policy, args),
        "targets": {"events_per_second_min": EVENTS_TARGET, "bytes_per_pod_max": BYTES_PER_POD_TARGET},
    }


def rows(result: dict[str, Any]) -> list[Row]:
    loop, every, m = result["loop"], result["every_event"], result["memory"]
    c = result["config"]
    overheads = loop["loop_py_per_step_at_peak"]
    return [
        Row("pods / apps / events", f"{c['pods']:,} / {c['apps']} / {loop['events']:,}"),
        Row(
            "events/s, as the loop steps (echoes together)",
            fmt(loop["events_per_second"], 0),
            f">= {EVENTS_TARGET:,.0f}",
            loop["events_per_second"] >= EVENTS_TARGET,
        ),
        Row(
            "events/s, a decision after every event",
            fmt(every["events_per_second"], 0),
            f">= {EVENTS_TARGET:,.0f}",
            every["events_per_second"] >= EVENTS_TARGET,
        ),
        Row(
            "decision per step p50 / p99 (loop; every event)",
            f"{loop['decision_per_step_ms']['p50']:.3f} / {loop['decision_per_step_ms']['p99']:.3f} ms; "
            f"{every['decision_per_step_ms']['p50']:.3f} / {every['decision_per_step_ms']['p99']:.3f} ms",
        ),
        Row("tick (all apps) p50", f"{loop['tick_ms']['p50']:.1f} ms"),
        Row(
            "memory per tracked pod",
            f"{m['bytes_per_pod']:,.0f} B",
            f"<= {BYTES_PER_POD_TARGET:,.0f} B",
            m["bytes_per_pod"] <= BYTES_PER_POD_TARGET,
        ),
        Row(
            "loop.py per step at peak (expect_released / _observe)",
            f"{overheads['expect_released_ms']:.2f} / {overheads['observe_ms']:.2f} ms",
        ),
    ]


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
