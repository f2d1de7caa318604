"""The one end-of-life rule (allocator/registry.py), on cache views and an injected clock."""

from __future__ import annotations

from dataclasses import replace

import msgspec

from allocator.cache import Cache
from allocator.decision import HOLDS, AppSettings
from allocator.model import AppView, DriverRecord, Now, PodRecord, Snapshot
from allocator.registry import PLACES, AppRegistry
from sparkgate.contract import LABEL_APP_ID, AppKey
from sparkgate.policy import Allocation

KEY = AppKey("spark", "app")
WALL = 1_800_000_000.0  # the wall clock when the monotonic clock reads 0, unless a test steps it


def at(monotonic: float, wall_step: float = 0.0) -> Now:
    """Both clocks at `monotonic`, the wall clock stepped by `wall_step` (NTP, a VM resumed)."""
    return Now(monotonic, WALL + monotonic + wall_step)


def pod(i: int, *, gated: bool = True, phase: str = "Pending", created: float = 1000.0) -> PodRecord:
    return PodRecord(
        "spark", f"app-exec-{i}", f"uid-{i}", "app", i, "0", gated, "p", None, phase, False, created + i
    )


def snap(
    *pods: PodRecord, driver: DriverRecord | None = None, seen: bool = False, cms: bool = False
) -> Snapshot:
    view = AppView(KEY, pods, driver, seen or driver is not None, frozenset({"sg-app"} if cms else ()))
    return Snapshot({KEY: view}, frozenset())


def test_a_client_mode_app_ends_after_its_grace_with_no_sign_of_life() -> None:
    registry = AppRegistry(client_grace=300)
    running = pod(1, gated=False, phase="Running")
    assert registry.observe(snap(running, pod(2)), at(0)) == set()
    # A running executor is a sign of life at every observation, even when nothing changes.
    assert registry.observe(snap(running, pod(2)), at(1000)) == set()
    # The JVM was killed: its executor failed, its gated pod stays forever (as on the real cluster).
    dead = snap(msgspec.structs.replace(running, phase="Failed"), pod(2))
    assert registry.observe(dead, at(1001)) == set()
    assert (
        registry.observe(dead, at(1299)) == set()
    )  # the grace runs from the last sign of life, seen at 1000
    assert registry.observe(dead, at(1300)) == {KEY} and KEY in registry.ended
    assert registry.observe(dead, at(1400)) == set()  # over once
    # Its pods gone from the cluster: nothing of it is kept.
    assert registry.observe(Snapshot({}, frozenset()), at(1500)) == set() and not registry.ended


def test_a_new_pod_is_a_sign_of_life_and_revives_a_client_mode_app() -> None:
    registry = AppRegistry(client_grace=10)
    registry.observe(snap(pod(1)), at(0))
    assert registry.observe(snap(pod(1), pod(2)), at(9)) == set()  # a pod created: the grace starts again
    assert registry.observe(snap(pod(1), pod(2)), at(18)) == set()
    assert registry.observe(snap(pod(1), pod(2)), at(19)) == {KEY}
    assert registry.observe(snap(pod(1), pod(2), pod(3)), at(20)) == set() and KEY not in registry.ended
    # The loop learns of the revival once (its deletion history must not expire while it runs).
    assert registry.take_revived() == {KEY} and registry.take_revived() == set()
    assert registry.tracks(KEY) and not registry.tracks(AppKey("spark", "never-seen"))


def test_copies_alone_end_after_the_grace_and_a_cluster_mode_app_ends_with_its_driver() -> None:
    registry = AppRegistry(client_grace=10)
    assert registry.observe(snap(cms=True), at(0)) == set()
    assert registry.observe(snap(cms=True), at(10)) == {KEY}  # a copy left by an app gone before a restart
    registry = AppRegistry(client_grace=10)
    driver = DriverRecord("spark", "drv", "d", "app", "Running", False)
    assert registry.observe(snap(pod(1), driver=driver), at(0)) == set()
    assert registry.observe(snap(pod(1), driver=driver), at(10_000)) == set()  # a driver: no grace applies
    assert registry.observe(snap(pod(1), driver=replace(driver, phase="Succeeded")), at(10_001)) == {KEY}
    registry = AppRegistry(client_grace=10)
    assert registry.observe(snap(pod(1), seen=True), at(0)) == {KEY}  # its driver was seen and is gone


