"""Deletion tracking: why each executor pod went away, per application, kept across allocator restarts.

`classify` says why a pod that vanished or got a deletionTimestamp went; `History` keeps the counts by
reason and the most recent records of one app, and (de)serialises them; `HistoryStore` holds every app's
history and persists them in the cluster, to read them back after a restart.
"""

from __future__ import annotations

import collections
import hashlib
import heapq
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.kube import Conflict, Kube, KubeError, NotFound, NotLeading

from .model import DeletionReason, DeletionRecord, PodRecord
from .workqueue import Backoff

log = logging.getLogger(__name__)

RECENT = 50
RECORDED_UIDS = 200_000  # pod uids remembered as recorded, all apps together


def classify(pod: PodRecord, at: float, *, app_finishing: bool = False) -> DeletionRecord:
    """The deletion record of an executor pod that is going away, from its last known state."""
    reason = pod.reason or ""
    if app_finishing and pod.phase not in ("Failed", "Succeeded"):
        kind = DeletionReason.APP_FINISHED
    elif reason == "Evicted":
        kind = DeletionReason.EVICTED
    elif reason in ("Preempted", "PreemptionByScheduler"):
        kind = DeletionReason.PREEMPTED
    elif pod.phase == "Failed":
        kind = DeletionReason.OOM_KILLED if reason == "OOMKilled" else DeletionReason.FAILED
    elif pod.phase == "Succeeded":
        kind = DeletionReason.SUCCEEDED
    elif pod.gated:
        kind = DeletionReason.GATED
    elif pod.phase == "Running":
        kind = DeletionReason.RUNNING
    else:
        kind = DeletionReason.PENDING
    return DeletionRecord(pod.exec_id, pod.name, pod.node, at, kind, pod.exit_code, pod.reason)


EXECUTOR_IDS = 1000  # default of the allocator's --history-executor-ids


