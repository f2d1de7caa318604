"""Kubernetes Events that do not flood: one Event object per series, its count and lastTimestamp patched.

sparkgate records Events the way client-go's EventRecorder does (k8s.io/client-go/tools/record,
`events_cache.go` EventCorrelator and `event.go` recordToSink), so that a condition that lasts (a pod
admitted without sparkgate, a profile the API server refuses) is one Event object, not one per report:

- dedup (eventLogger): an event of the same involved object, type, reason and series as one already
  recorded updates that Event: a PATCH (`application/strategic-merge-patch+json`) of `count`,
  `lastTimestamp` and `message`, exactly the three fields client-go's two-way merge patch carries; a PATCH
  answered 404 (the Event expired or was deleted) creates it again, as recordEvent does. A new one is
  created with client-go's name, `<involved object name>.<unix nanoseconds in hex>` (makeEvent). The
  series is client-go's message unless the caller names one: events of one series differ only by their
  message, which the PATCH replaces (as events.k8s.io's EventSeries keys isomorphic events without their
  note, k8s.io/client-go/tools/events). Every sparkgate event names its series, so the EventAggregator of
  client-go (10 distinct messages in 10 minutes folded into one "(combined from similar events)") would
  never fire here and is not copied.
- counting: client-go adds 1 per report. A caller that counts the occurrences itself (the allocator's
  bypassed pods of an app) gives the count; a report that changes neither the count nor the message is
  then not a new occurrence and writes nothing.
- spam filter (EventSourceObjectSpamFilter): a token bucket per involved object, burst 25, refilled one
  token per 300 s (defaultSpamBurst, defaultSpamQPS); a report the bucket refuses is counted but not
  written, so the next write carries the whole count (EventCorrelate observes before it filters).
- memory: both caches are LRUs of 4,096 entries (maxLruCacheEntries).

Unlike client-go, a failed write is not retried (an Event is best effort and the callers are the
allocator's actor threads and the probe, which must not wait 10 s between tries): it is logged and the
next report of the series tries again; a create whose answer was lost is patched by that report (404:
created then). A recorder whose client is the leader's (`Kube.gated`) records nothing once leadership has
lapsed: no request, no token of the spam filter or of the client's budget, no warning per report (the next
leader reports what still holds).

Two injected clocks. The spam filter's buckets refill on the monotonic one, as client-go's do (Go's
time.Now carries a monotonic reading, which the durations of its rate limiter use): a step of the wall clock
(NTP, a VM resumed) neither refills a bucket at once (forward: a burst of writes) nor withholds the refill
that is due (backward). The wall clock only stamps what an Event says (first/lastTimestamp, client-go's name).

Threading: the caches (series and buckets) are owned by the recorder and guarded by its lock, held for
bookkeeping only, never during a request; any thread may record (the actor's threads, the probe's task).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sparkgate import contract
from sparkgate.kube import Kube, KubeError, NotFound, NotLeading

log = logging.getLogger(__name__)

Obj = dict[str, Any]
K = TypeVar("K")
V = TypeVar("V")

CACHE_ENTRIES = 4096  # client-go maxLruCacheEntries
SPAM_BURST = 25  # client-go defaultSpamBurst
SPAM_REFILL_SECONDS = 300.0  # client-go defaultSpamQPS = 1/300
MESSAGE_MAX = 1024  # the API server's limit on an Event's message (validation of core/v1 Event)
STRATEGIC = "application/strategic-merge-patch+json"


def stamp(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(
    involved: Obj,
    *,
    name: str,
    reason: str,
    message: str,
    type: str,
    identity: str,
    at: float,
    count: int = 1,
) -> Obj:
    """A core/v1 Event about `involved` (an ObjectReference) as sparkgate's allocator reports it, to POST to
    the involved object's namespace. The message is cut to the API server's 1,024-character limit."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": involved["namespace"]},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:MESSAGE_MAX],
        "type": type,
        "source": {"component": contract.ALLOCATOR_SERVICE_ACCOUNT},
        "reportingComponent": "sparkgate.io/allocator",
        "reportingInstance": identity,
        "firstTimestamp": stamp(at),
        "lastTimestamp": stamp(at),
        "count": count,
    }