def test_the_cache_keeps_nothing_of_an_app_whose_objects_are_all_gone() -> None:
    """Issue 18: whether a driver was seen, and empty sets of copies, were kept forever."""
    cache = Cache(lambda apps: None, lambda record, removed: None)
    driver = {"metadata": {"name": "drv", "namespace": "spark", "uid": "d", "labels": {LABEL_APP_ID: "app"}}}
    copy = {"metadata": {"name": "sg-app", "namespace": "spark", "labels": {LABEL_APP_ID: "app"}}}
    cache.driver_event("ADDED", driver)
    cache.config_map_event("ADDED", copy, source=False)
    assert cache.snapshot().apps[KEY].driver_seen
    cache.driver_event("DELETED", driver)
    assert cache.snapshot().apps[KEY].driver_seen  # the copy is left: the app is still known, driver gone
    cache.config_map_event("DELETED", copy, source=False)
    assert KEY not in cache.snapshot().apps
    cache.config_map_event("ADDED", copy, source=False)  # the same app id again: nothing was remembered
    assert not cache.snapshot().apps[KEY].driver_seen


def test_an_app_gone_from_the_cluster_is_over_after_the_grace() -> None:
    """A client-mode app that stopped cleanly (Spark deleted its executors and copies): nothing of it is left
    in the cache, so nothing else would ever end it (its history would stay unfinished forever)."""
    registry = AppRegistry(client_grace=10)
    registry.observe(snap(pod(1, gated=False, phase="Running")), at(0))
    empty = Snapshot({}, frozenset())
    assert registry.observe(empty, at(9)) == set()
    assert registry.observe(snap(pod(1, gated=False, phase="Running")), at(9)) == set()  # back: one life
    assert registry.observe(empty, at(18)) == set()
    assert registry.observe(empty, at(19)) == {KEY}
    assert registry.observe(empty, at(100)) == set() and not registry.ended


def held(scope: str | None, *, refused: int = 0, overdue: int = 0) -> dict[AppKey, AppSettings]:
    """The last decision's settings of the app: what holds its gated pods, its refused pods in flight."""
    allocation = Allocation(batch_size=10, batch_delay_seconds=1, max_pending_per_app=20)
    return {KEY: AppSettings(allocation, scope and f"held by {scope}", None, scope, refused, overdue)}


def test_a_client_mode_app_sparkgate_holds_is_not_ended_and_the_grace_runs_once_nothing_holds_it() -> None:
    """Issue 37: a notebook whose executors are all gated because its namespace is at its cap shows no sign of
    life of its own; it was ended after the grace, its gated pods deleted, and it went to the back of the line
    when Spark created them again. While sparkgate holds it, the grace does not run; a truly dead app (nothing
    of sparkgate's holds it) is still ended within the grace."""
    registry = AppRegistry(client_grace=300)
    gated = snap(pod(1), pod(2))
    for t in range(0, 601, 60):  # ten minutes held by the namespace's cap, looked at every minute
        assert registry.observe(gated, at(t), settings=held("namespace")) == set(), t
    for scope in sorted(HOLDS):  # whatever of sparkgate's holds it: a budget, the pacing, a source
        assert registry.observe(gated, at(660), settings=held(scope)) == set()
    # Nothing of sparkgate's holds it now (its own limit binds, or its refusals): the grace runs from 660.
    assert registry.observe(gated, at(700), settings=held("app")) == set()
    assert registry.observe(gated, at(959), settings=held("unschedulable")) == set()
    assert registry.observe(gated, at(960), settings=held(None)) == {KEY}