@dataclass
class History:
    """One app's deletions: counts by reason, the most recent records, the `EXECUTOR_IDS` (a setting) highest
    deleted executor ids (Spark numbers executors upwards, so these are the latest) and how many lower ones
    were dropped: its size is bounded whatever the app's length (a ConfigMap holds at most 1 MiB)."""

    counts: collections.Counter[DeletionReason] = field(default_factory=collections.Counter)
    recent: collections.deque[DeletionRecord] = field(
        default_factory=lambda: collections.deque(maxlen=RECENT)
    )
    exec_ids: set[int] = field(default_factory=set)
    finished_at: float | None = None
    dropped: int = 0  # deleted executor ids no longer kept (their reuse is no longer refused)
    _heap: list[int] = field(default_factory=list, repr=False, compare=False)  # exec_ids, smallest first

    def record(self, record: DeletionRecord, keep: int = EXECUTOR_IDS) -> int:
        """Add one deletion; the number of executor ids dropped to stay within `keep`."""
        self.counts[record.reason] += 1
        self.recent.append(record)
        if record.exec_id is None or record.exec_id in self.exec_ids:
            return 0
        if len(self._heap) != len(self.exec_ids):
            self._heap = sorted(self.exec_ids)
        self.exec_ids.add(record.exec_id)
        heapq.heappush(self._heap, record.exec_id)
        dropped = 0
        while len(self.exec_ids) > keep:
            self.exec_ids.discard(heapq.heappop(self._heap))
            dropped += 1
        self.dropped += dropped
        return dropped

    def merge(self, stored: History, keep: int = EXECUTOR_IDS) -> None:
        """Fold in a copy another writer saved (a deposed leader's write that landed late): the union of what
        both recorded. Counts by reason are each side's larger (both counted the records they share); the
        executor ids are the union, trimmed to `keep`; `finished_at` stays this one's (the live view)."""
        for reason, n in stored.counts.items():
            self.counts[reason] = max(self.counts[reason], n)
        mine = set(self.recent)
        records = sorted([*self.recent, *(r for r in stored.recent if r not in mine)], key=lambda r: r.at)
        self.recent = collections.deque(records[-RECENT:], maxlen=RECENT)
        ids = sorted(self.exec_ids | stored.exec_ids)
        heap = ids[-keep:] if keep else []
        kept = set(heap)
        # Each side's drops plus the ids of its own the bound now drops; an id both dropped counts once, and
        # merging the same copy again changes nothing.
        self.dropped = max(
            self.dropped + len(self.exec_ids - kept), stored.dropped + len(stored.exec_ids - kept)
        )
        self._heap, self.exec_ids = heap, kept

    def to_dict(self) -> dict[str, Any]:
        return {
            "counts": {reason.value: n for reason, n in sorted(self.counts.items())},
            "recent": [
                {
                    "execId": r.exec_id,
                    "pod": r.pod,
                    "node": r.node,
                    "at": r.at,
                    "reason": r.reason.value,
                    "exitCode": r.exit_code,
                    "detail": r.detail,
                }
                for r in self.recent
            ],
            "execIds": sorted(self.exec_ids),
            "execIdsDropped": self.dropped,
            "finishedAt": self.finished_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> History:
        """The inverse of to_dict; unknown reasons (from a newer version) are skipped, not fatal."""
        history = cls(finished_at=data.get("finishedAt"), dropped=int(data.get("execIdsDropped") or 0))
        known = {r.value: r for r in DeletionReason}
        for name, n in (data.get("counts") or {}).items():
            if name in known:
                history.counts[known[name]] = int(n)
        for r in data.get("recent") or []:
            if r.get("reason") in known:
                history.recent.append(
                    DeletionRecord(
                        r.get("execId"),
                        r.get("pod", ""),
                        r.get("node"),
                        float(r.get("at", 0)),
                        known[r["reason"]],
                        r.get("exitCode"),
                        r.get("detail"),
                    )
                )
        history.exec_ids = {int(i) for i in data.get("execIds") or []}
        return history


HISTORY_LABEL = "sparkgate.io/history"  # "true": a live history; "corrupt": one set aside, never read again
APP_ANNOTATION = "sparkgate.io/app"
DATA_KEY = "history.json"


def history_name(key: AppKey) -> str:
    return "sparkgate-history-" + hashlib.sha256(f"{key.namespace}\0{key.app_id}".encode()).hexdigest()[:16]


class HistoryStore:
    """Every app's deletion history, and its persistence in ConfigMaps of the install namespace (one per app,
    written in batches by `flush`), so that a restarted allocator knows which executor ids were deleted.

    - `load` reads them once at start (the loop retries it until it succeeds: the leader acts only then). A
      history that does not parse is logged, counted, copied aside (label `sparkgate.io/history=corrupt`) and
      replaced by an empty one: never a crash loop.
    - A write that fails is retried at the next flush after a per-app exponential backoff; a record is never
      dropped while it is unwritten.

    Thread-safe: one leaf lock over the histories; no I/O under it (`flush` copies what it writes). Written by
    the loop (gone pods, finished apps) and the actor threads (deletions made by sparkgate); saved by the
    controller's histories thread (`flush`, one at a time: `_flushing`); read by the HTTP threads through
    `view`.
    """

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        *,
        retention: float,
        backoff: Backoff,
        executor_ids: int = EXECUTOR_IDS,
        on_corrupt: Callable[[], None] = lambda: None,
        on_truncate: Callable[[int], None] = lambda n: None,
        on_write_failure: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.path = f"/api/v1/namespaces/{namespace}/configmaps"
        self.retention = retention
        self.backoff = backoff
        self.on_corrupt = on_corrupt
        self.on_truncate = on_truncate
        self.executor_ids = executor_ids
        self.on_write_failure = on_write_failure
        self.clock = clock
        self.monotonic = monotonic
        self.loaded = False
        self._lock = threading.Lock()
        self._flushing = (
            threading.Lock()
        )  # held through a flush, writes included; always taken before `_lock`
        self._histories: dict[AppKey, History] = {}
        # The histories changed since they were last saved, each with the number of its last change (from
        # `_changes`): a flush forgets one only if no change came while it was being written.
        self._dirty: dict[AppKey, int] = {}
        self._changes = itertools.count(1)
        # Pod uids already recorded, by app (each app's insertion-ordered): RECORDED_UIDS at most, the oldest
        # half forgotten past it; an app's go with its history.
        self._recorded: dict[AppKey, dict[str, None]] = {}
        self._recorded_count = 0
        self._failures: dict[AppKey, tuple[int, float]] = {}  # consecutive write failures, retry time
        # The resourceVersion of each history's ConfigMap as last read or written: every PUT carries it, so a
        # write another replica made since (a deposed leader's, landed late) is a 409, merged, never
        # overwritten. None: not known to exist (a POST, an AlreadyExists merged the same way).
        self._versions: dict[AppKey, str] = {}

    # --- reading and recording ---------------------------------------------------------------------------

    def record(self, app: AppKey, uid: str, entry: DeletionRecord, *, ended_at: float | None = None) -> bool:
        """Add one pod's deletion; False when that pod was already recorded. `ended_at`: when the app ended,
        if it did: a history it starts then is finished from the start, so it expires like any other."""
        with self._lock:
            uids = self._recorded.setdefault(app, {})
            if uid in uids:
                return False
            uids[uid] = None
            self._recorded_count += 1
            if self._recorded_count > RECORDED_UIDS:
                self._forget_recorded()
            dropped = self._histories.setdefault(app, History(finished_at=ended_at)).record(
                entry, self.executor_ids
            )
            self._dirty[app] = next(self._changes)
        if dropped:
            self.on_truncate(dropped)
        return True

    def _forget_recorded(self) -> None:
        """Forget the oldest half of the recorded uids (each app's oldest, in proportion). Under the lock."""
        for app, uids in list(self._recorded.items()):
            for old in list(itertools.islice(uids, (len(uids) + 1) // 2)):
                del uids[old]
                self._recorded_count -= 1
            if not uids:
                del self._recorded[app]

    def deleted_exec_ids(self, apps: Iterable[AppKey]) -> dict[AppKey, frozenset[int]]:
        """The executor ids deleted before, of `apps` (the ones a decision is about: never every app's)."""
        with self._lock:
            return {
                k: frozenset(h.exec_ids)
                for k in apps
                if (h := self._histories.get(k)) is not None and h.exec_ids
            }

    def finished(self, app: AppKey, at: float) -> None:
        with self._lock:
            history = self._histories.get(app)
            if history is not None and history.finished_at is None:
                history.finished_at = at
                self._dirty[app] = next(self._changes)

    def unfinished_again(self, app: AppKey) -> None:
        """An app said over lives again (a client-mode app: registry.py): its history no longer expires."""
        with self._lock:
            history = self._histories.get(app)
            if history is not None and history.finished_at is not None:
                history.finished_at = None
                self._dirty[app] = next(self._changes)

    def view(self, app: AppKey) -> History | None:
        """A copy of an app's history (for /apps)."""
        with self._lock:
            history = self._histories.get(app)
            return None if history is None else History.from_dict(history.to_dict())

    def unfinished(self) -> set[AppKey]:
        with self._lock:
            return {k for k, h in self._histories.items() if h.finished_at is None}

    def count(self) -> int:
        with self._lock:
            return len(self._histories)

    def unsaved(self) -> int:
        with self._lock:
            return len(self._dirty)

    # --- persistence -------------------------------------------------------------------------------------

    def load(self) -> bool:
        """Read every saved history, in place of those held (changes not written yet are kept); False when
        the API failed (call again). At start, and again by a replica that becomes the leader."""
        with self._lock:
            before = dict(self._versions)  # a history written while the list is read is newer than its copy
        try:
            items, _ = self.kube.list(self.path, label_selector=f"{HISTORY_LABEL}=true")
        except KubeError as e:
            log.warning("deletion histories not loaded yet: %s", e)
            return False
        loaded: dict[AppKey, History] = {}
        versions: dict[AppKey, str] = {}
        for obj in items:
            meta = obj.get("metadata") or {}
            try:
                namespace, slash, app_id = (meta.get("annotations") or {})[APP_ANNOTATION].partition("/")
                if not slash or meta.get("name") != history_name(AppKey(namespace, app_id)):
                    raise ValueError(f"annotation {APP_ANNOTATION} does not name this history's app")
                history = History.from_dict(json.loads((obj.get("data") or {})[DATA_KEY]))
            except Exception as e:  # anything at all: one bad ConfigMap must not stop the allocator
                self._set_aside(obj, e)
                continue
            loaded[AppKey(namespace, app_id)] = history
            versions[AppKey(namespace, app_id)] = meta.get("resourceVersion") or ""
        with self._lock:
            # Held, not read: changes not written yet, and histories a flush wrote while the list was read.
            written = {k for k, v in self._versions.items() if before.get(k) != v}
            held = {k for k in self._dirty.keys() | written if k in self._histories}
            for key in held & self._dirty.keys():  # the union with what was saved meanwhile
                if key in loaded and key not in written:
                    self._histories[key].merge(loaded[key], self.executor_ids)
            self._histories = {**loaded, **{k: self._histories[k] for k in held}}
            self._versions = {**versions, **{k: self._versions[k] for k in written}}
        self.loaded = True
        return True

    def _set_aside(self, obj: dict[str, Any], error: Exception) -> None:
        """Keep a corrupt history for inspection under another name and label, and remove the original, so
        the app's next history is written afresh."""
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        aside = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"{name}-corrupt-{int(self.clock())}"[:253],
                "labels": {**(meta.get("labels") or {}), HISTORY_LABEL: "corrupt"},
                "annotations": meta.get("annotations") or {},
            },
            "data": obj.get("data") or {},
        }
        try:
            self.kube.create(self.path, aside)
            self.kube.delete(f"{self.path}/{name}")
            failed: KubeError | None = None
        except NotLeading:
            # Written by the leader only (a replica loads the histories at its start, before it may lead):
            # the leader sets it aside when it reads the histories as it takes over (Controller._read_histories).
            log.info("deletion history %s is corrupt: left for the leader to set aside", name)
            return
        except KubeError as e:
            failed = e
        log.error(
            "deletion history %s is corrupt (%s: %s): set aside, replaced", name, type(error).__name__, error
        )
        self.on_corrupt()
        if failed is not None:
            log.warning("corrupt deletion history %s not set aside: %s", name, failed)

    def flush(self) -> None:
        """Write the histories that changed (each after its backoff if its last write failed); delete those
        of apps finished for longer than `retention`."""
        with self._flushing:  # the controller's histories thread, or shutdown's last flush: one at a time
            self._flush()

    def _flush(self) -> None:
        now, mono = self.clock(), self.monotonic()
        with self._lock:
            # Expired whether saved or not: a history whose writes keep failing (a ConfigMap quota) would
            # otherwise be held, and retried, for the rest of the process's life.
            expired = [k for k, h in self._histories.items() if self._expired(h, now)]
            gone = set(expired)
            due = sorted(
                k for k in self._dirty if self._failures.get(k, (0, 0.0))[1] <= mono and k not in gone
            )
            bodies = {k: self._body(k, self._histories[k]) for k in due if k in self._histories}
            marks = {k: self._dirty[k] for k in bodies}
        for key, body in bodies.items():
            try:
                saved = self._write(key, body)
            except NotLeading:
                return  # this replica no longer leads: the new leader saves what it holds (load, record)
            except Conflict as e:
                # Written by another replica since this one read or wrote it: merged, written at the next flush.
                log.warning(
                    "deletion history of %s was changed by another writer (%s): merged", key, e.message
                )
                try:
                    self._merge_stored(key)
                except NotLeading:
                    return
                except KubeError as e:
                    self._failed(key, e)
                continue
            except KubeError as e:
                self._failed(key, e)
                continue
            with self._lock:
                self._failures.pop(key, None)
                self._versions[key] = (saved.get("metadata") or {}).get("resourceVersion") or ""
                if self._dirty.get(key) == marks[key]:  # not changed since its body was taken
                    del self._dirty[key]
        for key in expired:
            try:
                self.kube.delete(f"{self.path}/{history_name(key)}")
            except NotFound:
                pass
            except NotLeading:
                return
            except KubeError:
                continue
            with self._lock:
                history = self._histories.get(key)
                if history is None or not self._expired(history, now):
                    continue  # it lives again (unfinished_again) and is marked to be written: kept
                # A deletion recorded meanwhile goes with it (its app was over for longer than the retention).
                del self._histories[key]
                self._dirty.pop(key, None)
                self._failures.pop(key, None)
                self._versions.pop(key, None)
                self._recorded_count -= len(self._recorded.pop(key, {}))

    def _write(self, key: AppKey, body: dict[str, Any]) -> dict[str, Any]:
        """PUT with the resourceVersion last seen (409 if another writer came since), or POST when none is
        known (409 AlreadyExists if another writer created it); the answer."""
        with self._lock:
            version = self._versions.get(key)
        if version is not None:
            try:
                return self.kube.replace(
                    f"{self.path}/{history_name(key)}",
                    {**body, "metadata": {**body["metadata"], "resourceVersion": version}},
                )
            except NotFound:
                pass  # deleted since (the app's history expired under another leader): written afresh
        return self.kube.create(self.path, body)

    def _merge_stored(self, key: AppKey) -> None:
        """Read the history another writer saved and fold it into the one held (its resourceVersion kept
        for the next write); one that is gone is created afresh, one that does not parse is set aside and
        overwritten (an empty resourceVersion: an unconditional PUT, whether its deletion went through or
        was refused)."""
        try:
            obj = self.kube.get(f"{self.path}/{history_name(key)}")
        except NotFound:
            with self._lock:
                self._versions.pop(key, None)
            return
        version = (obj.get("metadata") or {}).get("resourceVersion") or ""
        try:
            stored = History.from_dict(json.loads((obj.get("data") or {})[DATA_KEY]))
        except Exception as e:  # as in load: one bad ConfigMap must not stop the allocator
            self._set_aside(obj, e)
            with self._lock:  # copied aside: the next write replaces it whatever it is now (no precondition)
                self._versions[key] = ""
            return
        with self._lock:
            history = self._histories.get(key)
            if history is not None:
                history.merge(stored, self.executor_ids)
            self._versions[key] = version

    def _failed(self, key: AppKey, error: KubeError) -> None:
        self.on_write_failure()
        with self._lock:
            failures = self._failures.get(key, (0, 0.0))[0] + 1
            self._failures[key] = (failures, self.monotonic() + self.backoff.delay(failures))
        log.warning("deletion history of %s not saved (attempt %d): %s", key, failures, error)

    def _expired(self, history: History, now: float) -> bool:
        return history.finished_at is not None and now - history.finished_at > self.retention

    @staticmethod
    def _body(key: AppKey, history: History) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": history_name(key),
                "labels": {HISTORY_LABEL: "true", contract.LABEL_MANAGED_BY: contract.MANAGED_BY},
                "annotations": {APP_ANNOTATION: str(key)},
            },
            "data": {DATA_KEY: json.dumps(history.to_dict())},
        }
