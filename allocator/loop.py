"""The allocator's loop: take the apps that need a decision, decide for them, hand the actions to the actor.

Every watch event names the apps it touched and adds them to the work queue; the loop takes them at once
(a freed slot is refilled within milliseconds), again for an app when its batch delay ends (requeue-after),
and, every `tick`, every app (the rest of the time-based conditions). The actor carries out each app's
actions while the loop goes on deciding the others. Only the leader acts; followers keep their cache warm so
a hand-over is immediate. A leader that loses its lease stops before its next write. Deletions are
classified and recorded per app in the history store, persisted in batches.

Threading model (the parts are assembled in allocator/commands.py):
- reflector threads (one per watch) write the Cache (its lock) and, after releasing it, call the
  Controller's `on_gone` (its `_gone_lock`), the pod observers (Expectations, BindTimes: their own locks)
  and `on_change`, which adds apps to the WorkQueue (its lock);
- the loop thread (this module's `run`) is the only one that decides: it owns `memory`, `settings` and the
  in-flight counter, and publishes `memory` and `settings` to readers by replacing the dicts, never
  mutating a published one; it reads the Cache, Expectations and HistoryStore, writes the HistoryStore and
  flushes it (API calls, no lock held);
- actor threads carry out one app's actions each and, when done, report to Expectations, BindTimes, the
  HistoryStore and the WorkQueue (`done`);
- the leader thread renews the Lease and sets `lost_lease`; leader tasks (certificate rotation, ...) run
  in threads of their own;
- HTTP threads only read: Cache snapshots, the published dicts, HistoryStore views, WorkQueue backoffs,
  Health.
Every lock is a leaf: no code holds one lock while taking another or calling out, so there is no lock
order to respect (Cache._lock included).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.leader import LeaderElector
from sparkgate.policy_file import PolicySource

from .actor import Actor, AppResult
from .cache import Cache, Reflector
from .decision import AppSettings, InFlightCounts, decide
from .deletions import HistoryStore, classify
from .expectations import BindTimes, Expectations
from .health import Health
from .metrics import AllocatorMetrics
from .model import Action, AppMemory, AppView, DeletePod, PodRecord, Release, Snapshot
from .status import app_document, apps_document, observe_apps, observe_pacing
from .workqueue import WorkQueue

log = logging.getLogger(__name__)


@dataclass
class Options:
    install_namespace: str = contract.INSTALL_NAMESPACE
    identity: str = contract.ALLOCATOR_SERVICE_ACCOUNT
    lease_name: str = contract.ALLOCATOR_LEASE
    tick: float = 1.0
    history_flush: float = 2.0
    history_retention: float = 3600.0
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    watch_timeout: int = 240
    backoff_base: float = 0.05  # an app's first retry after a failed write; doubles per failure
    backoff_cap: float = 60.0
    stall_after: float = 300.0  # /healthz fails after a reflector or the loop made no progress this long


class Controller:
    def __init__(
        self,
        *,
        cache: Cache,
        reflectors: list[Reflector],
        queue: WorkQueue,
        expectations: Expectations,
        bind_times: BindTimes,
        histories: HistoryStore,
        actor: Actor,
        elector: LeaderElector,
        policy: PolicySource,
        metrics: AllocatorMetrics,
        health: Health,
        options: Options,
        stop: threading.Event,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache = cache
        self.reflectors = reflectors
        self.queue = queue
        self.expectations = expectations
        self.bind_times = bind_times
        self.histories = histories
        self.actor = actor
        self.elector = elector
        self.policy = policy
        self.metrics = metrics
        self.health = health
        self.options = options
        self.stop_event = stop
        self.clock = clock
        self.monotonic = monotonic
        self.lost_lease = threading.Event()
        self._gone_lock = threading.Lock()
        self._gone: list[tuple[PodRecord, bool, float]] = []
        # Owned by the loop thread; published by replacing the dicts (HTTP threads read them).
        self.memory: dict[AppKey, AppMemory] = {}
        self.settings: dict[AppKey, AppSettings] = {}
        self._in_flight = InFlightCounts()
        self._missing_sources: set[str] = set()

    # --- inputs (reflector and actor threads) -----------------------------------------------------------

    def on_change(self, apps: set[AppKey]) -> None:
        self.queue.add(apps)

    def on_gone(self, record: PodRecord, removed: bool) -> None:
        with self._gone_lock:
            self._gone.append((record, removed, self.clock()))

    def on_release(self, action: Release, at: float) -> None:
        self.bind_times.released(action.pod.uid, at)
        self.metrics.releases.labels(action.app.namespace).inc()
        if action.pod.created:
            self.metrics.gate_wait.labels(action.app.namespace).observe(max(0.0, at - action.pod.created))

    def on_delete(self, action: DeletePod) -> None:
        # Recorded with the decision's reason (id reuse, app finished) before the watch reports it.
        self.expectations.deleted(action.pod.uid)
        record = classify(action.pod, self.clock(), app_finishing=True)
        entry = type(record)(
            record.exec_id, record.pod, record.node, record.at, action.reason, record.exit_code, record.detail
        )
        if self.histories.record(action.app, action.pod.uid, entry):
            self.metrics.deletions.labels(action.app.namespace, action.reason.value).inc()

    # --- lifecycle -------------------------------------------------------------------------------------

    def lead(self) -> None:
        """The leader thread: renew the Lease every retry period; on losing it, stop the loop."""
        while not self.stop_event.is_set():
            was = self.elector.leading
            now = self.elector.try_acquire_or_renew()
            self.metrics.leader.set(1 if now else 0)
            if now and not was:
                self.metrics.leader_transitions.inc()
                self.queue.add(self.cache.snapshot().apps)
            if was and not now:
                self.lost_lease.set()
                self.queue.close()
                return
            self.stop_event.wait(self.options.retry_period)

    def shutdown(self) -> None:
        self.stop_event.set()
        self.queue.close()
        self.actor.close()
        if self.elector.leading:
            self.histories.flush()
        self.elector.release()
        self.metrics.leader.set(0)

    @property
    def ready(self) -> bool:
        """Every watch current, the deletion histories loaded, a policy in force."""
        return (
            all(r.synced for r in self.reflectors)
            and self.cache.is_synced
            and self.histories.loaded
            and self.policy.current() is not None
        )

    def run(self) -> None:
        """The loop; returns when stopped or when the lease is lost (the caller exits then)."""
        next_tick = self.monotonic()
        next_flush = self.monotonic() + self.options.history_flush
        while not self.stop_event.is_set() and not self.lost_lease.is_set():
            self.health.beat("loop")
            now = self.monotonic()
            if not self.histories.loaded and not self.histories.load():
                self.stop_event.wait(min(self.options.tick, 1.0))
                continue
            if not self.cache.is_synced:
                self.metrics.ready.set(0)
                self.stop_event.wait(min(self.options.tick, 0.1))
                continue
            if now >= next_tick:
                next_tick = now + self.options.tick
                self.queue.add(self.cache.snapshot().apps)
            keys = self.queue.get(max(0.0, min(next_tick, next_flush) - now))
            if self.lost_lease.is_set():
                return
            self.step(keys)
            if self.monotonic() >= next_flush:
                if self.elector.leading:
                    self.histories.flush()
                next_flush = self.monotonic() + self.options.history_flush

    def step(self, keys: set[AppKey]) -> None:
        """Decide for `keys` (taken from the queue: each is done here or when its actions are)."""
        self.metrics.ready.set(1 if self.cache.is_synced and all(r.synced for r in self.reflectors) else 0)
        with self._gone_lock:
            gone, self._gone = self._gone, []
        observed = self.cache.snapshot()
        self._record_gone(gone, observed)
        policy = self.policy.current()
        try:
            if policy is None or not self.elector.leading or not keys:
                for key in keys:
                    self.queue.done(key)
                return
            self._decide(keys, policy, self.expectations.apply(observed))
        finally:
            self._observe(observed, policy)

    def _decide(self, keys: set[AppKey], policy: Any, snapshot: Snapshot) -> None:
        started = time.perf_counter()
        decided_at = self.clock()
        decision = decide(
            snapshot,
            policy,
            decided_at,
            self.memory,
            keys,
            deleted_exec_ids=self.histories.deleted_exec_ids(),
            in_flight=self._in_flight,
        )
        self.metrics.decision_seconds.observe(time.perf_counter() - started)
        for key, error in decision.errors.items():
            log.error("deciding for %s failed (retried after its backoff): %s", key, error)
            self.metrics.decision_errors.inc()
        for key, at in decision.due.items():
            self.queue.add_after(key, at - decided_at)
        self.memory = {**self.memory, **decision.memory}
        self.settings = {**self.settings, **decision.settings}
        for scope, n in decision.limit_hits.items():
            self.metrics.limit_hits.labels(scope).inc(n)
        for key, mem in decision.memory.items():
            if mem.finished:
                self.histories.finished(key, decided_at)
        acting = {a.app for a in decision.actions}
        for key in keys - acting:
            self.queue.done(key, False if key in decision.errors else None)
        if self.lost_lease.is_set() or not self.elector.leading:
            for key in acting:
                self.queue.done(key)
            return
        self._dispatch(decision.actions)

    def _dispatch(self, actions: tuple[Action, ...]) -> None:
        """Hand the actions to the actor and go on: an app whose slot was just freed is decided and
        refilled while another app's batch of PATCHes is still being sent. Until its actions are done an
        app stays taken from the queue (not decided again; a change meanwhile is decided after), and its
        releases count as in flight from now (expectations), so that the shared budgets stay exact for the
        apps decided meanwhile."""
        releases: dict[AppKey, list[str]] = {}
        for action in actions:
            if isinstance(action, Release):
                releases.setdefault(action.app, []).append(action.pod.uid)
        self.expectations.released(uid for uids in releases.values() for uid in uids)
        for app, done in self.actor.submit(actions).items():
            done.add_done_callback(functools.partial(self._done, app, releases.get(app, [])))

    def _done(self, app: AppKey, releases: list[str], done: Future[AppResult]) -> None:
        error = done.exception()
        result = AppResult(ok=False) if error is not None else done.result()
        if error is not None:
            log.error("the actions of %s failed: %r", app, error)
            self.metrics.decision_errors.inc()
        self.expectations.failed(set(releases) - set(result.released))
        if not result.ok:
            self.metrics.write_failures.labels(app.namespace).inc()
        self.queue.done(app, result.outcome)

    def _record_gone(self, gone: list[tuple[PodRecord, bool, float]], snapshot: Snapshot) -> None:
        for record, _removed, at in gone:
            view = snapshot.apps.get(record.app)
            entry = classify(record, at, app_finishing=view is not None and view.finished)
            if self.histories.record(record.app, record.uid, entry):
                self.metrics.deletions.labels(record.namespace, entry.reason.value).inc()

    def _observe(self, snapshot: Snapshot, policy: Any) -> None:
        observe_apps(self.metrics, snapshot)
        observe_pacing(self.metrics, self.memory, set(snapshot.apps))
        self.metrics.limit.labels("namespace").set(policy.max_pending_per_namespace if policy else 0)
        self.metrics.limit.labels("cluster").set(policy.max_pending_cluster if policy else 0)
        live = set(snapshot.apps)
        self.queue.forget(live)
        backoff = self.queue.failures()
        self.metrics.apps_backing_off.set(sum(1 for _, left in backoff.values() if left > 0))
        self.metrics.history_unsaved.set(self.histories.unsaved())
        missing: dict[str, int] = {}
        for key, settings in self.settings.items():
            if settings.waiting_for and settings.waiting_for.startswith("source ConfigMap") and key in live:
                source = settings.waiting_for.split()[2]
                missing[source] = missing.get(source, 0) + 1
        for source in self._missing_sources - missing.keys():
            self.metrics.missing_sources.labels(source).set(0)
        for source, n in missing.items():
            self.metrics.missing_sources.labels(source).set(n)
        self._missing_sources |= missing.keys()
        keep = live | self.histories.keys()
        if len(self.memory) > len(keep):
            self.memory = {k: m for k, m in self.memory.items() if k in keep}
            self.settings = {k: s for k, s in self.settings.items() if k in keep}

    # --- status (HTTP threads) ---------------------------------------------------------------------------

    def apps(self) -> dict[str, Any]:
        policy = self.policy.current()
        limits = (
            {"cluster": policy.max_pending_cluster, "namespace": policy.max_pending_per_namespace}
            if policy
            else {}
        )
        snapshot = self.cache.snapshot()
        histories = {k: h for k in snapshot.apps if (h := self.histories.view(k)) is not None}
        document = apps_document(
            snapshot, self.settings, self.memory, histories, limits, self.queue.failures()
        )
        document["leader"] = self.elector.leading
        document["identity"] = self.options.identity
        return document

    def app(self, namespace: str, app_id: str) -> dict[str, Any] | None:
        key = AppKey(namespace, app_id)
        view = self.cache.snapshot().apps.get(key)
        history = self.histories.view(key)
        if view is None:
            if history is None:
                return None
            view = AppView(key, (), None, True, frozenset())
        return app_document(
            view, self.settings.get(key), self.memory.get(key), history, self.queue.failures().get(key)
        )
