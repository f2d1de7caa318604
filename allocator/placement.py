"""What the scheduler extender knows about placement: executor failures per node and app, live executors per
node and app, each node's zone and each driver's zone. Kept up to date from the allocator's watches, read by
allocator/extender.py on every filter and prioritize request without any API call.

The cache reports each executor pod change as (previous record, new record); a pod that reaches phase Failed
on a node counts once as a failure there (OOMKilled, Evicted, a kubelet rejection or a non-zero exit: what
Spark's own excludeOnFailure counts, but kept across apps and app restarts). Failures are kept with the time
they happened on the injected monotonic clock, oldest first, and forgotten once older than the longest window
in force. The time is when the container terminated (its finishedAt, on the node's clock) when the pod says
so, else when the failure was seen: so that after an allocator restart the failures of the first list keep
their age instead of counting as new and excluding nodes for another whole window.
Thread-safe: the reflectors write, the HTTP threads read and prune old failures, one lock guards it all.
"""

from __future__ import annotations

import bisect
import collections
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sparkgate.contract import AppKey
from sparkgate.policy import Scheduling

from .model import PodRecord

ZONE_LABEL = "topology.kubernetes.io/zone"
Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Failure:
    at: float  # monotonic seconds
    app: AppKey
    node: str
    kind: str  # "OOMKilled", "Evicted", "exit 137", or the kubelet's reason for rejecting the pod


def failure_kind(record: PodRecord) -> str:
    """How an executor failed, as the FailedNodes message shows it."""
    if record.reason in ("OOMKilled", "Evicted"):
        return record.reason
    if record.exit_code not in (None, 0):
        return f"exit {record.exit_code}"
    return record.reason or "failed"


def _at(failure: Failure) -> float:
    return failure.at


def _live(record: PodRecord | None) -> bool:
    return (
        record is not None
        and record.node is not None
        and not record.deleting
        and record.phase in ("Pending", "Running")
    )


# Seconds a failure is kept while no policy is in force: failureWindowSeconds' default (sparkgate/policy.py).
DEFAULT_RETENTION = Scheduling().failure_window_seconds


