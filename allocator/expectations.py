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
from collections.abc import Callable, Iterable
from dataclasses import replace

from .model import PodRecord, Snapshot

EXPIRY = 60.0  # seconds a write may stay unreported by the watch before the cache is trusted again


class Expectations:
    def __init__(self, *, expiry: float = EXPIRY, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.expiry = expiry
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._released: dict[str, float] = {}  # uid -> when the gate removal was dispatched
        self._deleted: dict[str, float] = {}  # uid -> when the delete succeeded
        # The loop thread's own (apply): uid -> (the cache's record, what is expected of it, its expected
        # copy), so that a step while thousands of removals are unseen does not copy each record again
        # (bench/gates.py: 42 % of the allocator's time went to those copies).
        self._copies: dict[str, tuple[PodRecord, tuple[bool, bool], PodRecord]] = {}

    def released(self, uids: Iterable[str]) -> None:
        now = self.monotonic()
        with self._lock:
            self._released.update((uid, now) for uid in uids)

    def deleted(self, uid: str) -> None:
        with self._lock:
            self._deleted[uid] = self.monotonic()

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

    def apply(self, snapshot: Snapshot) -> Snapshot:
        """The snapshot with the expected changes made, after dropping the expired expectations."""
        now = self.monotonic()
        with self._lock:
            for table in (self._released, self._deleted):
                for uid in [u for u, at in table.items() if now - at > self.expiry]:
                    del table[uid]
            released, deleted = set(self._released), set(self._deleted)
        if len(self._copies) > len(released) + len(deleted):
            self._copies = {u: c for u, c in self._copies.items() if u in released or u in deleted}
        if not released and not deleted:
            return snapshot
        apps = dict(snapshot.apps)
        for key, view in snapshot.apps.items():
            if any(
                (p.gated and p.uid in released) or (not p.deleting and p.uid in deleted) for p in view.pods
            ):
                apps[key] = replace(view, pods=tuple(self._expected(p, released, deleted) for p in view.pods))
        return Snapshot(apps, snapshot.sources)

    def _expected(self, pod: PodRecord, released: set[str], deleted: set[str]) -> PodRecord:
        change = (pod.gated and pod.uid in released, not pod.deleting and pod.uid in deleted)
        if change == (False, False):
            return pod
        known = self._copies.get(pod.uid)
        if known is not None and known[0] is pod and known[1] == change:
            return known[2]
        copy = _expected(pod, released, deleted)
        self._copies[pod.uid] = (pod, change, copy)
        return copy

    def __len__(self) -> int:
        with self._lock:
            return len(self._released) + len(self._deleted)


def _expected(pod: PodRecord, released: set[str], deleted: set[str]) -> PodRecord:
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
