"""The allocator's loop: take the apps that need a decision, decide for them, hand the actions to the actor.

Every watch event names the apps it touched and adds them to the work queue; the loop takes them at once
(a freed slot is refilled within milliseconds), again for an app when its batch delay ends (requeue-after),
for an app held by a namespace or the cluster budget as soon as pods of other apps leave flight (`_wake`),
and, every `tick`, every other app that has gated pods (the rest of the time-based conditions). A step's work is
per app taken (at most `step_apps` of them), whatever the cluster's size: the snapshot, the expectations and
the budgets are kept up to date per changed app, and the gauges are computed when Prometheus scrapes
(status.py `AppsCollector`), not per step. The tick also does what is per cluster: the registry's look at
every app (the client-mode grace), dropping what is kept of apps that are gone. The actor carries out each app's
actions while the loop goes on deciding the others. Only the leader acts and records deletions; followers
keep their cache warm so a hand-over is immediate, and work out the settings in force (for /apps) without
acting or remembering (but the lines of held apps, which spare their ticks as the leader's); a replica that becomes the leader reads the histories again first. A leader that
loses its lease stops before its next write. Deletions are classified and recorded per app in the history
store, persisted in batches. The registry (registry.py) says when an app is over; `end` then removes what
is kept of it.

Threading model (the parts are assembled in allocator/commands.py):
- reflector threads (one per watch) write the Cache (its lock) and, after releasing it, call the
  Controller's `on_gone` (its `_gone_lock`), the pod observers (Expectations, BindTimes: their own locks)
  and `on_change`, which adds apps to the WorkQueue (its lock);
- the loop thread (this module's `run`) is the only one that decides: it owns `memory`, `settings`, the
  registry and the lines of apps held by a shared budget (`_waiting`, `_held`, `_last_in_flight`); it
  changes `memory` and `settings` under `_published` (HTTP threads copy them under it) and publishes
  `ended` (the registry's ended apps, read by actor and HTTP threads) by replacing the dict; it reads the
  Cache, Expectations and HistoryStore and writes the HistoryStore;
- the histories thread (`_flush_histories`, started by `run`) saves the HistoryStore's changed histories
  every `history_flush` seconds while leading (API calls, off the loop thread);
- actor threads carry out one app's actions each and, when done, report to Expectations, BindTimes, the
  HistoryStore and the WorkQueue (`done`);
- the leader thread renews the Lease and sets `lost_lease`, and gives the Lease up when `shutdown` resigns
  (the one thread that drives the elector); leader tasks (certificate rotation, ...) run in threads of
  their own;
- HTTP threads only read (`/apps`, and `/metrics` through the collector): Cache snapshots, copies of
  the published dicts, HistoryStore views, WorkQueue backoffs, Health.
Every lock is a leaf: no code holds one lock while taking another or calling out, so there is no lock
order to respect (Cache._lock included), but HistoryStore's `_flushing`: only flushes take it, always
first, and hold it through their writes.

Clocks (model.py `Now`): `monotonic` for every duration the loop measures (decisions, their `due` times, the
tick, the registry's grace, the namespaces' series); `clock`, the wall clock, only for what meets the API's
timestamps or is shown to users: when a pod went and when an app ended (the deletion histories), the
conversion of pods' creationTimestamps in a rebuilt memory, /apps' times. A step of the wall clock (NTP, a
VM resumed) moves no decision.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import ChainMap, Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.kube import Reflector
from sparkgate.leader import LeaderElector
from sparkgate.policy import Policy
from sparkgate.policy_file import PolicySource

from .actor import Actor, AppResult
from .cache import Cache
from .decision import AppSettings, decide, rebuilt_memory
from .deletions import EXECUTOR_IDS, HistoryStore, classify
from .expectations import BindTimes, Expectations
from .health import Health
from .metrics import AllocatorMetrics
from .model import Action, AppMemory, AppView, DeletePod, Now, PodRecord, Release, Snapshot
from .registry import AppRegistry
from .status import AppsCollector, Status, app_document, apps_document
from .workqueue import WorkQueue

log = logging.getLogger(__name__)


@dataclass
class Options:
    install_namespace: str = contract.INSTALL_NAMESPACE
    identity: str = contract.ALLOCATOR_SERVICE_ACCOUNT
    lease_name: str = contract.ALLOCATOR_LEASE
    tick: float = 1.0
    # Apps decided at most per step: a tick's or a burst's apps take several steps. A decision at 100,000 pods
    # is ~120-140 µs of CPU per app; with 128, a run whose steps coalesced ~39 events each had steps of 65
    # apps at p99, 7.8 ms (bench/scale.py, 2026-11-26), and with 32 and the batch period (below), whose
    # steps take 32 apps at p99, 4.8 ms: above or at the 5 ms target. 16 bounds a step near 2.5 ms.
    step_apps: int = 16
    # How long an app's decision waits after the first watch event that changed it, so that the events of a
    # burst (a batch of executors created, their binds, their kubelets' updates) are decided once, as
    # kube-controller-manager's job controller batches a Job's pod updates (1 s there). 5 ms: the loop
    # decided per ~3.5 events and now per ~20-30, its CPU per event 64-83 -> 20-35 µs and the allocator's
    # ~210 -> 103-131 µs at 1,000 to 100,000 pods (bench/scale.py), and 5 ms is small beside a bind's
    # latency (the refill benchmark's p50 stayed 7-11 ms).
    batch_period: float = 0.005
    history_flush: float = 2.0
    history_retention: float = 3600.0
    client_grace: float = 300.0  # a client-mode app with no sign of life this long is over (registry.py)
    history_executor_ids: int = EXECUTOR_IDS  # deleted executor ids kept per app history (deletions.py)
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    watch_timeout: int = 240
    backoff_base: float = 0.05  # an app's first retry after a failed write; doubles per failure
    backoff_cap: float = 60.0
    stall_after: float = 300.0  # /healthz fails after a reflector or the loop made no progress this long
    # The API server serves ProvisioningRequests (discovery at the start: commands.py `provisioning_served`);
    # without it a `provisioning` class is not used, the held pods are marked instead (demand.py).
    provisioning_served: bool = False


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
        self.clock = clock  # wall: only against the API's timestamps and for users (module docstring)
        self.monotonic = monotonic  # every duration
        self.lost_lease = threading.Event()
        self.resign = threading.Event()  # shutdown's word to the leader thread: give the Lease up and end
        self._leader_thread: threading.Thread | None = None  # the one that drives the elector (`lead`)
        self._gone_lock = threading.Lock()
        self._gone: list[tuple[PodRecord, bool, float]] = []
        # Owned by the loop thread; changed under `_published`, which readers (HTTP threads) copy them under.
        self._published = threading.Lock()  # memory and settings: changed by the loop, copied by readers
        self.memory: dict[AppKey, AppMemory] = {}
        self.settings: dict[AppKey, AppSettings] = {}
        # Owned by the loop thread. `ended` is the registry's, published (replaced, never mutated) for HTTP.
        self.registry = AppRegistry(options.client_grace)
        self.ended: dict[AppKey, float] = {}
        self._ended_version = self.registry.version
        # Owned by the loop thread: the apps held by a shared budget ({app: "namespace" | "cluster"}, from the
        # last decision's settings) and the in-flight sums of the last step, to wake them when room frees.
        self._waiting: dict[str, dict[AppKey, None]] = {}  # namespace ("": the cluster) -> its line
        self._held: dict[AppKey, str] = {}  # app -> the line it is in
        self._last_in_flight: Counter[str] = Counter()
        self._tick_policy: Policy | None = None  # the policy at the last tick (a change queues the held apps)
        self._histories_current = False  # the histories were read from the cluster since this replica leads
        metrics.tracked = AppsCollector(self.status).exposition
        metrics.leader.set_function(lambda: 1.0 if elector.leading else 0.0)  # the rule, at each scrape

    # --- inputs (reflector and actor threads) -----------------------------------------------------------

    def on_change(self, apps: set[AppKey]) -> None:
        self.queue.add(apps, self.options.batch_period)

    def on_gone(self, record: PodRecord, removed: bool) -> None:
        with self._gone_lock:
            self._gone.append((record, removed, self.clock()))

    def on_release(self, action: Release, at: float) -> None:
        with self.metrics.in_namespace(action.app.namespace):
            self.metrics.releases.labels(action.app.namespace).inc()
            if action.pod.created:
                self.metrics.gate_wait.labels(action.app.namespace).observe(max(0.0, at - action.pod.created))

    def on_delete(self, action: DeletePod) -> None:
        # Recorded with the decision's reason (id reuse, app finished) before the watch reports it.
        self.expectations.deleted(action.app, action.pod.uid)
        record = classify(action.pod, self.clock(), app_finishing=True)
        entry = type(record)(
            record.exec_id, record.pod, record.node, record.at, action.reason, record.exit_code, record.detail
        )
        if self.histories.record(action.app, action.pod.uid, entry, ended_at=self.ended.get(action.app)):
            with self.metrics.in_namespace(action.app.namespace):
                self.metrics.deletions.labels(action.app.namespace, action.reason.value).inc()

    # --- lifecycle -------------------------------------------------------------------------------------

    def lead(self) -> None:
        """The leader thread (sparkgate/leader.py `campaign`): a turn of the Lease every retry period, each
        a beat for /healthz; on losing the lease, stop the loop. It runs until `shutdown` resigns, not until
        the loop stops, so that the Lease stays held through shutdown's last writes; then this thread, which
        owns the elector, gives the Lease up (a release sent from another thread beside a renew lost to it:
        409, and the follower waited a whole lease)."""

        def turned(leading: bool) -> None:
            self.health.beat("leader")

        def started() -> None:
            self.metrics.leader_transitions.inc()
            self.queue.add(self.cache.snapshot().apps)

        def lost() -> None:
            self.lost_lease.set()
            self.queue.close()

        self._leader_thread = threading.current_thread()
        self.elector.campaign(self.resign, on_turn=turned, on_started=started, on_lost=lost)

    def shutdown(self) -> None:
        """Stop deciding and writing, save the histories while the Lease is still held, then have the leader
        thread give the Lease up (or give it up here when no leader thread runs)."""
        self.stop_event.set()
        self.queue.close()
        self.actor.close()
        if self.elector.leading:
            self.histories.flush()
        self.resign.set()
        thread = self._leader_thread
        if thread is not None and thread is not threading.current_thread():
            # Its turn in progress ends within the renew deadline, its release in as long again.
            thread.join(timeout=2 * self.options.renew_deadline)
        else:
            self.elector.release()

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
        flusher = threading.Thread(target=self._flush_histories, name="histories", daemon=True)
        flusher.start()
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
                self.tick()
            keys = self.queue.get(max(0.0, next_tick - now), limit=self.options.step_apps)
            if self.lost_lease.is_set():
                return
            self.step(keys)

    def _flush_histories(self) -> None:
        """The histories thread (started by `run`, ends with it): what changed is saved every `history_flush`
        seconds while this replica leads. Not in the loop thread: a flush is a write per app whose history
        changed, thousands of them when a busy cluster's apps end together, and the loop would wait for each
        one before deciding again (89 ms a flush on average at 100,000 pods with writes answered in process:
        bench/scale.py). An unexpected exception of a flush (a bug) is logged with its traceback and counted as
        a failed write, and the next flush tries again: the thread never ends before the loop, which would
        leave every later history unsaved with nothing to show it but `history_unsaved`."""
        while not self.stop_event.wait(self.options.history_flush) and not self.lost_lease.is_set():
            if self.elector.leading:
                try:
                    self.histories.flush()
                except Exception:
                    log.exception("saving the deletion histories failed; trying again at the next flush")
                    self.metrics.history_write_failures.inc()

    def step(self, keys: set[AppKey]) -> None:
        """Decide for `keys` (taken from the queue: each is done here or when its actions are)."""
        self.metrics.ready.set(1 if self.cache.is_synced and all(r.synced for r in self.reflectors) else 0)
        pending = self.expectations.pending()  # before the snapshot (Expectations.pending says why)
        observed = self._snapshot(track=True)
        leading = self.elector.leading
        self._observe(observed, keys)
        policy = self.policy.current()
        if not leading:
            self._histories_current = False
        # A new leader reads the histories at its first step, whether or not an app changed: it is the one
        # that sets a corrupt one aside (a replica's read at its start may come before it leads).
        current = not leading or self._read_histories(observed)
        if policy is None or not keys or not current:
            for key in keys:
                self.queue.done(key)
            return
        if not leading:
            self._settle(keys, policy, observed)
            return
        expected = self.expectations.apply(observed, pending)
        self._wake(expected, policy)
        self._decide(keys, policy, expected)

    def _wake(self, snapshot: Snapshot, policy: Policy) -> None:
        """Queue the apps held by a namespace or the cluster budget when pods left flight since the last step
        (bound, started or deleted) and that budget has room now: the first to wait there first, as many as
        there is room for. Without this they would wait for the tick. Its cost is per namespace in flight and
        per app woken, not per app waiting."""
        now_in_flight = snapshot.in_flight_by_namespace()
        last, self._last_in_flight = self._last_in_flight, Counter(now_in_flight)  # + this step's releases
        if not self._held:
            return
        total = sum(now_in_flight.values())
        room = policy.max_pending_cluster - total
        if room <= 0:
            return
        woken: list[AppKey] = []
        if "" in self._waiting and total < sum(last.values()):
            woken.extend(self._first(self._waiting[""], room, snapshot))
        for namespace, before in last.items():
            now = now_in_flight.get(namespace, 0)
            if now < before and now < policy.max_pending_per_namespace and namespace in self._waiting:
                free = min(room, policy.max_pending_per_namespace - now)
                woken.extend(self._first(self._waiting[namespace], free, snapshot))
        if woken:
            self.queue.add(woken)

    @staticmethod
    def _first(line: dict[AppKey, None], room: int, snapshot: Snapshot) -> list[AppKey]:
        """The first apps of a line whose gated pods can fill `room` places: not one app per place, as each
        app woken for a place the one before it took is a decision for nothing."""
        woken: list[AppKey] = []
        for key in line:
            if room <= 0:
                break
            woken.append(key)
            view = snapshot.apps.get(key)
            room -= max(1, view.counts.gated) if view is not None else 1
        return woken

    def _hold(self, key: AppKey, scope: str | None) -> None:
        """Where the last decision says the app waits: in the line of its namespace's budget or the cluster's
        (""; no namespace has that name), kept in the order the apps joined it, or in none."""
        where = key.namespace if scope == "namespace" else "" if scope == "cluster" else None
        old = self._held.get(key)
        if old == where:
            return  # still waiting there: its place in the line is kept
        if old is not None:
            line = self._waiting[old]
            del line[key]
            if not line:
                del self._waiting[old]
            del self._held[key]
        if where is not None:
            self._waiting.setdefault(where, {})[key] = None
            self._held[key] = where

    def tick(self) -> None:
        """Every `tick`: what is per cluster. The registry looks at every app (the client-mode grace ends
        apps that show no change); every app with gated pods is queued (the time-based conditions), but those
        in the line of a namespace's or the cluster's budget: `_wake` queues them when pods leave flight,
        their decision when their Waiting Event is due and every HELD_RECHECK_SECONDS (decision.py), and the
        tick after a policy change (its limits may have changed); what is kept of apps that are gone goes.
        Deciding every held app each second was most of the loop's work on a large cluster whose budget
        binds: 5,000 apps at 100,000 pods, ~0.9 decisions per watch event, nearly all finding no room
        (bench/scale.py)."""
        policy = self.policy.current()
        held, self._tick_policy = (self._held if policy is self._tick_policy else {}), policy
        observed = self._snapshot()
        self._observe(observed, None)
        live = {key for key in observed.apps if key not in self.ended}
        self.queue.forget(set(observed.apps))
        # Ended apps' namespaces too: their pods are still counted (deletions, removals) until they go.
        self.metrics.forget_namespaces({key.namespace for key in observed.apps}, self.monotonic())
        for key in self._held.keys() - live:
            self._hold(key, None)
        if len(self.memory) > len(live) or len(self.settings) > len(live):
            with self._published:
                for table in (self.memory, self.settings):
                    for key in table.keys() - live:
                        del table[key]
        self.queue.add(key for key, view in observed.apps.items() if view.counts.gated and key not in held)

    def _snapshot(self, *, track: bool = False) -> Snapshot:
        """The cache's snapshot, the pods gone until then recorded first (the leader's: a follower keeps no
        history of its own, it reads the leader's when it takes over), while the registry still says
        whether their app is over. `track`: the step's (Cache.snapshot)."""
        with self._gone_lock:
            gone, self._gone = self._gone, []
        observed = self.cache.snapshot(track=track)
        if self.elector.leading:
            self._record_gone(gone, observed)
        return observed

    def now(self) -> Now:
        """One reading of both clocks."""
        return Now(self.monotonic(), self.clock())

    def _observe(self, observed: Snapshot, keys: set[AppKey] | None) -> None:
        """The registry's look at `keys` (None: every app), with the last decisions' settings (what holds
        each app); the apps it says are over are ended."""
        now = self.now()
        for key in self.registry.observe(observed, now, keys, self.settings):
            view = observed.apps.get(key)
            self.end(key, now, client=view is None or not view.driver_seen)
        revived = self.registry.take_revived()
        if self.elector.leading:
            for key in revived:
                self.histories.unfinished_again(key)
            if keys is None:
                self._finish_histories(observed, now.wall)  # the tick's look at every app
        if self._ended_version != self.registry.version:
            self.ended, self._ended_version = dict(self.registry.ended), self.registry.version

    def end(self, key: AppKey, now: Now, *, client: bool) -> None:
        """The end of an app's life (registry.py says when): everything sparkgate keeps of it goes. Its
        memory, settings and per-app metric series now (a client-mode app's place in line is kept a while by
        the registry, in case it lives again); its gated pods, refused pods and config-map copies by its next
        decisions (the leader's, queued here; `decide` is told the app is over); its history is finished and
        expires after the retention; its queue and backoff entries and its cache view when the cluster holds
        nothing of it any more. Loop thread."""
        log.info("application %s is over (%s mode)", key, "client" if client else "cluster")
        self.metrics.apps_ended.labels("client" if client else "cluster").inc()
        if self.elector.leading:
            self.histories.finished(key, now.wall)
        with self._published:
            memory = self.memory.pop(key, None)
            self.settings.pop(key, None)
        if client and memory is not None:
            self.registry.keep_place(key, memory.waiting_since, now.monotonic)
        self._hold(key, None)
        self.queue.add({key})

    def _read_histories(self, snapshot: Snapshot) -> bool:
        """A new leader reads the histories its predecessor saved (its own view of them is the one of its
        start): False while the API fails (nothing is decided meanwhile). It finishes those nothing else
        will (`_finish_histories`): its predecessor may not have seen their apps end."""
        if not self._histories_current:
            self._histories_current = self.histories.load()
            if self._histories_current:
                self._finish_histories(snapshot, self.clock())
        return self._histories_current

    def _finish_histories(self, snapshot: Snapshot, now: float) -> None:
        """The one rule for a history that nothing else would finish, so that it expires after the retention:
        its app is over, or the cluster holds nothing of it and the registry does not follow it (its pods came
        and went between two looks). An app the registry follows is finished by its end (`end`). Leader
        only; at a new leader's read of the histories and at each tick."""
        ended = self.registry.ended
        for key in self.histories.unfinished():
            if key in ended or (key not in snapshot.apps and not self.registry.tracks(key)):
                self.histories.finished(key, ended.get(key, now))

    def _settle(self, keys: set[AppKey], policy: Any, snapshot: Snapshot) -> None:
        """A follower's decision: the settings in force (for /apps and `sparkgate status`), from memory
        rebuilt from the cluster; nothing is done or remembered but when to look again (`due`) and the lines
        of the apps a shared budget holds, which the tick leaves out as the leader's does: deciding every
        held app at each tick cost a follower of a 100,000-pod cluster ~5,000 decisions a second."""
        now = self.monotonic()
        ended = self.registry.ended  # keys - ended.keys() would walk every ended app: per app decided only
        decision = decide(
            snapshot,
            policy,
            now,
            {},
            {k for k in keys if k not in ended},
            provisioning_served=self.options.provisioning_served,
        )
        with self._published:
            self.settings.update(decision.settings)
        for key, settings in decision.settings.items():
            self._hold(key, settings.waiting_on)
        for key, at in decision.due.items():
            self.queue.add_after(key, at - now)
        for key in keys:
            self.queue.done(key)

    def _decide(self, keys: set[AppKey], policy: Any, snapshot: Snapshot) -> None:
        started = time.perf_counter()
        now = self.now()
        decided_at = now.monotonic
        memory = self.memory
        # Not `keys - memory.keys()`: a set minus a dict's keys walks every key of the dict (130 µs at 5,000 apps).
        fresh = {
            k: self._rebuilt(snapshot.apps[k], now) for k in keys if k not in memory and k in snapshot.apps
        }
        decision = decide(
            snapshot,
            policy,
            decided_at,
            ChainMap(fresh, memory) if fresh else memory,
            keys,
            deleted_exec_ids=self.histories.deleted_exec_ids(keys),
            ended=self.registry.ended.keys(),
            provisioning_served=self.options.provisioning_served,
        )
        self.metrics.decision_seconds.observe(time.perf_counter() - started)
        for key, error in decision.errors.items():
            log.error("deciding for %s failed (retried after its backoff): %s", key, error)
            self.metrics.decision_errors.inc()
        for key, at in decision.due.items():
            self.queue.add_after(key, at - decided_at)
        ended = self.registry.ended
        with self._published:
            self.memory.update((k, m) for k, m in decision.memory.items() if k not in ended)
            self.settings.update(decision.settings)
        for key, settings in decision.settings.items():
            self._hold(key, settings.waiting_on)
        for scope, n in decision.limit_hits.items():
            self.metrics.limit_hits.labels(scope).inc(n)
        acting = {a.app for a in decision.actions}
        for key in keys - acting:
            self.queue.done(key, False if key in decision.errors else None)
        if self.lost_lease.is_set() or not self.elector.leading:
            for key in acting:
                self.queue.done(key)
            return
        self._dispatch(decision.actions)

    def _rebuilt(self, view: AppView, now: Now) -> AppMemory:
        """The memory of an app the leader has none of (decision.py `rebuilt_memory`): a new app, every app
        after a fail-over, an ended app decided again (to delete its pods) or one that lives again, which
        takes back its kept place in line."""
        registry = self.registry
        place = None if view.key in registry.ended else registry.place(view.key)
        return rebuilt_memory(view, now, place=place, seen=registry.seen(view.key))

    def _dispatch(self, actions: tuple[Action, ...]) -> None:
        """Hand the actions to the actor and go on: an app whose slot was just freed is decided and
        refilled while another app's batch of PATCHes is still being sent. Until its actions are done an
        app stays taken from the queue (not decided again; a change meanwhile is decided after), and its
        releases count as in flight from now (expectations), so that the shared budgets stay exact for the
        apps decided meanwhile."""
        releases: dict[AppKey, list[Release]] = {}
        for action in actions:
            if isinstance(action, Release):
                releases.setdefault(action.app, []).append(action)
        self.expectations.released(r for rs in releases.values() for r in rs)
        for app, rs in releases.items():
            self._last_in_flight[app.namespace] += len(rs)
        for app, done in self.actor.submit(actions).items():
            uids = [r.pod.uid for r in releases.get(app, [])]
            done.add_done_callback(functools.partial(self._done, app, uids))

    def _done(self, app: AppKey, releases: list[str], done: Future[AppResult]) -> None:
        """An app's actions are over (an actor thread): each release's answer to the expectations (an
        unclear one stays counted until the watch says), the app back to the queue."""
        error = done.exception()
        if error is not None:  # the actor's `_app` itself failed: which releases went out is not known
            log.error("the actions of %s failed: %r", app, error)
            self.metrics.decision_errors.inc()
            result = AppResult(ok=False, unclear=releases)
        else:
            result = done.result()
        answered = {*result.released, *result.unclear}
        self.expectations.answered(
            released=result.released,
            unclear=result.unclear,
            failed=[uid for uid in releases if uid not in answered],
        )
        if not result.ok:
            with self.metrics.in_namespace(app.namespace):
                self.metrics.write_failures.labels(app.namespace).inc()
        self.queue.done(app, result.outcome)

    def _record_gone(self, gone: list[tuple[PodRecord, bool, float]], snapshot: Snapshot) -> None:
        for record, _removed, at in gone:
            view = snapshot.apps.get(record.app)
            over = self.registry.ended.get(record.app)
            entry = classify(
                record, at, app_finishing=over is not None or (view is not None and view.finished)
            )
            if self.histories.record(record.app, record.uid, entry, ended_at=over):
                with self.metrics.in_namespace(record.namespace):
                    self.metrics.deletions.labels(record.namespace, entry.reason.value).inc()

    def _visible(self, snapshot: Snapshot) -> Snapshot:
        """The apps that are not over (what /apps and the metrics show)."""
        ended = self.ended
        if not ended:
            return snapshot
        return Snapshot({k: v for k, v in snapshot.apps.items() if k not in ended}, snapshot.sources)

    # --- status (HTTP threads) ---------------------------------------------------------------------------

    def status(self) -> Status:
        """What /apps and the gauges show, taken at once: the apps that are not over, and copies of the
        loop's settings and memory."""
        policy = self.policy.current()
        with self._published:
            settings, memory = dict(self.settings), dict(self.memory)
        return Status(
            self._visible(self.cache.snapshot()),
            settings,
            memory,
            {"cluster": policy.max_pending_cluster, "namespace": policy.max_pending_per_namespace}
            if policy
            else {},
            self.queue.failures(),
            self.histories.unsaved(),
            self.histories.count(),
            policy.is_excluded if policy else lambda namespace: False,
        )

    def apps(self) -> dict[str, Any]:
        status = self.status()
        histories = {k: h for k in status.snapshot.apps if (h := self.histories.view(k)) is not None}
        document = apps_document(
            status.snapshot,
            status.settings,
            status.memory,
            histories,
            status.limits,
            status.backoff,
            status.excluded,
            now=self.now(),
        )
        document["leader"] = self.elector.leading
        document["identity"] = self.options.identity
        # Whether a `provisioning` class of the policy can be used (provisioning.py): said by `sparkgate status`.
        policy = self.policy.current()
        asked = policy is not None and any(
            a.provisioning != "none"
            for a in (policy.allocation, *(policy.allocation_for(p, {})[0] for p in policy.profiles))
        )
        document["provisioningRequests"] = (
            "served" if self.options.provisioning_served else "not served" if asked else "not used"
        )
        return document

    def app(self, namespace: str, app_id: str) -> dict[str, Any] | None:
        key = AppKey(namespace, app_id)
        view = self._visible(self.cache.snapshot()).apps.get(key)
        history = self.histories.view(key)
        if view is None:  # over (or unknown): what is left of it is its history, until it expires
            if history is None:
                return None
            return app_document(
                AppView(key, (), None, True, frozenset()),
                None,
                AppMemory(finished=True),
                history,
                now=self.now(),
            )
        with self._published:
            settings, memory = self.settings.get(key), self.memory.get(key)
        policy = self.policy.current()
        excluded = policy is not None and policy.is_excluded(namespace)
        return app_document(
            view, settings, memory, history, self.queue.failures().get(key), excluded, now=self.now()
        )
