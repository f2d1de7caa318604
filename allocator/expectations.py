"""The writes this allocator made that its watch has not shown yet (kube-controller-manager's
"expectations", for the same reason).

A decision taken between a gate removal and its watch event would count that pod as gated, not in flight,
and release past a limit; one taken between a delete and its watch event would delete the pod again. So
until the watch shows the change (or `expiry` passes: a relist may have replaced the pod, and the cache wins
again), `apply` shows the snapshot as it will be: released pods ungated, deleted pods deleting.

Thread-safe: one leaf lock. Written by the loop (`released` before dispatching), the actor threads
(`deleted`, `failed`) and the executors reflector (`observe`, a pod observer of the cache); read by the
loop (`apply`).
"""

from __future__ import annotations

import threading
import time
from collections import ChainMap, Counter
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass, replace
from typing import Any, cast

from sparkgate.contract import AppKey

from .model import AppView, PodRecord, Snapshot

EXPIRY = 60.0  # seconds a write may stay unreported by the watch before the cache is trusted again


@dataclass(frozen=True)
class Pending:
    """The writes not seen by the watch yet, at one moment: per app, (a version that changes with them, the
    uids released, the uids deleted)."""

    by_app: dict[AppKey, tuple[int, frozenset[str], frozenset[str]]]


RELEASED, DELETED = 0, 1


class Expectations:
    def __init__(self, *, expiry: float = EXPIRY, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.expiry = expiry
        self.monotonic = monotonic
        self._lock = threading.Lock()
        # Per kind (RELEASED: gate removals dispatched, DELETED: deletes that succeeded), uid -> (its app,
        # when the write was made), oldest first: expiry pops from the front.
        self._writes: tuple[dict[str, tuple[AppKey, float]], ...] = ({}, {})
        # Per app with writes not seen: [version, uids released, uids deleted, their frozen copy or None].
        # A step costs per app with unseen writes and per write that changed, not per pod nor per write.
        self._apps: dict[AppKey, list[Any]] = {}
        self._version = 0
        # The loop thread's own (apply): app -> (the version applied, the cache's view, the expected view),
        # so that a step while thousands of removals are unseen does not copy each record again
        # (bench/gates.py: 42 % of the allocator's time went to those copies).
        self._views: dict[AppKey, tuple[int, AppView, AppView]] = {}

    def released(self, pods: Iterable[tuple[AppKey, str]]) -> None:
        """Gate removals dispatched: (app, uid) each."""
        now = self.monotonic()
        with self._lock:
            for app, uid in pods:
                self._add(RELEASED, app, uid, now)

    def deleted(self, app: AppKey, uid: str) -> None:
        now = self.monotonic()
        with self._lock:
            self._add(DELETED, app, uid, now)

    def failed(self, uids: Iterable[str]) -> None:
        """Gate removals that did not happen: the pods are gated, not in flight."""
        with self._lock:
            for uid in uids:
                self._remove(RELEASED, uid)

    def observe(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """A pod record changed in the cache (new None: the pod is gone)."""
        record = new or old
        assert record is not None
        with self._lock:
            if new is None or not new.gated:
                self._remove(RELEASED, record.uid)
            if new is None or new.deleting:
                self._remove(DELETED, record.uid)

    def _add(self, kind: int, app: AppKey, uid: str, now: float) -> None:
        self._remove(kind, uid)
        self._writes[kind][uid] = (app, now)
        entry = self._apps.setdefault(app, [0, set(), set(), None])
        entry[1 + kind].add(uid)
        self._changed(entry)

    def _remove(self, kind: int, uid: str) -> None:
        found = self._writes[kind].pop(uid, None)
        if found is None:
            return
        entry = self._apps[found[0]]
        entry[1 + kind].discard(uid)
        if entry[1] or entry[2]:
            self._changed(entry)
        else:
            del self._apps[found[0]]

    def _changed(self, entry: list[Any]) -> None:
        self._version += 1
        entry[0], entry[3] = self._version, None

    def pending(self) -> Pending:
        """The writes not seen yet, after dropping the expired ones. Take them *before* the cache's snapshot
        they are applied to: a watch event handled in between drops its expectation, and a snapshot taken
        before it would then show the pod as it was, with nothing to correct it (the pod released again).
        One taken before may name a write the snapshot already shows: applying it changes nothing."""
        now = self.monotonic()
        with self._lock:
            for kind, table in enumerate(self._writes):
                while table:
                    uid, (_, at) = next(iter(table.items()))
                    if now - at <= self.expiry:
                        break
                    self._remove(kind, uid)
            by_app = {}
            for app, entry in self._apps.items():
                if entry[3] is None:
                    entry[3] = (entry[0], frozenset(entry[1]), frozenset(entry[2]))
                by_app[app] = entry[3]
        return Pending(by_app)

    def apply(self, snapshot: Snapshot, pending: Pending) -> Snapshot:
        """The snapshot with the expected changes made (`pending` taken before it). An app's expected view
        is kept until its view or its expectations change, so a step while thousands of removals are unseen
        costs per app that changed (bench/scale.py: rebuilding every expected view each step was 60 % of
        the loop's time at 10,000 pods)."""
        known, self._views = self._views, {}
        if not pending.by_app:
            return snapshot
        changed: dict[AppKey, AppView] = {}
        in_flight = Counter(snapshot.in_flight_by_namespace())
        for key, (version, released, deleted) in pending.by_app.items():
            view = snapshot.apps.get(key)
            if view is None:
                continue
            entry = known.get(key)
            if entry is None or entry[0] != version or entry[1] is not view:
                copies = tuple(_expected(p, released, deleted) for p in view.pods)
                expected = (
                    view
                    if all(c is p for c, p in zip(copies, view.pods, strict=True))
                    else AppView(view.key, copies, view.driver, view.driver_seen, view.config_maps)
                )
                entry = (version, view, expected)
            self._views[key] = entry
            if entry[2] is not view:
                changed[key] = entry[2]
                in_flight[key.namespace] += entry[2].counts.in_flight - view.counts.in_flight
        if not changed:
            return snapshot
        # The changed views over the snapshot's, no copy of every app's (a ChainMap writes only to its first
        # map: the snapshot's is never written).
        views = ChainMap(changed, cast("MutableMapping[AppKey, AppView]", snapshot.apps))
        return Snapshot(views, snapshot.sources, in_flight)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(table) for table in self._writes)


def _expected(pod: PodRecord, released: frozenset[str], deleted: frozenset[str]) -> PodRecord:
    if pod.gated and pod.uid in released:
        pod = replace(pod, gated=False, gate_index=None)
    if not pod.deleting and pod.uid in deleted:
        pod = replace(pod, deleting=True)
    return pod


class BindTimes:
    """Release time of each released pod until its watch shows it bound: the release-to-bind metric.
    Thread-safe (a leaf lock): the actor threads add, the executors reflector observes."""

    def __init__(self, observe: Callable[[str, float], None], clock: Callable[[], float] = time.time) -> None:
        self._observe = observe  # (namespace, seconds from release to bind)
        self.clock = clock
        self._lock = threading.Lock()
        self._released: dict[str, float] = {}

    def released(self, uid: str, at: float) -> None:
        with self._lock:
            self._released[uid] = at

    def observe(self, old: PodRecord | None, new: PodRecord | None) -> None:
        record = new or old
        assert record is not None
        with self._lock:
            if new is not None and new.node is None:
                return
            at = self._released.pop(record.uid, None)
        if at is not None and new is not None:
            self._observe(new.namespace, max(0.0, self.clock() - at))
