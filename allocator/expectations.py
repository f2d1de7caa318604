"""The writes this allocator made that its watch has not shown yet (kube-controller-manager's
"expectations", for the same reason).

A decision taken between a gate removal and its watch event would count that pod as gated, not in flight,
and release past a limit; one taken between a delete and its watch event would delete the pod again. So
until the watch shows the change (or `expiry` passes: a relist may have replaced the pod, and the cache wins
again), `apply` shows the snapshot as it will be: released pods ungated, deleted pods deleting.

A gate removal counts as released from its dispatch until its answer says otherwise (`answered`): accepted,
it stays until the watch shows it; refused (a 422 of its test, a 403...), it is dropped at once; with no
clear answer (none came, a 5xx, or a refusal after an attempt whose answer was lost: sparkgate/kube.py
`maybe_applied`) it stays "released, unconfirmed", as the ReplicaSet controller leaves a create that timed
out to its expectations and its watch. The watch then says: the pod seen without its gate is a release
(`on_confirmed`: the metrics count it then, as they count an accepted one at its answer), even when the watch
showed it before the answer came; the expectation expiring with the pod still gated, or the pod gone while
gated, is none (the cache wins). The expiry, a minute from the answer, is kube-apiserver's default request
timeout (--request-timeout): a write not applied by then is not applied (the API server ends its handler).

Thread-safe: one leaf lock. Written by the loop (`released` before dispatching), the actor threads
(`deleted`, `answered`) and the executors reflector (`observe`, a pod observer of the cache); read by the
loop (`pending`, then `apply`), which alone calls those two: what they keep across steps (the apps' unseen
writes as last taken, their expected views, the in-flight pods these add) is the loop thread's, unlocked.
`on_confirmed` is called from the actor's and the reflector's threads, with no lock held.
"""

from __future__ import annotations

import threading
import time
from collections import ChainMap, Counter
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, cast

from msgspec.structs import replace

from sparkgate.contract import AppKey

from .model import AppView, PodRecord, Release, Snapshot

EXPIRY = 60.0  # seconds a write may stay unreported by the watch before the cache is trusted again


Frozen = tuple[int, frozenset[str], frozenset[str]]  # (a version that changes with them, released, deleted)


@dataclass(frozen=True)
class Pending:
    """The writes not seen by the watch yet, at one moment: per app, (a version that changes with them, the
    uids released, the uids deleted). The loop's own map, brought up to date at each `pending()`: read it
    before the next call."""

    by_app: Mapping[AppKey, Frozen]


RELEASED, DELETED = 0, 1


