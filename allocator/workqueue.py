"""The apps waiting for a decision: a work queue keyed by app, in the manner of client-go's workqueue.

- De-duplication: an app added ten times before it is taken is decided once.
- One decision at a time per app: an app is "processing" from the moment it is taken until `done` (its
  actions carried out); an app added meanwhile is taken again after `done`, never concurrently.
- Requeue-after: `add_after` makes an app ready at a given time (the end of its batch delay); the times
  are kept in a heap, so a `get` costs per app ready, not per app waiting for its time.
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
        self._dirty: dict[AppKey, None] = {}  # ready once not processing and not backing off; in order added
        self._processing: set[AppKey] = set()
        self._due: dict[AppKey, float] = {}  # requeue-after: ready at this monotonic time
        self._heap: list[tuple[float, AppKey]] = []  # (time, app) of `_due`, with stale entries skipped
        self._failures: dict[AppKey, int] = {}
        self._hold: dict[AppKey, float] = {}  # backing off until this monotonic time
        self._closed = False

    def add(self, keys: Iterable[AppKey]) -> None:
        with self._cond:
            self._dirty.update(dict.fromkeys(keys))
            self._cond.notify()

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
                        self._dirty[key] = None
                ready: set[AppKey] = set()
                for k in self._dirty:
                    if limit is not None and len(ready) >= limit:
                        break
                    if k not in self._processing and self._hold.get(k, 0.0) <= now:
                        ready.add(k)
                if ready or self._closed or now >= deadline:
                    for k in ready:
                        del self._dirty[k]
                    self._processing |= ready
                    return ready
                wake = min([deadline, *(self._hold[k] for k in self._dirty if k in self._hold)])
                if heap:  # its top is the next time due (stale entries were popped)
                    wake = min(wake, heap[0][0])
                self._cond.wait(max(0.0, wake - now))

    def done(self, key: AppKey, ok: bool | None = None) -> None:
        """The app's decision and actions are over. ok: True (writes done: backoff reset), False (a write
        failed: retried after the backoff), None (nothing was written)."""
        with self._cond:
            self._processing.discard(key)
            if ok is True:
                self._failures.pop(key, None)
                self._hold.pop(key, None)
            elif ok is False:
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                self._hold[key] = self.monotonic() + self.backoff.delay(failures)
                self._dirty[key] = None
            self._cond.notify()

    def forget(self, live: set[AppKey]) -> None:
        """Drop the backoff of apps that are gone."""
        with self._cond:
            for key in set(self._failures) - live - self._processing:
                self._failures.pop(key, None)
                self._hold.pop(key, None)

    def failures(self) -> dict[AppKey, tuple[int, float]]:
        """Apps with consecutive failures: (failures, seconds left in their backoff)."""
        now = self.monotonic()
        with self._cond:
            return {k: (n, max(0.0, self._hold.get(k, now) - now)) for k, n in self._failures.items()}

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