class _Lru(Generic[K, V]):
    """A dict of at most `size` entries that forgets the least recently used (groupcache's lru)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class _Logged:
    """What the recorder knows of one Event object it wrote (client-go's eventLog)."""

    name: str
    count: int
    message: str
    written: bool  # the last observation reached the server (not held back by the spam filter)


@dataclass
class _Bucket:
    """A token bucket (flowcontrol.NewTokenBucketRateLimiter): `tokens` at monotonic time `at`."""

    tokens: float
    at: float


class EventRecorder:
    def __init__(
        self,
        kube: Kube,
        *,
        identity: str = contract.ALLOCATOR_SERVICE_ACCOUNT,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        cache_entries: int = CACHE_ENTRIES,
        burst: int = SPAM_BURST,
        refill_seconds: float = SPAM_REFILL_SECONDS,
    ) -> None:
        self.kube = kube
        self.identity = identity
        self.wall = wall  # what the Events say: their timestamps and names
        self.monotonic = monotonic  # the spam filter's refills
        self.burst = burst
        self.refill_seconds = refill_seconds
        self._lock = threading.Lock()
        self._logged: _Lru[tuple[str, ...], _Logged] = _Lru(cache_entries)
        self._buckets: _Lru[tuple[str, ...], _Bucket] = _Lru(cache_entries)
        self._last_nanos = 0

    def record(
        self,
        involved: Obj,
        *,
        type: str,
        reason: str,
        message: str,
        series: str | None = None,
        count: int | None = None,
    ) -> bool:
        """Report an event about `involved` (an ObjectReference with namespace and name, uid when known).
        `count`: the occurrences the caller counted itself (None: one more). True when a request was sent
        and went through; False, quietly, when this replica may not write (its leadership lapsed)."""
        if not self.kube.may_write():
            return False
        message = message[:MESSAGE_MAX]
        target = _object_key(involved)
        key = (*target, type, reason, message if series is None else series)
        now, elapsed_at = self.wall(), self.monotonic()
        with self._lock:
            logged = self._logged.get(key)
            if (
                logged is not None
                and logged.written
                and count is not None
                and (count, message) == (logged.count, logged.message)
            ):
                return False  # the caller's count and message are those written: nothing new to say
            new_count = count if count is not None else (logged.count + 1 if logged else 1)
            name = logged.name if logged is not None else self._name(involved["name"], now)
            observed = _Logged(name, new_count, message, written=False)
            self._logged.put(key, observed)
            if not self._take(target, elapsed_at):
                return False  # counted; the next write carries the count
            observed.written = True
        namespace = involved["namespace"]
        try:
            if logged is not None:
                patch = {"count": new_count, "lastTimestamp": stamp(now), "message": message}
                try:
                    self.kube.request(
                        "PATCH",
                        f"/api/v1/namespaces/{namespace}/events/{name}",
                        body=patch,
                        content_type=STRATEGIC,
                        retry=False,
                    )
                    return True
                except NotFound:
                    pass  # the Event is gone (expired after the API server's --event-ttl): create it again
            body = event_body(
                involved,
                name=name,
                reason=reason,
                message=message,
                type=type,
                identity=self.identity,
                at=now,
                count=new_count,
            )
            self.kube.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body, retry=False)
            return True
        except KubeError as e:
            if isinstance(e, NotLeading):  # lapsed while this report was on its way: no warning
                log.debug("event %s on %s/%s not recorded: %s", reason, namespace, involved["name"], e)
            else:
                log.warning("event %s on %s/%s not recorded: %s", reason, namespace, involved["name"], e)
            with self._lock:
                observed.written = False  # the next report of the series writes it
            return False

    def _name(self, object_name: str, now: float) -> str:
        """client-go's `<name>.<hex unix nanos>`, kept strictly increasing so that two events of one object
        at the same instant of an injected (or coarse) clock never share a name."""
        nanos = max(int(now * 1e9), self._last_nanos + 1)
        self._last_nanos = nanos
        return f"{object_name}.{nanos:x}"

    def _take(self, target: tuple[str, ...], now: float) -> bool:
        """One token of the object's bucket, if it has one."""
        bucket = self._buckets.get(target)
        if bucket is None:
            bucket = _Bucket(float(self.burst), now)
        refilled = min(float(self.burst), bucket.tokens + max(0.0, now - bucket.at) / self.refill_seconds)
        allowed = refilled >= 1.0
        self._buckets.put(target, _Bucket(refilled - 1.0 if allowed else refilled, now))
        return allowed

    def cached(self) -> tuple[int, int]:
        """(Event series, objects) the recorder remembers: each at most `cache_entries`."""
        with self._lock:
            return len(self._logged), len(self._buckets)


def _object_key(involved: Obj) -> tuple[str, ...]:
    """client-go's getSpamKey without the source (one recorder, one source)."""
    return tuple(str(involved.get(k) or "") for k in ("kind", "namespace", "name", "uid", "apiVersion"))
