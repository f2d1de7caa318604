"""A client-side request budget: client-go's token bucket (`flowcontrol.NewTokenBucketRateLimiter`, the
`--kube-api-qps` / `--kube-api-burst` of kube-controller-manager and kube-scheduler), so that the allocator
never sends the API server more than `qps` requests a second on average, `burst` at once.

The bucket holds up to `burst` tokens and refills at `qps` a second; each request takes one. A request that
finds none reserves the next one to come and sleeps until it is due (golang.org/x/time/rate's `Reserve`, on
which client-go's limiter is built): waiting requests are served in the order they asked, each in its own
slot, and none is refused. Time is injected (a monotonic clock and a sleep), so tests advance it by hand.
Thread-safe: the bucket's two numbers are under one leaf lock, and nobody sleeps holding it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs qps > 0 and burst >= 1, got qps {qps}, burst {burst}")
        self.qps = qps
        self.burst = burst
        self.monotonic = monotonic
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(burst)  # may go negative: tokens reserved by callers still sleeping
        self._at = monotonic()  # when _tokens was last brought up to date

    def reserve(self) -> float:
        """Take a token: how long to wait before it is due (0: at once)."""
        with self._lock:
            now = self.monotonic()
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1
            return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def wait(self) -> float:
        """Take a token, sleeping until it is due; the seconds slept."""
        delay = self.reserve()
        if delay > 0:
            self._sleep(delay)
        return delay
