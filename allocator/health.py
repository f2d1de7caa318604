"""Progress of the allocator's long-running threads, for `/healthz`.

Each reflector and the loop `beat` whenever they make progress (an event, a bookmark, a list, a retry; a
turn of the loop). A part that has not beaten for longer than `bound` is stalled: `/healthz` then fails, so
the kubelet restarts a wedged allocator, and turns healthy again by itself if the part recovers first. The
bound must exceed the longest normal silence: a watch with bookmarks hears from the API server about once a
minute and at the latest when its `timeoutSeconds` ends it.

Thread-safe: one leaf lock; every part beats from its own thread, the HTTP threads read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Health:
    def __init__(self, bound: float, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.bound = bound
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}

    def beat(self, part: str) -> None:
        now = self.monotonic()
        with self._lock:
            self._last[part] = now

    def stalled(self) -> dict[str, float]:
        """The parts that made no progress for longer than the bound, with the seconds since they did."""
        now = self.monotonic()
        with self._lock:
            return {part: now - at for part, at in sorted(self._last.items()) if now - at > self.bound}
