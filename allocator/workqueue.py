"""The apps waiting for a decision: a work queue keyed by app, in the manner of client-go's workqueue.

- De-duplication: an app added ten times before it is taken is decided once.
- One decision at a time per app: an app is "processing" from the moment it is taken until `done` (its
  actions carried out); an app added meanwhile is taken again after `done`, never concurrently.
- Requeue-after: `add_after` makes an app ready at a given time (the end of its batch delay); the times
  are kept in a heap, so a `get` costs per app ready, not per app waiting for its time.
- A batch period: `add(keys, delay)` makes each app ready `delay` after the first change of a burst, and
  the rest of the burst joins that decision. The loop is woken only when an app is due sooner than all
  before it, not at every event.
- An app added while it is processing or backing off waits apart from the ready ones (client-go's dirty set
  beside its queue), so a `get` costs per app ready, not per app added: the loop is woken at every
  immediate add, and scanning the apps the actor was still writing for at each wake was 13 % of the loop's CPU at 10,000
  pods (bench/scale.py).
- First in, first out, at most `limit` apps per `get`: a burst or a tick of thousands of apps is decided in
  bounded steps, the apps added first taken first.
- Per-app exponential backoff: `done(key, ok=False)` (a write failed: 403, 400, a create refused...) holds
  the app for `base * 2**(failures - 1)` seconds, capped at `cap`, whatever adds it meanwhile (a watch event,
  the periodic full decision): so a persistent failure costs one attempt per backoff period, not one per
  decision. `done(key, ok=True)` resets it.

Thread-safe: one condition variable, a leaf lock (nothing else is called while it is held).
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sparkgate.contract import AppKey


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: the delay after the n-th consecutive failure (n >= 1)."""

    base: float = 0.5
    cap: float = 60.0

    def delay(self, failures: int) -> float:
        return min(self.cap, self.base * 2.0 ** min(failures - 1, 64))


class WorkQueue:
    def __init__(self, backoff: Backoff, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.backoff = backoff
        self.monotonic = monotonic
        self._cond = threading.Condition()
        # Every app added and not yet taken is in exactly one of: `_ready` (in the order added), `_after_done`
        # (processing: ready at `done`) or `_after_hold` (backing off: ready when its hold ends).
        self._ready: dict[AppKey, None] = {}
        self._after_done: set[AppKey] = set()
        self._after_hold: set[AppKey] = set()
        self._processing: set[AppKey] = set()
        self._due: dict[AppKey, float] = {}  # requeue-after: ready at this monotonic time
        self._heap: list[tuple[float, AppKey]] = []  # (time, app) of `_due`, with stale entries skipped
        self._failures: dict[AppKey, int] = {}
        self._hold: dict[AppKey, float] = {}  # backing off until this monotonic time (kept until a success)
        self._holds: list[tuple[float, AppKey]] = []  # (time, app) of `_hold`, with stale entries skipped
        self._closed = False

    def add(self, keys: Iterable[AppKey], delay: float = 0.0) -> None:
        """The apps need a decision. With a `delay`, each is ready that long from now unless it is ready or
        due sooner already, so the changes that come within it are decided once (a batch period: client-go's
        `AddAfter`, as kube-controller-manager's job controller batches the pod updates of a Job,
        pkg/controller/job/job_controller.go `enqueueSyncJobBatched`)."""
        if delay > 0.0:
            self._add_batched(keys, self.monotonic() + delay)
            return
        with self._cond:
            now = self.monotonic() if self._hold else 0.0  # only a hold is compared with it
            for key in keys:
                self._mark(key, now)
            self._cond.notify()

    def _add_batched(self, keys: Iterable[AppKey], at: float) -> None:
        with self._cond:
            heap, due = self._heap, self._due
            first = heap[0][0] if heap else math.inf
            for key in keys:
                if key in self._ready or at >= due.get(key, math.inf):
                    continue
                due[key] = at
                heapq.heappush(heap, (at, key))
            if heap and heap[0][0] < first:
                self._cond.notify()  # the loop waits until the first app due: only an earlier one wakes it

    def _mark(self, key: AppKey, now: float) -> None:
        """The app needs a decision: ready, or after its processing or its hold (the lock held)."""
        if key in self._processing:
            self._after_done.add(key)
        elif self._hold.get(key, 0.0) > now:
            self._after_hold.add(key)
        else:
            self._ready[key] = None

    def add_after(self, key: AppKey, delay: float) -> None:
        at = self.monotonic() + max(0.0, delay)
        with self._cond:
            if at < self._due.get(key, math.inf):
                self._due[key] = at
                heapq.heappush(self._heap, (at, key))
            self._cond.notify()

    def get(self, timeout: float, limit: int | None = None) -> set[AppKey]:
        """The apps ready now (at most `limit`, the first added first), marked processing, waiting up to
        `timeout` for one; may be empty."""
        deadline = self.monotonic() + timeout
        with self._cond:
            while True:
                now = self.monotonic()
                heap = self._heap
                while heap and (heap[0][0] <= now or self._due.get(heap[0][1]) != heap[0][0]):
                    at, key = heapq.heappop(heap)
                    if self._due.get(key) == at:
                        del self._due[key]
                        self._mark(key, now)
                holds = self._holds
                while holds and (holds[0][0] <= now or self._hold.get(holds[0][1]) != holds[0][0]):
                    at, key = heapq.heappop(holds)
                    if key in self._after_hold and self._hold.get(key, 0.0) <= now:
                        self._after_hold.discard(key)
                        self._mark(key, now)
                ready = set(itertools.islice(self._ready, limit))
                if ready or self._closed or now >= deadline:
                    for k in ready:
                        del self._ready[k]
                    self._processing |= ready
                    return ready
                wake = min(deadline, heap[0][0] if heap else math.inf, holds[0][0] if holds else math.inf)
                self._cond.wait(max(0.0, wake - now))

    def done(self, key: AppKey, ok: bool | None = None) -> None:
        """The app's decision and actions are over. ok: True (writes done: backoff reset), False (a write
        failed: retried after the backoff), None (nothing was written)."""
        with self._cond:
            self._processing.discard(key)
            now = self.monotonic()
            if ok is True:
                self._failures.pop(key, None)
                self._hold.pop(key, None)
            elif ok is False:
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                at = self._hold[key] = now + self.backoff.delay(failures)
                heapq.heappush(self._holds, (at, key))
                self._after_done.add(key)  # decided again after its backoff
            if key in self._after_done:
                self._after_done.discard(key)
                self._mark(key, now)
            self._cond.notify()

    def forget(self, live: set[AppKey]) -> None:
        """Drop the backoff of apps that are gone."""
        with self._cond:
            for key in set(self._failures) - live - self._processing:
                self._failures.pop(key, None)
                self._hold.pop(key, None)
                if key in self._after_hold:
                    self._after_hold.discard(key)
                    self._ready[key] = None

    def failures(self) -> dict[AppKey, tuple[int, float]]:
        """Apps with consecutive failures: (failures, seconds left in their backoff)."""
        now = self.monotonic()
        with self._cond:
            return {k: (n, max(0.0, self._hold.get(k, now) - now)) for k, n in self._failures.items()}

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
