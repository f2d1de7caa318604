"""The token bucket with an injected clock: `burst` at once, then `qps` a second, waiting callers each in their
own slot, and unused time refilling the bucket only up to `burst`."""

from __future__ import annotations

import threading

import pytest

from sparkgate.ratelimit import TokenBucket


class Clock:
    """A monotonic clock that a sleep advances: what the bucket sees is what it waited."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_burst_goes_at_once_then_one_request_per_token() -> None:
    clock = Clock()
    bucket = TokenBucket(10, 3, monotonic=clock, sleep=clock.sleep)
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    # The next callers, without sleeping (reserve only): each one 0.1 s after the one before.
    assert [round(bucket.reserve(), 9) for _ in range(3)] == [0.1, 0.2, 0.3]
    clock.now += 0.3  # their tokens came: the bucket is empty again, not in debt
    assert round(bucket.reserve(), 9) == 0.1


def test_wait_sleeps_until_the_token_is_due_and_the_rate_holds_over_time() -> None:
    clock = Clock()
    bucket = TokenBucket(50, 100, monotonic=clock, sleep=clock.sleep)
    start = clock.now
    for _ in range(100 + 500):
        bucket.wait()
    # 100 at once, then 500 at 50 a second: 10 s, and nothing slept in the burst.
    assert clock.now - start == pytest.approx(10.0)
    assert len(clock.slept) == 500 and all(s == pytest.approx(0.02) for s in clock.slept)


def test_idle_time_refills_the_bucket_only_up_to_burst() -> None:
    clock = Clock()
    bucket = TokenBucket(5, 2, monotonic=clock, sleep=clock.sleep)
    bucket.wait(), bucket.wait()
    clock.now += 3600  # an hour idle: 2 tokens, not 18,000
    assert [bucket.reserve() for _ in range(2)] == [0.0, 0.0]
    assert bucket.reserve() == pytest.approx(0.2)


def test_callers_on_many_threads_each_get_a_slot_of_their_own() -> None:
    """200 threads reserve at the same instant: the delays are exactly 0 (burst of 20), then 1/qps apart,
    each handed out once (no two callers share a slot, none is skipped)."""
    clock = Clock()
    bucket = TokenBucket(100, 20, monotonic=clock, sleep=clock.sleep)
    delays: list[float] = []
    lock = threading.Lock()
    go = threading.Barrier(200)

    def caller() -> None:
        go.wait()
        delay = bucket.reserve()
        with lock:
            delays.append(delay)

    threads = [threading.Thread(target=caller) for _ in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(round(d * 100) for d in delays) == [0] * 20 + list(range(1, 181))


def test_a_bucket_that_cannot_hand_out_tokens_is_refused() -> None:
    with pytest.raises(ValueError, match="qps > 0 and burst >= 1, got qps 0, burst 5"):
        TokenBucket(0, 5)
    with pytest.raises(ValueError, match="got qps 5, burst 0"):
        TokenBucket(5, 0)