class Expectations:
    def __init__(
        self,
        *,
        expiry: float = EXPIRY,
        monotonic: Callable[[], float] = time.monotonic,
        on_confirmed: Callable[[Release], None] | None = None,
    ) -> None:
        self.expiry = expiry
        self.monotonic = monotonic
        self.on_confirmed = on_confirmed  # a release whose answer was unclear, shown by the watch
        self._lock = threading.Lock()
        # Per kind (RELEASED: gate removals dispatched, DELETED: deletes that succeeded), uid -> (its app,
        # when the write was made), oldest first: expiry pops from the front.
        self._writes: tuple[dict[str, tuple[AppKey, float]], ...] = ({}, {})
        # Gate removals by uid: dispatched and not answered yet, with those of them the watch already showed
        # released; answered unclearly and not shown by the watch yet.
        self._awaiting: dict[str, Release] = {}
        self._shown: set[str] = set()
        self._unconfirmed: dict[str, Release] = {}
        # Per app with writes not seen: [version, uids released, uids deleted, their frozen copy or None].
        self._apps: dict[AppKey, list[Any]] = {}
        self._version = 0
        self._touched: set[AppKey] = set()  # apps whose writes changed since the last `pending()`
        # The loop thread's own, kept across steps so that a step costs per app whose writes or view changed,
        # not per app with unseen writes (bench/scale.py: thousands of them at 100,000 pods while the watch
        # lags the allocator's writes):
        self._frozen: dict[AppKey, Frozen] = {}  # every app's unseen writes, as of the last `pending()`
        self._dirty: set[AppKey] = set()  # apps whose writes changed since the last `apply`
        # app -> (the version applied, the cache's view, the expected view), for the apps with unseen writes
        # and a view; `_overlay` the expected views that differ from the cache's, `_delta` the in-flight pods
        # they add per namespace; `_sequence` the tracked snapshot they were brought up to date with.
        self._views: dict[AppKey, tuple[int, AppView, AppView]] = {}
        self._overlay: dict[AppKey, AppView] = {}
        self._delta: Counter[str] = Counter()
        self._sequence: int | None = None

    def released(self, releases: Iterable[Release]) -> None:
        """Gate removals dispatched: each counts as released until its answer (`answered`)."""
        now = self.monotonic()
        with self._lock:
            for release in releases:
                self._add(RELEASED, release.app, release.pod.uid, now)
                self._awaiting[release.pod.uid] = release

    def answered(
        self, *, released: Iterable[str] = (), failed: Iterable[str] = (), unclear: Iterable[str] = ()
    ) -> None:
        """The answers to dispatched gate removals, by uid: accepted; refused or never sent (the pods are
        gated, not in flight); unclear (kept as released, unconfirmed, until the watch says or it expires)."""
        confirmed = []
        now = self.monotonic()
        with self._lock:
            for uid in released:
                self._awaiting.pop(uid, None)
                self._shown.discard(uid)
            for uid in failed:
                self._awaiting.pop(uid, None)
                self._shown.discard(uid)
                self._remove(RELEASED, uid)
            for uid in unclear:
                release = self._awaiting.pop(uid, None)
                if release is None:
                    continue
                if uid in self._shown:  # the watch showed it released before the answer came
                    self._shown.discard(uid)
                    confirmed.append(release)
                elif uid in self._writes[RELEASED]:
                    self._add(RELEASED, release.app, uid, now)  # expires a minute from the answer
                    self._unconfirmed[uid] = release
        self._confirm(confirmed)

    def deleted(self, app: AppKey, uid: str) -> None:
        now = self.monotonic()
        with self._lock:
            self._add(DELETED, app, uid, now)

    def observe(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """A pod record changed in the cache (new None: the pod is gone)."""
        record = new or old
        assert record is not None
        confirmed = None
        with self._lock:
            if new is None or not new.gated:
                self._remove(RELEASED, record.uid)
                if new is not None and record.uid in self._awaiting:
                    self._shown.add(record.uid)
                # Shown released: confirmed. Gone while gated: no release (the last record said gated).
                unconfirmed = self._unconfirmed.pop(record.uid, None)
                if new is not None or (old is not None and not old.gated):
                    confirmed = unconfirmed
            if new is None or new.deleting:
                self._remove(DELETED, record.uid)
        if confirmed is not None:
            self._confirm([confirmed])

    def _confirm(self, releases: list[Release]) -> None:
        if self.on_confirmed is not None:
            for release in releases:
                self.on_confirmed(release)

    def confirms(self, old: PodRecord, new: PodRecord) -> bool:
        """Whether a pod's change is its gate removal by this allocator, not seen yet, and nothing else: the
        expected view showed it already, so nothing a decision reads changed (the executors reflector, for
        the cache, before `observe` drops the write). A pod released by anyone else, or changed in more
        than its gate, is not."""
        if not old.gated or new.gated or new != replace(old, gated=False, gate_index=None):
            return False
        with self._lock:
            return new.uid in self._writes[RELEASED]

    def _add(self, kind: int, app: AppKey, uid: str, now: float) -> None:
        self._remove(kind, uid)
        self._writes[kind][uid] = (app, now)
        entry = self._apps.setdefault(app, [0, set(), set(), None])
        entry[1 + kind].add(uid)
        self._changed(app, entry)

    def _remove(self, kind: int, uid: str) -> None:
        found = self._writes[kind].pop(uid, None)
        if found is None:
            return
        app = found[0]
        entry = self._apps[app]
        entry[1 + kind].discard(uid)
        if entry[1] or entry[2]:
            self._changed(app, entry)
        else:
            del self._apps[app]
            self._touched.add(app)

    def _changed(self, app: AppKey, entry: list[Any]) -> None:
        self._version += 1
        entry[0], entry[3] = self._version, None
        self._touched.add(app)

    def pending(self) -> Pending:
        """The writes not seen yet, after dropping the expired ones (the loop's: one caller). Take them
        *before* the cache's snapshot they are applied to: a watch event handled in between drops its
        expectation, and a snapshot taken before it would then show the pod as it was, with nothing to
        correct it (the pod released again). One taken before may name a write the snapshot already shows:
        applying it changes nothing. Costs per app whose writes changed since the last call."""
        now = self.monotonic()
        with self._lock:
            for kind, table in enumerate(self._writes):
                while table:
                    uid, (_, at) = next(iter(table.items()))
                    if now - at <= self.expiry:
                        break
                    self._remove(kind, uid)
                    if kind == RELEASED:
                        self._unconfirmed.pop(uid, None)  # not shown in time: not released, the cache wins
            touched, self._touched = self._touched, set()
            changes: dict[AppKey, Frozen | None] = {}
            for app in touched:
                entry = self._apps.get(app)
                if entry is not None and entry[3] is None:
                    entry[3] = (entry[0], frozenset(entry[1]), frozenset(entry[2]))
                changes[app] = None if entry is None else entry[3]
        for app, frozen in changes.items():
            if frozen is None:
                self._frozen.pop(app, None)
            else:
                self._frozen[app] = frozen
        self._dirty |= touched
        return Pending(self._frozen)

    def apply(self, snapshot: Snapshot, pending: Pending) -> Snapshot:
        """The snapshot with the expected changes made (`pending` taken before it). The expected views are
        kept across steps and made again only for the apps whose writes changed (`pending`) or whose view
        changed (a tracked snapshot names them; any other snapshot, or one after a tracked snapshot this
        did not see, has every app with unseen writes looked at), with the in-flight pods they add per
        namespace: a step while thousands of apps have writes the watch has not shown costs per app that
        changed (bench/scale.py: rebuilding every expected view each step was 60 % of the loop's time at
        10,000 pods, and looking at each app every step what still grew at 100,000)."""
        follows = (
            snapshot.sequence is not None
            and self._sequence is not None
            and snapshot.sequence == self._sequence + 1
            and snapshot.changed is not None
        )
        self._sequence = snapshot.sequence
        if follows:
            assert snapshot.changed is not None
            look = self._dirty | {k for k in snapshot.changed if k in pending.by_app or k in self._views}
        else:
            look = set(pending.by_app) | set(self._views)
        self._dirty = set()
        for key in look:
            self._update(key, snapshot.apps.get(key), pending.by_app.get(key))
        if not self._overlay:
            return snapshot
        in_flight = Counter(snapshot.in_flight_by_namespace())
        in_flight.update(self._delta)
        # The expected views over the snapshot's, no copy of either (a ChainMap writes only to its first map,
        # and nothing writes to it): the result is the step's and holds until the next `apply`, which changes
        # the overlay (the loop thread's both).
        views = ChainMap(self._overlay, cast("MutableMapping[AppKey, AppView]", snapshot.apps))
        return Snapshot(views, snapshot.sources, in_flight)

    def _update(self, key: AppKey, view: AppView | None, frozen: Frozen | None) -> None:
        """One app's expected view made again from its cache view and its unseen writes (the loop's)."""
        old = self._views.get(key)
        prior: dict[str, tuple[PodRecord, PodRecord]] = {}
        if old is not None:
            if frozen is not None and old[0] == frozen[0] and old[1] is view:
                return  # neither its writes nor its view changed
            if old[2] is not old[1]:
                prior = {p.uid: (p, c) for p, c in zip(old[1].pods, old[2].pods, strict=True) if c is not p}
            del self._views[key]
            if self._overlay.pop(key, None) is not None:
                self._delta[key.namespace] -= old[2].counts.in_flight - old[1].counts.in_flight
                if not self._delta[key.namespace]:
                    del self._delta[key.namespace]
        if frozen is None or view is None:
            return
        version, released, deleted = frozen
        copies = tuple(_expected(p, released, deleted, prior.get(p.uid)) for p in view.pods)
        expected = (
            view
            if all(c is p for c, p in zip(copies, view.pods, strict=True))
            else AppView(view.key, copies, view.driver, view.driver_seen, view.config_maps)
        )
        self._views[key] = (version, view, expected)
        if expected is not view:
            self._overlay[key] = expected
            self._delta[key.namespace] += expected.counts.in_flight - view.counts.in_flight
            if not self._delta[key.namespace]:
                del self._delta[key.namespace]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(table) for table in self._writes)


