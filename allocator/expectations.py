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
from typing import cast

from sparkgate.contract import AppKey

from .model import AppView, PodRecord, Snapshot

EXPIRY = 60.0  # seconds a write may stay unreported by the watch before the cache is trusted again


@dataclass(frozen=True)
class Pending:
    """The writes not seen by the watch yet, at one moment: per app, the uids released and deleted."""

    by_app: dict[AppKey, tuple[frozenset[str], frozenset[str]]]


class Expectations:
    def __init__(self, *, expiry: float = EXPIRY, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.expiry = expiry
        self.monotonic = monotonic
        self._lock = threading.Lock()
        # uid -> (its app, when the write was made), oldest first: expiry pops from the front, and `apply`
        # visits only the apps named here, so a step costs per unseen write, not per pod of the cluster.
        self._released: dict[str, tuple[AppKey, float]] = {}  # gate removals dispatched
        self._deleted: dict[str, tuple[AppKey, float]] = {}  # deletes that succeeded
        # The loop thread's own (apply): app -> (the cache's view, the uids released and deleted applied
        # to it, the expected view), so that a step while thousands of removals are unseen does not copy
        # each record again (bench/gates.py: 42 % of the allocator's time went to those copies).
        self._views: dict[AppKey, tuple[AppView, frozenset[str], frozenset[str], AppView]] = {}

    def released(self, pods: Iterable[tuple[AppKey, str]]) -> None:
        """Gate removals dispatched: (app, uid) each."""
        now = self.monotonic()
        with self._lock:
            for app, uid in pods:
                self._released.pop(uid, None)
                self._released[uid] = (app, now)

    def deleted(self, app: AppKey, uid: str) -> None:
        with self._lock:
            self._deleted.pop(uid, None)
            self._deleted[uid] = (app, self.monotonic())

    def failed(self, uids: Iterable[str]) -> None:
        """Gate removals that did not happen: the pods are gated, not in flight."""
        with self._lock:
            for uid in uids:
                self._released.pop(uid, None)

    def observe(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """A pod record changed in the cache (new None: the pod is gone)."""
        record = new or old
        assert record is not None
        with self._lock:
            if new is None or not new.gated:
                self._released.pop(record.uid, None)
            if new is None or new.deleting:
                self._deleted.pop(record.uid, None)

    def pending(self) -> Pending:
        """The writes not seen yet, after dropping the expired ones. Take them *before* the cache's snapshot
        they are applied to: a watch event handled in between drops its expectation, and a snapshot taken
        before it would then show the pod as it was, with nothing to correct it (the pod released again).
        One taken before may name a write the snapshot already shows: applying it changes nothing."""
        now = self.monotonic()
        by_app: dict[AppKey, tuple[set[str], set[str]]] = {}
        with self._lock:
            for index, table in enumerate((self._released, self._deleted)):
                while table:
                    uid, (_, at) = next(iter(table.items()))
                    if now - at <= self.expiry:
                        break
                    del table[uid]
                for uid, (app, _) in table.items():
                    by_app.setdefault(app, (set(), set()))[index].add(uid)
        return Pending({app: (frozenset(r), frozenset(d)) for app, (r, d) in by_app.items()})

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
        for key, (released, deleted) in pending.by_app.items():
            view = snapshot.apps.get(key)
            if view is None:
                continue
            entry = known.get(key)
            if entry is None or entry[0] is not view or entry[1] != released or entry[2] != deleted:
                copies = tuple(_expected(p, released, deleted) for p in view.pods)
                expected = (
                    view
                    if all(c is p for c, p in zip(copies, view.pods, strict=True))
                    else AppView(view.key, copies, view.driver, view.driver_seen, view.config_maps)
                )
                entry = (view, released, deleted, expected)
            self._views[key] = entry
            if entry[3] is not view:
                changed[key] = entry[3]
                in_flight[key.namespace] += entry[3].counts.in_flight - view.counts.in_flight
        if not changed:
            return snapshot
        # The changed views over the snapshot's, no copy of every app's (a ChainMap writes only to its first
        # map: the snapshot's is never written).
        views = ChainMap(changed, cast("MutableMapping[AppKey, AppView]", snapshot.apps))
        return Snapshot(views, snapshot.sources, in_flight)

    def __len__(self) -> int:
        with self._lock:
            return len(self._released) + len(self._deleted)


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
