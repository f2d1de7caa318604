"""One run of a scenario on kubesim, with or without sparkgate, and what it measured.

Measurement is exact and in-process: a store listener sees every committed change of an executor pod and of
a node in order (no polling, no watch latency), so the peak of unscheduled pods is the true peak, an app's
work is integrated over the moments its running executors change, and with sparkgate every gate removal is
judged by the one cap checker (sandbox/caps.py). The nodes are counted as they join and go, so the
node-minutes are those until the moment the last app completed. On an autoscaled cluster the autoscaler's
scale-up rounds are read from it at the end (kubesim/autoscaler.py `plans`), what sparkgate showed it is
counted from the same changes (executor pods first marked Unschedulable while still gated, ProvisioningRequests
made and provisioned), and on every cluster the scheduler's own peak of pods waiting (kubesim/scheduler.py
`peak_pending`).

Threads: the Tracker is fed by the store's committing threads and read by the run's thread (the live view,
the result), under its lock; the Run's own state belongs to the thread that calls `execute`.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubesim.sparkdriver import SparkDriver
from sandbox.caps import CapChecker, Caps, state_of
from sandbox.localsystem import LocalSystem
from sparkgate import contract

from .scenarios import AppSpec, RunSpec, Scenario

NAMESPACE = "spark"
DRIVER_USER = f"system:serviceaccount:{NAMESPACE}:spark"


@dataclass
class AppState:
    spec: AppSpec
    app_id: str
    submitted: float  # seconds since the run started
    gated: int = 0
    waiting: int = 0  # released (or never gated), not bound, Pending: what the scheduler must place
    bound: int = 0  # bound, not yet running
    running: int = 0
    deleted: int = 0  # executor pods deleted before the app completed (scale-down, id reuse...)
    work_done: float = 0.0  # executor-seconds
    since: float = 0.0  # when `running` last changed
    first_running: float | None = None  # seconds since the run started
    all_running: float | None = (
        None  # when all its executors first ran at once, seconds since the run started
    )
    complete: float | None = None  # seconds since the run started
    last_created: float | None = None  # its latest executor's creation, seconds since the run started

    def work_at(self, now: float) -> float:
        return self.work_done + self.running * max(0.0, now - self.since)

    def due(self, now: float) -> float | None:
        """When the app's work will be done at the current pace (None: nothing runs)."""
        if self.complete is not None:
            return self.complete
        if self.running == 0:
            return None
        return self.since + max(0.0, self.spec.work - self.work_done) / self.running

    def summary(self) -> dict[str, Any]:
        return {
            "executors": self.spec.executors,
            "submitted_s": round(self.submitted, 2),
            "first_executor_after_s": None
            if self.first_running is None
            else round(self.first_running - self.submitted, 2),
            "all_running_after_s": None
            if self.all_running is None
            else round(self.all_running - self.submitted, 2),
            "complete_after_s": None if self.complete is None else round(self.complete - self.submitted, 2),
            # How long its driver took to create its executors: with a roomy cluster, the API server's time
            # per creation (Spark creates them one after another), which no pacing changes.
            "all_created_after_s": None
            if self.last_created is None
            else round(self.last_created - self.submitted, 2),
            "deleted_before_running": self.deleted,
        }


def _marked(status: dict[str, Any]) -> bool:
    """PodScheduled=False with reason Unschedulable: what cluster-autoscaler counts (kubesim/autoscaler.py)."""
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or ()
    )


@dataclass
class _Pod:
    app: str
    gated: bool
    bound: bool
    running: bool
    pending: bool  # Pending and not being deleted