def _expected(
    pod: PodRecord,
    released: frozenset[str],
    deleted: frozenset[str],
    prior: tuple[PodRecord, PodRecord] | None,
) -> PodRecord:
    """The pod as the unseen writes leave it. `prior`: the pod and its expected copy at the app's previous
    update, reused when the pod is the same object and the same writes apply to it: an app's view is made
    again at each watch event of its batch, and copying every pod of the batch each time was half of this
    module's cost (bench/scale.py)."""
    release = pod.gated and pod.uid in released
    delete = not pod.deleting and pod.uid in deleted
    if not (release or delete):
        return pod
    if prior is not None:
        was, copy = prior
        if was is pod and (copy.gated != pod.gated) == release and (copy.deleting != pod.deleting) == delete:
            return copy
    if release and delete:
        return replace(pod, gated=False, gate_index=None, deleting=True)
    if release:
        return replace(pod, gated=False, gate_index=None)
    return replace(pod, deleting=True)


class BindTimes:
    """Release time of each released pod until its watch shows it bound: the release-to-bind metric.
    Thread-safe (a leaf lock): the actor threads add, the executors reflector observes."""

    def __init__(
        self, observe: Callable[[str, float], None], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._observe = observe  # (namespace, seconds from release to bind)
        self.clock = clock
        self._lock = threading.Lock()
        self._released: dict[str, float] = {}

    def released(self, uid: str) -> None:
        """Now, on the monotonic clock: a duration measured within this process."""
        at = self.clock()
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
