"""The work queue (allocator/workqueue.py) on an injected clock: de-duplication, one decision at a time per
app, requeue-after, and per-app exponential backoff that holds an app whatever adds it, capped, reset by a
success."""

from __future__ import annotations

import itertools
import threading

from allocator.workqueue import Backoff, WorkQueue
from sparkgate.contract import AppKey

A, B = AppKey("spark", "a"), AppKey("spark", "b")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def queue(base: float = 1.0, cap: float = 8.0) -> tuple[WorkQueue, Clock]:
    clock = Clock()
    return WorkQueue(Backoff(base, cap), monotonic=clock), clock


def test_backoff_doubles_and_is_capped() -> None:
    assert [Backoff(0.5, 10.0).delay(n) for n in range(1, 8)] == [0.5, 1, 2, 4, 8, 10, 10]
    assert Backoff(1.0, 60.0).delay(10_000) == 60.0


def test_adds_are_deduplicated_and_an_app_is_taken_once_at_a_time() -> None:
    q, _ = queue()
    q.add([A, A, B])
    q.add([A])
    assert q.get(0) == {A, B}
    q.add([A])  # changed while being decided: taken again only after done
    assert q.get(0) == set()
    q.done(A)
    q.done(B)
    assert q.get(0) == {A}
    q.done(A)
    assert q.get(0) == set()


def test_requeue_after_makes_an_app_ready_at_its_time() -> None:
    q, clock = queue()
    q.add_after(A, 5.0)
    q.add_after(A, 3.0)  # the earlier of two times
    clock.now = 2.9
    assert q.get(0) == set()
    clock.now = 3.0
    assert q.get(0) == {A}


def test_a_failure_holds_the_app_for_its_backoff_whatever_adds_it_then_success_resets() -> None:
    q, clock = queue(base=1.0, cap=4.0)
    q.add([A])
    attempts = []
    for _ in range(6):  # a persistent failure, the app re-added all the time (watch events, ticks)
        taken = set()
        while not taken:
            q.add([A])
            taken = q.get(0)
            if not taken:
                clock.now += 0.25
        attempts.append(clock.now)
        q.done(A, ok=False)
    assert [b - a for a, b in itertools.pairwise(attempts)] == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert q.failures() == {A: (6, 4.0)}
    clock.now += 4.0
    assert q.get(0) == {A}
    q.done(A, ok=True)
    assert q.failures() == {}
    q.add([A])
    assert q.get(0) == {A}  # no backoff left


def test_a_decision_without_writes_leaves_the_backoff_as_it_is() -> None:
    q, clock = queue(base=2.0)
    q.add([A])
    q.get(0)
    q.done(A, ok=False)
    clock.now = 2.0
    assert q.get(0) == {A}
    q.done(A)  # decided, nothing to write (e.g. the limits bind)
    assert q.failures() == {A: (1, 0.0)}
    q.forget({B})  # A is gone from the cluster: its backoff with it
    assert q.failures() == {}


def test_get_waits_for_an_add_from_another_thread_and_close_wakes_it() -> None:
    q = WorkQueue(Backoff())
    threading.Timer(0.05, q.add, args=([A],)).start()
    assert q.get(30) == {A}
    threading.Timer(0.05, q.close).start()
    assert q.get(30) == set()


def test_at_most_limit_apps_per_get_the_first_added_first() -> None:
    q, _ = queue()
    apps = [AppKey("spark", f"app-{i}") for i in range(10)]
    q.add(apps[:6])
    q.add(apps[6:])
    assert q.get(0, limit=4) == set(apps[:4])
    q.add([apps[0]])  # processing: it waits for done, and does not take a place in the next get
    assert q.get(0, limit=4) == set(apps[4:8])
    assert q.get(0, limit=4) == set(apps[8:])
    q.done(apps[0])
    assert q.get(0, limit=4) == {apps[0]}


def test_a_later_requeue_does_not_delay_an_earlier_one_and_many_wait_without_cost() -> None:
    q, clock = queue()
    waiting = [AppKey("spark", f"app-{i}") for i in range(1000)]
    for i, key in enumerate(waiting):
        q.add_after(key, 10.0 + i)
    q.add_after(A, 5.0)
    q.add_after(A, 9.0)  # later than the one it has: the earlier time stands
    clock.now = 5.0
    assert q.get(0) == {A}
    clock.now = 10.5
    assert q.get(0) == {waiting[0]}
    q.add_after(B, 20.0)
    q.add_after(B, 1.0)  # earlier: ready at 11.5, not at 30.5
    clock.now = 11.5
    assert q.get(0) == {waiting[1], B}


def test_a_batch_period_decides_the_changes_of_a_burst_once_from_its_first() -> None:
    q, clock = queue()
    q.add([A], 0.005)
    assert q.get(0) == set()  # within its batch period
    clock.now = 0.003
    q.add([A, B], 0.005)  # A's burst goes on: A stays due at 0.005, B's period begins
    clock.now = 0.005
    assert q.get(0) == {A}
    q.add([A], 0.005)  # changed while being decided: due at 0.010, taken after done
    clock.now = 0.008
    assert q.get(0) == {B}
    clock.now = 0.010
    assert q.get(0) == set()
    q.done(A)
    assert q.get(0) == {A}
    q.done(A)
    q.done(B)
    assert q.get(0) == set()


def test_an_app_ready_now_is_not_held_back_by_a_batch_period() -> None:
    q, clock = queue()
    q.add([A])  # a tick, a policy change: ready at once
    q.add([A], 0.005)
    assert q.get(0) == {A}
    q.done(A)
    clock.now = 1.0
    assert q.get(0) == set()  # the batched add joined the decision it was ready for


def test_get_waits_for_a_batched_add_from_another_thread() -> None:
    q = WorkQueue(Backoff())
    threading.Timer(0.05, q.add, args=([A], 0.01)).start()
    assert q.get(30) == {A}


def test_an_app_added_while_backing_off_is_ready_when_the_hold_ends_or_the_app_is_forgotten() -> None:
    q, clock = queue(base=2.0)
    q.add([A, B])
    assert q.get(0) == {A, B}
    q.done(A, ok=False)
    q.done(B, ok=False)
    q.add([A, B])  # a watch event during the backoff: waits for it
    clock.now = 1.0
    assert q.get(0) == set()
    q.forget({A})  # B is gone from the cluster: its backoff goes, its add stands
    assert q.get(0) == {B}
    clock.now = 2.0
    assert q.get(0) == {A}  # its hold ended: ready without another add
    assert q.failures() == {A: (1, 0.0)}
