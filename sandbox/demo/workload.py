"""One run of a scenario on kubesim, with or without sparkgate, and what it measured.

Measurement is exact and in-process: a store listener sees every committed change of an executor pod in
order (no polling, no watch latency), so the peak of unscheduled pods is the true peak, and an app's work
is integrated over the moments its running executors change.
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
from sandbox.localsystem import LocalSystem
from sparkgate import contract

from .scenarios import AppSpec, Scenario

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


@dataclass
class _Pod:
    app: str
    gated: bool
    bound: bool
    running: bool
    pending: bool  # Pending and not being deleted


class Tracker:
    """Per-app and cluster counts from the store's committed changes, and the peaks."""

    def __init__(self, started: float, clock: Callable[[], float]) -> None:
        self.started = started
        self.clock = clock
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

    def now(self) -> float:
        return self.clock() - self.started

    def register(self, spec: AppSpec, app_id: str) -> AppState:
        with self.lock:
            state = AppState(spec, app_id, self.now())
            state.since = state.submitted
            self.apps[app_id] = state
            return state

    def on_change(self, kind: str, resource: str, obj: dict[str, Any]) -> None:
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
            old = self.pods.pop(uid, None)
            if old is None and new is not None:
                self.created[uid] = now
                if new.app in self.apps:
                    self.apps[new.app].last_created = now
            if new is not None and new.running and (created := self.created.pop(uid, None)) is not None:
                self.start_latencies.append(now - created)
            elif new is None:
                self.created.pop(uid, None)
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
                target = app.spec.scale_to[1] if app.spec.scale_to else app.spec.executors
                if app.all_running is None and app.running >= target:
                    app.all_running = now

    def finish(self, app: AppState, at: float) -> None:
        with self.lock:
            app.work_done = app.work_at(at)
            app.complete = at


@dataclass
class RunResult:
    sparkgate: bool
    seconds: float
    apps: dict[str, dict[str, Any]]
    peak_unscheduled: int
    peak_gated: int
    scheduling_attempts: int
    api_requests: Counter[str] = field(default_factory=Counter)  # by who: drivers, sparkgate, other
    bypassed: int = 0
    endpoints: dict[str, str] = field(default_factory=dict)
    start_latencies: list[float] = field(default_factory=list)  # each executor's creation -> first Running

    @property
    def complete(self) -> bool:
        return all(a["complete_after_s"] is not None for a in self.apps.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "sparkgate": self.sparkgate,
            "seconds": round(self.seconds, 2),
            "complete": self.complete,
            "peak_unscheduled_executor_pods": self.peak_unscheduled,
            "peak_gated_executor_pods": self.peak_gated,
            "scheduling_attempts": self.scheduling_attempts,
            "api_requests": dict(self.api_requests),
            "bypassed_pods": self.bypassed,
            "executor_start_s": [round(x, 3) for x in self.start_latencies],  # creation -> first Running
            "apps": self.apps,
        }


class Run:
    """Drives one run: submits the drivers on time, scales them, ends each app when its work is done."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        sparkgate: bool,
        duration: float,
        admission: str = "webhook",
        on_tick: Callable[[Run], None] = lambda run: None,
        tick: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scenario = scenario
        self.sparkgate = sparkgate
        self.duration = duration
        self.admission = admission
        self.on_tick = on_tick
        self.tick = tick
        self.clock = clock
        self.tracker = Tracker(clock(), clock)
        self.system: LocalSystem | None = None
        self.drivers: dict[str, SparkDriver] = {}
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def execute(self) -> RunResult:
        scenario = self.scenario
        with tempfile.TemporaryDirectory(prefix="sparkgate-demo-") as tmp:
            workdir = Path(tmp)
            policy = workdir / "policy.yaml"
            policy.write_text(scenario.policy_yaml())
            with LocalSystem(
                policy,
                workdir,
                sparkgate=self.sparkgate,
                admission=self.admission,
                namespaces=(NAMESPACE,),
                allocator_tick=0.5,
                allocator_log_level="warning",
                nodes=scenario.nodes,
                # Room for the drivers (0.1 CPU each) beside the executors of 1 CPU.
                node_cpu=f"{scenario.executors_per_node * 1000 + 100 * len(scenario.apps)}m",
                node_memory="1000Gi",
                start_delay=0.3,
                bookmark_interval=1.0,
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
        tracker = self.tracker = Tracker(self.clock(), self.clock)
        unsubscribe = cluster.store.subscribe(tracker.on_change)
        waiting = sorted(self.scenario.apps, key=lambda a: a.submit_at)
        scale_downs: list[tuple[float, AppState]] = []
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
                    if spec.scale_to:
                        scale_downs.append((state.submitted + spec.scale_to[0], state))
                for at, state in list(scale_downs):
                    if at <= now and state.spec.scale_to:
                        self.drivers[state.spec.name].scale_to(state.spec.scale_to[1])
                        scale_downs.remove((at, state))
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
        return RunResult(
            self.sparkgate,
            seconds,
            apps,
            tracker.peak_unscheduled,
            tracker.peak_gated,
            cluster.scheduler.attempts - attempts,
            by_who,
            tracker.bypassed if self.sparkgate else 0,
            self.endpoints,
            list(tracker.start_latencies),
        )

    @staticmethod
    def _end_app(driver: SparkDriver) -> None:
        """The application is done: the driver stops requesting executors and its pod goes away (its
        executors and config maps with it, through their owner reference)."""
        driver.stop()
        driver.delete_driver_pod()
