"""The allocator controller: reflectors feed the cache, the loop decides and acts, one leader writes.

Every watch event names the apps it touched; the loop wakes at once, decides for just those apps (a freed
slot is refilled within milliseconds), again for an app when its batch delay ends, and, every `tick`, for
all of them (the rest of the time-based conditions). The actor carries out each app's actions while the
loop goes on deciding the others. Only the leader acts; followers keep their cache warm so a hand-over is
immediate. A leader that loses its lease stops before its next write. Deletions are classified and
recorded per app, and the histories are persisted in batches to ConfigMaps in the install namespace, so a
restarted allocator knows which executor ids were deleted (and never releases them again).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.kube import Kube, KubeError, NotFound
from sparkgate.policy_file import PolicySource

from .actor import Actor
from .cache import Cache, Reflector
from .decision import AppSettings, decide
from .deletions import History, classify
from .leader import LeaderElector
from .metrics import AllocatorMetrics
from .model import Action, AppMemory, AppView, DeletePod, PodRecord, Release, Snapshot
from .nodes import placement_reflectors
from .placement import Placement
from .status import app_document, apps_document, executor_counts

log = logging.getLogger(__name__)

HISTORY_LABEL = "sparkgate.io/history"
UNSEEN_EXPIRY = 60.0  # seconds a removed gate may stay unreported by the watch before the cache wins


def expect_released(snapshot: Snapshot, released: Mapping[str, float]) -> Snapshot:
    """The snapshot with the gates this allocator removed but its watch has not reported yet removed.

    Without it a decision taken between a release and its watch event would count those pods as gated,
    not in flight, and release past the namespace or cluster limit (the controller "expectations" of
    kube-controller-manager, for the same reason)."""
    if not released:
        return snapshot
    apps = dict(snapshot.apps)
    for key, view in snapshot.apps.items():
        if any(p.gated and p.uid in released for p in view.pods):
            pods = tuple(
                replace(p, gated=False, gate_index=None) if p.gated and p.uid in released else p
                for p in view.pods
            )
            apps[key] = replace(view, pods=pods)
    return Snapshot(apps, snapshot.sources)


def observe_apps(metrics: AllocatorMetrics, snapshot: Snapshot) -> None:
    """The per-app and per-namespace gauges of one step (every pod of every app is walked)."""
    in_flight: dict[str, int] = {}
    bypassed: dict[str, int] = {}
    for key, view in snapshot.apps.items():
        counts = executor_counts(view)
        metrics.set_app(key, counts)
        in_flight[key.namespace] = in_flight.get(key.namespace, 0) + counts["in_flight"]
        bypassed[key.namespace] = bypassed.get(key.namespace, 0) + sum(
            1
            for p in view.pods
            if not p.gated and p.profile is None and not p.deleting and p.phase in ("Pending", "Running")
        )
    metrics.forget_apps(set(snapshot.apps))
    for namespace, n in in_flight.items():
        metrics.in_flight.labels(namespace).set(n)
    for namespace, n in bypassed.items():
        metrics.bypassed.labels(namespace).set(n)
    metrics.apps.set(len(snapshot.apps))


def history_name(key: AppKey) -> str:
    return "sparkgate-history-" + hashlib.sha256(f"{key.namespace}\0{key.app_id}".encode()).hexdigest()[:16]


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


class Controller:
    def __init__(
        self,
        kube: Kube,
        policy: PolicySource,
        options: Options,
        metrics: AllocatorMetrics,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.policy = policy
        self.options = options
        self.metrics = metrics
        self.clock = clock
        self.monotonic = monotonic
        self.stop_event = threading.Event()
        self.lost_lease = threading.Event()
        self._wake = threading.Condition()
        self._dirty: set[AppKey] = set()
        self._due: dict[AppKey, float] = {}  # monotonic time at which an app's batch delay ends
        self._busy: set[AppKey] = set()  # apps whose actions the actor is carrying out
        self._deferred: set[AppKey] = set()  # busy apps that changed meanwhile: decided when done
        self._gone: list[tuple[PodRecord, bool, float]] = []
        self._released_at: dict[str, float] = {}  # uid -> release time, until bound (release-to-bind metric)
        self._unseen: dict[str, float] = {}  # uid -> release time, until the watch shows the gate gone
        self.placement = Placement(monotonic=monotonic)  # what the scheduler extender answers from
        self.cache = Cache(self._on_change, self._on_gone, self.placement.observe)
        self.memory: dict[AppKey, AppMemory] = {}
        self.histories: dict[AppKey, History] = {}
        self._history_dirty: set[AppKey] = set()
        self.settings: dict[AppKey, AppSettings] = {}
        self._recorded: set[str] = set()  # uids whose deletion is already in a history
        self._missing_sources: set[str] = set()
        self.last_loop = monotonic()
        self.elector = LeaderElector(
            kube,
            options.install_namespace,
            options.lease_name,
            options.identity,
            lease_duration=options.lease_duration,
            renew_deadline=options.renew_deadline,
            retry_period=options.retry_period,
            monotonic=monotonic,
            wall=clock,
        )
        self.actor = Actor(
            kube,
            options.install_namespace,
            identity=options.identity,
            clock=clock,
            on_release=self._on_release,
            on_delete=self._on_delete,
        )
        ns = options.install_namespace
        on_restart = lambda watch, cause: metrics.watch_restarts.labels(watch, cause).inc()  # noqa: E731
        common: dict[str, Any] = {
            "stop": self.stop_event,
            "on_restart": on_restart,
            "timeout_seconds": options.watch_timeout,
        }
        self.reflectors = [
            Reflector(
                kube,
                "executors",
                "/api/v1/pods",
                "spark-role=executor",
                self._pod_event,
                self.cache.pods_replace,
                **common,
            ),
            Reflector(
                kube,
                "drivers",
                "/api/v1/pods",
                "spark-role=driver",
                self.cache.driver_event,
                self.cache.drivers_replace,
                **common,
            ),
            Reflector(
                kube,
                "copies",
                "/api/v1/configmaps",
                f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY},{contract.LABEL_APP_ID}",
                lambda k, o: self.cache.config_map_event(k, o, source=False),
                lambda items: self.cache.config_maps_replace(items, source=False),
                **common,
            ),
            Reflector(
                kube,
                "sources",
                f"/api/v1/namespaces/{ns}/configmaps",
                f"!{HISTORY_LABEL}",
                lambda k, o: self.cache.config_map_event(k, o, source=True),
                lambda items: self.cache.config_maps_replace(items, source=True),
                **common,
            ),
            *placement_reflectors(kube, self.placement, **common),
        ]

    # --- inputs ----------------------------------------------------------------------------------------

    def _on_change(self, apps: set[AppKey]) -> None:
        with self._wake:
            self._dirty |= apps
            self._wake.notify()

    def _on_gone(self, record: PodRecord, removed: bool) -> None:
        with self._wake:
            self._gone.append((record, removed, self.clock()))

    def _pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        uid = (obj.get("metadata") or {}).get("uid", "")
        if uid in self._unseen and (
            kind == "DELETED"
            or not any(
                g.get("name") == contract.GATE for g in (obj.get("spec") or {}).get("schedulingGates") or ()
            )
        ):
            self._unseen.pop(uid, None)
        if uid in self._released_at and (obj.get("spec") or {}).get("nodeName"):
            released = self._released_at.pop(uid)
            namespace = obj["metadata"].get("namespace", "")
            self.metrics.release_to_bind.labels(namespace).observe(max(0.0, self.clock() - released))
        elif kind == "DELETED":
            self._released_at.pop(uid, None)
        self.cache.pod_event(kind, obj)

    def _on_release(self, action: Release, at: float) -> None:
        self._released_at[action.pod.uid] = at  # in _unseen since it was dispatched
        self.metrics.releases.labels(action.app.namespace).inc()
        if action.pod.created:
            self.metrics.gate_wait.labels(action.app.namespace).observe(max(0.0, at - action.pod.created))

    def _on_delete(self, action: DeletePod) -> None:
        # Recorded with the decision's reason (id reuse, app finished) before the watch reports it.
        history = self.histories.setdefault(action.app, History())
        record = classify(action.pod, self.clock(), app_finishing=True)
        history.record(
            type(record)(
                record.exec_id,
                record.pod,
                record.node,
                record.at,
                action.reason,
                record.exit_code,
                record.detail,
            )
        )
        self._history_dirty.add(action.app)
        self.metrics.deletions.labels(action.app.namespace, action.reason.value).inc()
        with self._wake:
            self._gone = [g for g in self._gone if g[0].uid != action.pod.uid]
        self._recorded.add(action.pod.uid)

    # --- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        self._load_histories()
        for reflector in self.reflectors:
            reflector.start()
        threading.Thread(target=self._lead, name="leader-election", daemon=True).start()

    def stop(self) -> None:
        self.stop_event.set()
        with self._wake:
            self._wake.notify_all()
        self._flush_histories()
        self.elector.release()
        self.metrics.leader.set(0)
        self.actor.close()

    def _lead(self) -> None:
        while not self.stop_event.is_set():
            was = self.elector.leading
            now = self.elector.try_acquire_or_renew()
            self.metrics.leader.set(1 if now else 0)
            if now and not was:
                self.metrics.leader_transitions.inc()
                self._on_change(set(self.cache.snapshot().apps))
            if was and not now:
                self.lost_lease.set()
                with self._wake:
                    self._wake.notify_all()
                return
            self.stop_event.wait(self.options.retry_period)

    def run(self) -> None:
        """The loop; returns when stopped or when the lease is lost (the caller exits then)."""
        next_tick = self.monotonic()
        next_flush = self.monotonic() + self.options.history_flush
        while not self.stop_event.is_set() and not self.lost_lease.is_set():
            with self._wake:
                timeout = max(0.0, min(next_tick, next_flush, *self._due.values()) - self.monotonic())
                if not self._dirty and not self._gone and timeout > 0:
                    self._wake.wait(timeout)
                now = self.monotonic()
                for key, at in list(self._due.items()):
                    if at <= now:  # its batch delay is over: decide for it now, not at the next tick
                        self._dirty.add(key)
                        del self._due[key]
                dirty, self._dirty = self._dirty, set()
                gone, self._gone = self._gone, []
            self.last_loop = self.monotonic()
            if self.lost_lease.is_set():
                return
            everything = self.monotonic() >= next_tick
            if everything:
                next_tick = self.monotonic() + self.options.tick
            self.step(dirty, gone, everything)
            if self.monotonic() >= next_flush:
                self._flush_histories()
                next_flush = self.monotonic() + self.options.history_flush

    def step(self, dirty: set[AppKey], gone: list[tuple[PodRecord, bool, float]], everything: bool) -> None:
        self.metrics.ready.set(1 if self.cache.is_synced else 0)
        if not self.cache.is_synced:
            with self._wake:
                self._gone = gone + self._gone
                self._dirty |= dirty
            return
        snapshot = self.cache.snapshot()
        self._record_gone(gone, snapshot)
        now = self.clock()
        for uid, at in list(self._unseen.items()):
            if now - at > UNSEEN_EXPIRY:  # the watch lost it (relist replaced the pod): trust the cache again
                self._unseen.pop(uid, None)
        snapshot = expect_released(snapshot, dict(self._unseen))
        policy = self.policy.current()
        if policy is None or not self.elector.leading:
            self._observe(
                snapshot,
                policy.max_pending_per_namespace if policy else 0,
                policy.max_pending_cluster if policy else 0,
            )
            return
        for key in snapshot.apps:
            history = self.histories.get(key)
            if history is not None:
                self.memory.setdefault(key, AppMemory()).deleted_exec_ids = set(history.exec_ids)
        started = time.perf_counter()
        decided_at = self.clock()
        apps = set(snapshot.apps) if everything else dirty
        with self._wake:  # with _done's test of _deferred: a change is never lost between the two
            self._deferred |= apps & self._busy
            apps = apps - self._busy
        decision = decide(snapshot, policy, decided_at, self.memory, apps)
        self.metrics.decision_seconds.observe(time.perf_counter() - started)
        for key, at in decision.due.items():
            self._due[key] = self.monotonic() + max(0.0, at - decided_at)
        self.memory.update(decision.memory)
        self.settings.update(decision.settings)
        for scope, n in decision.limit_hits.items():
            self.metrics.limit_hits.labels(scope).inc(n)
        if self.lost_lease.is_set() or not self.elector.leading:
            return
        self._dispatch(decision.actions, decided_at)
        for key, mem in self.memory.items():
            if mem.finished and key in self.histories and self.histories[key].finished_at is None:
                self.histories[key].finished_at = self.clock()
                self._history_dirty.add(key)
        self._observe(snapshot, policy.max_pending_per_namespace, policy.max_pending_cluster)

    def _dispatch(self, actions: tuple[Action, ...], decided_at: float) -> None:
        """Hand the actions to the actor and go on: an app whose slot was just freed is decided and
        refilled while another app's batch of PATCHes is still being sent. Until its actions are done an
        app is busy (not decided again; a change meanwhile is deferred to their end), and its releases count
        as in flight from now, so that the shared budgets stay exact for the apps decided meanwhile."""
        releases: dict[AppKey, list[str]] = {}
        for action in actions:
            if isinstance(action, Release):
                releases.setdefault(action.app, []).append(action.pod.uid)
                self._unseen[action.pod.uid] = decided_at
        with self._wake:  # before submitting: an app's actions may be done before submit returns
            self._busy |= {action.app for action in actions}
        for app, done in self.actor.submit(actions).items():
            done.add_done_callback(functools.partial(self._done, app, releases.get(app, [])))

    def _done(self, app: AppKey, released: list[str], done: Future[bool]) -> None:
        ok = done.exception() is None and done.result()
        with self._wake:
            self._busy.discard(app)
            if not ok:  # re-read and re-decide; what was not released is not in flight
                for uid in released:
                    if uid not in self._released_at:
                        self._unseen.pop(uid, None)
            if not ok or app in self._deferred:
                self._deferred.discard(app)
                self._dirty.add(app)
                self._wake.notify()

    def _record_gone(self, gone: list[tuple[PodRecord, bool, float]], snapshot: Snapshot) -> None:
        for record, _removed, at in gone:
            if record.uid in self._recorded:
                continue
            self._recorded.add(record.uid)
            view = snapshot.apps.get(record.app)
            finishing = view is not None and (
                (view.driver is not None and view.driver.finished)
                or (view.driver is None and view.driver_seen)
            )
            entry = classify(record, at, app_finishing=finishing)
            self.histories.setdefault(record.app, History()).record(entry)
            self._history_dirty.add(record.app)
            self.metrics.deletions.labels(record.namespace, entry.reason.value).inc()
        if len(self._recorded) > 200_000:
            self._recorded.clear()

    def _observe(self, snapshot: Snapshot, per_namespace_limit: int, cluster_limit: int) -> None:
        observe_apps(self.metrics, snapshot)
        self.metrics.limit.labels("namespace").set(per_namespace_limit)
        self.metrics.limit.labels("cluster").set(cluster_limit)
        missing: dict[str, int] = {}
        for key, settings in self.settings.items():
            if (
                settings.waiting_for
                and settings.waiting_for.startswith("source ConfigMap")
                and key in snapshot.apps
            ):
                source = settings.waiting_for.split()[2]
                missing[source] = missing.get(source, 0) + 1
        for source in self._missing_sources - missing.keys():
            self.metrics.missing_sources.labels(source).set(0)
        for source, n in missing.items():
            self.metrics.missing_sources.labels(source).set(n)
        self._missing_sources |= missing.keys()

    # --- history persistence ---------------------------------------------------------------------------

    def _history_path(self) -> str:
        return f"/api/v1/namespaces/{self.options.install_namespace}/configmaps"

    def _load_histories(self) -> None:
        try:
            items, _ = self.kube.list(self._history_path(), label_selector=f"{HISTORY_LABEL}=true")
        except KubeError as e:
            log.warning("deletion histories not loaded: %s", e)
            return
        for obj in items:
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            namespace, _, app_id = annotations.get("sparkgate.io/app", "").partition("/")
            try:
                history = History.from_dict(json.loads((obj.get("data") or {}).get("history.json", "{}")))
            except ValueError:
                continue
            key = AppKey(namespace, app_id)
            self.histories[key] = history
            self.memory.setdefault(key, AppMemory()).deleted_exec_ids = set(history.exec_ids)

    def _flush_histories(self) -> None:
        if not self.elector.leading:
            return
        now = self.clock()
        for key in sorted(self._history_dirty):
            history = self.histories.get(key)
            if history is None:
                continue
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": history_name(key),
                    "labels": {HISTORY_LABEL: "true", contract.LABEL_MANAGED_BY: contract.MANAGED_BY},
                    "annotations": {"sparkgate.io/app": str(key)},
                },
                "data": {"history.json": json.dumps(history.to_dict())},
            }
            try:
                try:
                    self.kube.replace(f"{self._history_path()}/{history_name(key)}", body)
                except NotFound:
                    self.kube.create(self._history_path(), body)
            except KubeError as e:
                log.warning("deletion history of %s not saved: %s", key, e)
                continue
            self._history_dirty.discard(key)
        for key, history in list(self.histories.items()):
            if history.finished_at is not None and now - history.finished_at > self.options.history_retention:
                try:
                    self.kube.delete(f"{self._history_path()}/{history_name(key)}")
                except KubeError:
                    continue
                del self.histories[key]
                self.memory.pop(key, None)

    # --- status ----------------------------------------------------------------------------------------

    def apps(self) -> dict[str, Any]:
        policy = self.policy.current()
        limits = (
            {"cluster": policy.max_pending_cluster, "namespace": policy.max_pending_per_namespace}
            if policy
            else {}
        )
        document = apps_document(self.cache.snapshot(), self.settings, self.memory, self.histories, limits)
        document["leader"] = self.elector.leading
        document["identity"] = self.options.identity
        return document

    def app(self, namespace: str, app_id: str) -> dict[str, Any] | None:
        key = AppKey(namespace, app_id)
        view = self.cache.snapshot().apps.get(key)
        if view is None:
            if key not in self.histories:
                return None
            view = AppView(key, (), None, True, frozenset())
        return app_document(view, self.settings.get(key), self.memory.get(key), self.histories.get(key))