class Placement:
    def __init__(
        self,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
        retention: Callable[[], float] = lambda: DEFAULT_RETENTION,
    ) -> None:
        self.monotonic = monotonic
        self.clock = clock  # wall clock: the age of a failure from its finishedAt
        # Seconds failures are kept: the longest window of the policy in force, asked at each use (the
        # first failures are listed before any scheduling request comes, and the policy may change).
        self.retention = retention
        self._lock = threading.Lock()
        self._failures: dict[str, collections.deque[Failure]] = {}  # node -> failures, oldest first
        self._by_app: dict[AppKey, collections.deque[Failure]] = {}  # the same, by app
        self.version = 0  # counts the failures seen: what is computed from them is stale when it changes
        self._counted: set[str] = set()  # uids of failed pods already counted
        self._executors: dict[AppKey, collections.Counter[str]] = {}  # app -> node -> live executors
        self._node_zone: dict[str, str] = {}
        self._nodes: frozenset[str] = frozenset()  # every node of the cluster
        self._driver_node: dict[AppKey, str] = {}
        self._driver_zone: dict[AppKey, str] = {}  # the driver pod's own zone label (k8s 1.35+ copies it)

    # --- feeds -------------------------------------------------------------------------------------------

    def observe(self, previous: PodRecord | None, current: PodRecord | None) -> None:
        """An executor pod changed (current None: it is gone)."""
        # Only for a failure (every executor event comes here), and before the lock: it asks the policy in
        # force, which reads the policy file now and then.
        failed = current is not None and current.phase == "Failed"
        retention = self.retention() if failed else 0.0
        with self._lock:
            if previous is not None and (current is None or previous.uid != current.uid):
                self._count(previous, -1)
                if current is None:
                    self._counted.discard(previous.uid)
                previous = None
            if current is None:
                return
            if _live(previous) != _live(current) or (previous and previous.node != current.node):
                self._count(previous, -1)
                self._count(current, +1)
            if failed and current.node and current.uid not in self._counted:
                # A finishedAt ahead of this clock (skew between nodes) counts as now.
                age = max(0.0, self.clock() - current.finished) if current.finished else 0.0
                if age >= retention:
                    return
                self._counted.add(current.uid)
                failure = Failure(self.monotonic() - age, current.app, current.node, failure_kind(current))
                bisect.insort(self._failures.setdefault(current.node, collections.deque()), failure, key=_at)
                bisect.insort(self._by_app.setdefault(current.app, collections.deque()), failure, key=_at)
                self.version += 1
                horizon = self.monotonic() - retention
                self._prune(self._failures, current.node, horizon)
                self._prune(self._by_app, current.app, horizon)
                if self.version % 256 == 0:  # now and then, forget the nodes and apps nobody asks about
                    for index in (self._failures, self._by_app):
                        for key in list(index):
                            self._prune(index, key, horizon)

    def _count(self, record: PodRecord | None, delta: int) -> None:
        if not _live(record):
            return
        assert record is not None and record.node is not None
        nodes = self._executors.setdefault(record.app, collections.Counter())
        nodes[record.node] += delta
        if nodes[record.node] <= 0:
            del nodes[record.node]
            if not nodes:
                del self._executors[record.app]

    def node_event(self, kind: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        zone = None if kind == "DELETED" else (meta.get("labels") or {}).get(ZONE_LABEL)
        with self._lock:
            if (kind == "DELETED") == (name in self._nodes):  # both replaced on change, read without lock
                self._nodes = self._nodes - {name} if kind == "DELETED" else self._nodes | {name}
            if self._node_zone.get(name) == zone:
                return  # most node events are status heartbeats
            zones = dict(self._node_zone)  # copied on change: readers keep a consistent mapping
            if zone:
                zones[name] = zone
            else:
                zones.pop(name, None)
            self._node_zone = zones

    def nodes_replace(self, items: Iterable[Obj]) -> None:
        zones, names = {}, set()
        for obj in items:  # one pass: the list comes page by page (Reflector._list)
            meta = obj.get("metadata") or {}
            names.add(meta.get("name", ""))
            zone = (meta.get("labels") or {}).get(ZONE_LABEL)
            if zone:
                zones[meta.get("name", "")] = zone
        with self._lock:
            self._node_zone = zones
            self._nodes = frozenset(names)

    def driver_event(self, kind: str, obj: Obj) -> None:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        app_id = (meta.get("labels") or {}).get("spark-app-selector")
        if not app_id:
            return
        key = AppKey(meta.get("namespace", ""), app_id)
        with self._lock:
            if kind == "DELETED":
                self._driver_node.pop(key, None)
                self._driver_zone.pop(key, None)
                return
            if spec.get("nodeName"):
                self._driver_node[key] = spec["nodeName"]
            zone = (meta.get("labels") or {}).get(ZONE_LABEL)
            if zone:
                self._driver_zone[key] = zone

    def drivers_replace(self, items: Iterable[Obj]) -> None:
        with self._lock:
            self._driver_node, self._driver_zone = {}, {}
        for obj in items:
            self.driver_event("ADDED", obj)

    # --- reading -----------------------------------------------------------------------------------------

    def _prune(self, index: dict[Any, collections.deque[Failure]], key: Any, horizon: float) -> None:
        """Forget the failures of `key` older than `horizon` (the monotonic time the retention reaches)."""
        failures = index.get(key)
        while failures and failures[0].at < horizon:
            failures.popleft()
        if failures is not None and not failures:
            del index[key]

    def failures(self, window: float) -> dict[str, list[Failure]]:
        """The failures seen within the last `window` seconds, by node (only nodes that have some)."""
        now = self.monotonic()
        since, horizon = now - window, now - self.retention()
        with self._lock:
            for node in list(self._failures):
                self._prune(self._failures, node, horizon)
            return {
                node: [f for f in failures if f.at >= since]
                for node, failures in self._failures.items()
                if failures[-1].at >= since
            }

    def app_failures(self, app: AppKey, window: float) -> list[Failure]:
        """The app's failures seen within the last `window` seconds, oldest first."""
        now = self.monotonic()
        since, horizon = now - window, now - self.retention()
        with self._lock:
            self._prune(self._by_app, app, horizon)
            return [f for f in self._by_app.get(app, ()) if f.at >= since]

    def executors(self, app: AppKey) -> Mapping[str, int]:
        """The app's live executors by node (a copy)."""
        with self._lock:
            return dict(self._executors.get(app, {}))

    def driver_zone(self, app: AppKey) -> str | None:
        with self._lock:
            node = self._driver_node.get(app)
            return self._driver_zone.get(app) or (self._node_zone.get(node) if node else None)

    def nodes(self) -> frozenset[str]:
        """Every node of the cluster, as the node watch last saw them."""
        return self._nodes

    def zones(self) -> Mapping[str, str]:
        """node -> zone, for the nodes that have a zone label (replaced, never changed: read only)."""
        with self._lock:
            return self._node_zone
