"""Progress of the allocator's long-running threads, for `/healthz`.

Each reflector, the loop and the leader thread `beat` whenever they make progress (an event, a bookmark, a
list, a retry; a turn of the loop; a turn of the Lease, won or not). A part that has not beaten for longer
than its bound is stalled: `/healthz` then fails, so the kubelet restarts a wedged allocator, and turns
healthy again by itself if the part recovers first. The bound must exceed the longest normal silence: a
watch with bookmarks hears from the API server about once a minute and at the latest when its
`timeoutSeconds` ends it (`bound`); the leader thread turns every retry period, and a turn ends within the
renew deadline (its requests time out), so it gets a bound of its own (`bounds`, e.g. lease duration plus
renew deadline, as client-go's leader-election health check allows).

Thread-safe: one leaf lock; every part beats from its own thread, the HTTP threads read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping


class Health:
    def __init__(
        self,
        bound: float,
        *,
        bounds: Mapping[str, float] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bound = bound
        self.bounds = dict(bounds or {})
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}

    def beat(self, part: str) -> None:
        now = self.monotonic()
        with self._lock:
            self._last[part] = now

    def stalled(self) -> dict[str, float]:
        """The parts that made no progress for longer than their bound, with the seconds since they did."""
        now = self.monotonic()
        with self._lock:
            return {
                part: now - at
                for part, at in sorted(self._last.items())
                if now - at > self.bounds.get(part, self.bound)
            }