def test_a_pod_refused_past_the_bound_is_no_sign_of_life() -> None:
    """A killed notebook whose released executors can never be scheduled kept them Pending, and 16 of its
    namespace's 60 slots, for as long as they stayed: a Pending pod was a sign of life. One the scheduler has
    refused for unschedulableSeconds (the decision counts them: `overdue`) is not."""
    registry = AppRegistry(client_grace=300)
    refused = snap(*(pod(i, gated=False) for i in range(1, 4)))  # released, Pending, refused
    assert registry.observe(refused, at(0), settings=held(None, refused=3)) == set()
    assert registry.observe(refused, at(500), settings=held(None, refused=3)) == set()  # young: alive
    assert registry.observe(refused, at(560), settings=held(None, refused=3, overdue=2)) == set()  # one young
    assert registry.observe(refused, at(600), settings=held(None, refused=3, overdue=3)) == set()
    assert registry.observe(refused, at(859), settings=held(None, refused=3, overdue=3)) == set()
    assert registry.observe(refused, at(860), settings=held(None, refused=3, overdue=3)) == {KEY}
    # A running executor is life whatever its other pods do.
    registry = AppRegistry(client_grace=300)
    running = snap(pod(1, gated=False, phase="Running"), pod(2, gated=False))
    assert registry.observe(running, at(0), settings=held(None, refused=1, overdue=1)) == set()
    assert registry.observe(running, at(1000), settings=held(None, refused=1, overdue=1)) == set()


def test_a_wall_clock_step_either_way_moves_no_end() -> None:
    """Issue 37: the grace ran on the wall clock; a forward step ended every client-mode app without a live
    released pod at once. It runs on the monotonic clock; the wall clock only says when the app ended."""
    for step in (3600.0, -3600.0):
        registry = AppRegistry(client_grace=300)
        dead = snap(pod(1))
        assert registry.observe(dead, at(0)) == set()
        assert registry.observe(dead, at(1, wall_step=step)) == set()  # the step: nothing ends
        assert registry.observe(dead, at(299, wall_step=step)) == set()
        assert registry.observe(dead, at(300, wall_step=step)) == {KEY}
        assert registry.ended[KEY] == WALL + 300 + step  # when it ended, as the histories record it


def test_an_ended_apps_place_is_kept_for_the_grace_and_for_a_bounded_number_of_apps() -> None:
    registry = AppRegistry(client_grace=300)
    registry.keep_place(KEY, 5.0, now=100.0)
    registry.keep_place(AppKey("spark", "never-waited"), None, now=100.0)  # nothing to keep
    assert registry.place(AppKey("spark", "never-waited")) is None
    assert registry.place(KEY) == 5.0 and registry.place(KEY) is None  # taken once
    registry.keep_place(KEY, 5.0, now=100.0)
    registry.observe(Snapshot({}, frozenset()), at(399))
    assert registry.place(KEY) == 5.0
    registry.keep_place(KEY, 5.0, now=100.0)
    registry.observe(Snapshot({}, frozenset()), at(400))  # the tick's look: kept for the grace only
    assert registry.place(KEY) is None
    for i in range(PLACES + 1):
        registry.keep_place(AppKey("spark", f"app-{i}"), float(i), now=500.0)
    assert registry.place(AppKey("spark", "app-0")) is None  # the oldest kept went first
    assert registry.place(AppKey("spark", f"app-{PLACES}")) == float(PLACES)


def test_an_app_that_appears_is_seen_then_one_there_at_the_first_look_is_not() -> None:
    registry = AppRegistry(client_grace=300)
    registry.observe(snap(pod(1)), at(10))
    assert registry.seen(KEY) is None  # there before the registry looked: its age is its pods'
    other = AppKey("spark", "other")
    later = Snapshot(
        {
            KEY: snap(pod(1)).apps[KEY],
            other: AppView(other, (pod(9),), None, False, frozenset()),
        },
        frozenset(),
    )
    registry.observe(later, at(20), [other])
    assert registry.seen(other) == 20.0