class Tracker:
    """Per-app and cluster counts from the store's committed changes, and the peaks."""

    def __init__(self, started: float, clock: Callable[[], float], caps: Caps | None = None) -> None:
        self.started = started
        self.clock = clock
        self.checker = CapChecker(caps) if caps is not None else None  # with sparkgate: every release judged
        self.nodes = 0
        self.peak_nodes = 0
        self.node_lives: dict[str, list[float]] = {}  # node -> [joined, left], seconds since the run started
        self.lock = threading.Lock()
        self.apps: dict[str, AppState] = {}  # by app id
        self.pods: dict[str, _Pod] = {}  # by uid
        self.unscheduled = 0
        self.gated = 0
        self.running = 0
        self.peak_unscheduled = 0
        self.peak_gated = 0
        self.bypassed = 0  # executor pods without the sparkgate.io/profile annotation (with sparkgate)
        self.created: dict[str, float] = {}  # by uid, until the pod first runs or goes: when it was created
        self.start_latencies: list[float] = []  # each executor's creation -> first Running, seconds
        # Each executor's creation -> first marked PodScheduled=False/Unschedulable (by the scheduler, or by
        # sparkgate on a held pod): when cluster-autoscaler can first see it. Pods bound unmarked are not in it.
        self.mark_latencies: list[float] = []
        self._unmarked: dict[str, float] = {}  # by uid, until first marked or bound: when it was created
        self.marked_held = 0  # executor pods first marked while still gated: sparkgate's marks (`held`)
        # ProvisioningRequests made in the run (by name) and those that got Provisioned=True.
        self.requests: set[str] = set()
        self.provisioned: set[str] = set()

    def now(self) -> float:
        return self.clock() - self.started

    def register(self, spec: AppSpec, app_id: str) -> AppState:
        with self.lock:
            state = AppState(spec, app_id, self.now())
            state.since = state.submitted
            self.apps[app_id] = state
            return state

    def on_change(self, kind: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "nodes":
            self.node_changed(kind, obj["metadata"]["name"])
            return
        if resource == "provisioningrequests":
            self._request_changed(obj)
            return
        if resource != "pods":
            return
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(contract.LABEL_ROLE) != contract.ROLE_EXECUTOR:
            return
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        phase = status.get("phase") or "Pending"
        new = None
        if kind != "DELETED":
            new = _Pod(
                labels.get(contract.LABEL_APP_ID, ""),
                any(g.get("name") == contract.GATE for g in spec.get("schedulingGates") or ()),
                bool(spec.get("nodeName")),
                phase == "Running" and not meta.get("deletionTimestamp"),
                phase == "Pending" and not meta.get("deletionTimestamp"),
            )
        with self.lock:
            now = self.now()
            uid = meta.get("uid", "")
            if self.checker is not None:
                self.checker.change(uid, state_of(obj) if kind != "DELETED" else None)
            old = self.pods.pop(uid, None)
            if old is None and new is not None:
                self.created[uid] = now
                if new.app in self.apps:
                    self.apps[new.app].last_created = now
            if new is not None and new.running and (created := self.created.pop(uid, None)) is not None:
                self.start_latencies.append(now - created)
            elif new is None:
                self.created.pop(uid, None)
            if old is None and new is not None and not new.bound:
                self._unmarked[uid] = now
            if new is None or new.bound:
                self._unmarked.pop(uid, None)
            elif uid in self._unmarked and _marked(status):
                self.mark_latencies.append(now - self._unmarked.pop(uid))
                self.marked_held += int(new.gated)
            if (
                old is None
                and new is not None
                and contract.ANNOTATION_PROFILE not in (meta.get("annotations") or {})
            ):
                self.bypassed += 1
            if old is not None:
                self._count(old, -1, now)
            if new is not None:
                self.pods[uid] = new
                self._count(new, +1, now)
            elif old is not None and old.pending and old.app in self.apps:
                app = self.apps[old.app]
                if app.complete is None:
                    app.deleted += 1
            self.peak_unscheduled = max(self.peak_unscheduled, self.unscheduled)
            self.peak_gated = max(self.peak_gated, self.gated)

    def _request_changed(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        provisioned = any(
            c.get("type") == "Provisioned" and c.get("status") == "True"
            for c in (obj.get("status") or {}).get("conditions") or ()
        )
        with self.lock:
            self.requests.add(name)
            if provisioned:
                self.provisioned.add(name)

    def node_changed(self, kind: str, name: str, at: float | None = None) -> None:
        """A node joined (ADDED) or left (DELETED) now, or `at` (seconds since the run started)."""
        with self.lock:
            life = self.node_lives.get(name)
            if kind == "ADDED" and life is None:
                self.node_lives[name] = [self.now() if at is None else at]
                self.nodes += 1
                self.peak_nodes = max(self.peak_nodes, self.nodes)
            elif kind == "DELETED" and life is not None and len(life) == 1:
                life.append(self.now())
                self.nodes -= 1

    def node_joins(self) -> list[float]:
        """When each node joined, seconds since the run started (the nodes there at its start: 0)."""
        with self.lock:
            return sorted(life[0] for life in self.node_lives.values())

    def node_seconds(self, until: float) -> float:
        """Every node's time in the cluster from the start of the run until `until`."""
        with self.lock:
            return sum(max(0.0, min(life[-1] if len(life) > 1 else until, until) - life[0])
                       for life in self.node_lives.values())  # fmt: skip

    def _count(self, pod: _Pod, sign: int, now: float) -> None:
        app = self.apps.get(pod.app)
        if pod.pending and pod.gated:
            self.gated += sign
            if app:
                app.gated += sign
        elif pod.pending and not pod.bound:
            self.unscheduled += sign
            if app:
                app.waiting += sign
        elif pod.pending and app:
            app.bound += sign
        if pod.running:
            self.running += sign
            if app:
                app.work_done = app.work_at(now)
                app.since = now
                app.running += sign
                if app.first_running is None and sign > 0:
                    app.first_running = now
                if app.all_running is None and app.running >= app.spec.final:
                    app.all_running = now

    def finish(self, app: AppState, at: float) -> None:
        with self.lock:
            app.work_done = app.work_at(at)
            app.complete = at


@dataclass
class RunResult:
    run: RunSpec
    seconds: float
    apps: dict[str, dict[str, Any]]
    peak_unscheduled: int
    peak_gated: int
    scheduling_attempts: int
    api_requests: Counter[str] = field(default_factory=Counter)  # by who: drivers, sparkgate, other
    bypassed: int = 0
    endpoints: dict[str, str] = field(default_factory=dict)
    start_latencies: list[float] = field(default_factory=list)  # each executor's creation -> first Running
    mark_latencies: list[float] = field(default_factory=list)  # creation -> first marked Unschedulable
    scheduler_peak_pending: int = 0  # the most pods (drivers too) the scheduler had waiting at once
    cap_violations: list[str] = field(default_factory=list)  # gate removals past a limit (sandbox/caps.py)
    autoscaling: dict[str, Any] | None = None  # on an autoscaled cluster: scale-ups, nodes, node-minutes

    @property
    def sparkgate(self) -> bool:
        return self.run.sparkgate

    @property
    def complete(self) -> bool:
        return all(a["complete_after_s"] is not None for a in self.apps.values())

    @property
    def all_running(self) -> float | None:
        """When every app had all its executors running, seconds since the run started (None: one never did)."""
        apps = self.apps.values()
        if not apps or any(a["all_running_after_s"] is None for a in apps):
            return None
        return round(max(float(a["submitted_s"] + a["all_running_after_s"]) for a in apps), 2)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run.key,
            "title": self.run.title,
            "sparkgate": self.sparkgate,
            "policy": dict(self.run.allocation),
            "seconds": round(self.seconds, 2),
            "complete": self.complete,
            "peak_unscheduled_executor_pods": self.peak_unscheduled,
            "peak_gated_executor_pods": self.peak_gated,
            "scheduling_attempts": self.scheduling_attempts,
            "api_requests": dict(self.api_requests),
            "bypassed_pods": self.bypassed,
            "executor_start_s": [round(x, 3) for x in self.start_latencies],  # creation -> first Running
            # Each executor's creation -> first PodScheduled=False/Unschedulable: when an autoscaler could see it.
            "executor_marked_s": [round(x, 3) for x in self.mark_latencies],
            "all_running_s": self.all_running,
            "scheduler_peak_pending": self.scheduler_peak_pending,
            "cap_violations": self.cap_violations,
            "autoscaling": self.autoscaling,
            "apps": self.apps,
        }


class Run:
    """Drives one run: submits the drivers on time, scales them, ends each app when its work is done."""

    def __init__(
        self,
        scenario: Scenario,
        spec: RunSpec,
        *,
        duration: float,
        admission: str = "webhook",
        on_tick: Callable[[Run], None] = lambda run: None,
        tick: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scenario = scenario
        self.spec = spec
        self.sparkgate = spec.sparkgate
        self.duration = duration
        self.admission = admission
        self.on_tick = on_tick
        self.tick = tick
        self.clock = clock
        self.tracker = Tracker(clock(), clock)
        self.system: LocalSystem | None = None
        self.rounds_before = 0  # the autoscaler's scale-up rounds before the first driver (it starts idle: 0)
        self.drivers: dict[str, SparkDriver] = {}
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def execute(self) -> RunResult:
        scenario = self.scenario
        with tempfile.TemporaryDirectory(prefix="sparkgate-demo-") as tmp:
            workdir = Path(tmp)
            policy = workdir / "policy.yaml"
            policy.write_text(scenario.policy_yaml(self.spec))
            autoscaling = scenario.autoscaling
            with LocalSystem(
                policy,
                workdir,
                sparkgate=self.sparkgate,
                admission=self.admission,
                namespaces=(NAMESPACE,),
                allocator_tick=0.5,
                allocator_log_level="warning",
                allocator_lease=None,  # the allocator's own: a busy machine must not end the run's only one
                nodes=scenario.nodes,
                # Room for the drivers (0.1 CPU each) beside the executors of 1 CPU.
                node_cpu=f"{scenario.executors_per_node * 1000 + 100 * len(scenario.apps)}m",
                node_memory="1000Gi",
                start_delay=0.3,
                bookmark_interval=1.0,
                autoscaler=autoscaling.config() if autoscaling else None,
            ) as system:
                self.system = system
                return self._drive(system)

    @property
    def endpoints(self) -> dict[str, str]:
        if self.system is None or self.system.allocator is None:
            return {}
        out = {
            "allocator /apps": f"{self.system.allocator.url}/apps",
            "allocator /metrics": f"{self.system.allocator.url}/metrics",
        }
        if self.system.webhook is not None:
            out["webhook /metrics"] = f"{self.system.webhook.url}/metrics"
        return out

    def _drive(self, system: LocalSystem) -> RunResult:
        cluster = system.cluster
        cluster.requests.clear()
        attempts = cluster.scheduler.attempts
        scenario = self.scenario
        caps = Caps(scenario.max_pending_per_app, scenario.max_pending_cluster, scenario.max_pending_cluster)
        tracker = self.tracker = Tracker(self.clock(), self.clock, caps if self.sparkgate else None)
        unsubscribe = cluster.store.subscribe(tracker.on_change)
        for node in cluster.store.list_objects("nodes")[0]:
            tracker.node_changed("ADDED", node["metadata"]["name"], at=0.0)
        cluster.scheduler.reset_peak_pending()
        if cluster.autoscaler is not None:
            self.rounds_before = cluster.autoscaler.rounds
        waiting = sorted(scenario.apps, key=lambda a: a.submit_at)
        scale: list[tuple[float, AppState, int]] = []  # (when, app, executors): the drivers' later targets
        enders: list[threading.Thread] = []
        try:
            while not self._stop.is_set():
                now = tracker.now()
                while waiting and waiting[0].submit_at <= now:
                    spec = waiting.pop(0)
                    driver = cluster.spark_driver(
                        NAMESPACE,
                        spec.name,
                        executors=spec.executors,
                        batch_size=spec.spark_batch,
                        batch_delay=self.scenario.spark_batch_delay,
                        cpu="1",
                        memory="1Gi",
                        allocator=self.scenario.spark_allocator,
                        start=False,
                    )
                    state = tracker.register(spec, driver.app_id)
                    self.drivers[spec.name] = driver.start()
                    scale.extend((state.submitted + at, state, executors) for at, executors in spec.scale)
                while scale and min(at for at, _, _ in scale) <= now:
                    step = min(scale, key=lambda s: s[0])
                    scale.remove(step)
                    self.drivers[step[1].spec.name].scale_to(step[2])
                for state in list(tracker.apps.values()):
                    due = state.due(now)
                    if state.complete is None and due is not None and due <= now:
                        tracker.finish(state, due)
                        ender = threading.Thread(
                            target=self._end_app, args=(self.drivers[state.spec.name],), daemon=True
                        )
                        ender.start()
                        enders.append(ender)
                self.on_tick(self)
                done = not waiting and all(a.complete is not None for a in tracker.apps.values())
                if done or now >= self.duration:
                    break
                self._stop.wait(self.tick)
            for ender in enders:
                ender.join(timeout=15)
            seconds = tracker.now()
        finally:
            unsubscribe()
        by_who: Counter[str] = Counter()
        for entry in cluster.requests.entries():
            if entry.user == contract.ALLOCATOR_USER:
                by_who["sparkgate"] += 1
            elif entry.user == DRIVER_USER:
                by_who["spark drivers"] += 1
            else:
                by_who["other"] += 1
        with tracker.lock:
            apps = {a.spec.name: a.summary() for a in tracker.apps.values()}
            violations = list(tracker.checker.violations) if tracker.checker else []
            ends = [a.complete for a in tracker.apps.values() if a.complete is not None]
            complete = len(ends) == len(tracker.apps) > 0
        autoscaled = None
        if cluster.autoscaler is not None:
            plans = cluster.autoscaler.plans[self.rounds_before :]
            until = max(ends) if complete else seconds
            autoscaled = {
                "scale_up_rounds": len(plans),
                "nodes_added": [sum(to - before for before, to in plan.values()) for plan in plans],
                "peak_nodes": tracker.peak_nodes,
                # Until the last app completed (its nodes' unneeded time before a scale-down is not in it).
                "node_minutes": round(tracker.node_seconds(until) / 60, 2),
                "node_joins_s": [round(t, 2) for t in tracker.node_joins() if t > 0],
                "marked_while_held": tracker.marked_held,
                "provisioning_requests": len(tracker.requests),
                "provisioned_requests": len(tracker.provisioned),
            }
        return RunResult(
            self.spec,
            seconds,
            apps,
            tracker.peak_unscheduled,
            tracker.peak_gated,
            cluster.scheduler.attempts - attempts,
            by_who,
            tracker.bypassed if self.sparkgate else 0,
            self.endpoints,
            list(tracker.start_latencies),
            list(tracker.mark_latencies),
            cluster.scheduler.peak_pending,
            violations,
            autoscaled,
        )

    @staticmethod
    def _end_app(driver: SparkDriver) -> None:
        """The application is done: the driver stops requesting executors and its pod goes away (its
        executors and config maps with it, through their owner reference)."""
        driver.stop()
        driver.delete_driver_pod()
