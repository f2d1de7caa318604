"""The one end-of-life rule (allocator/registry.py), on cache views and an injected clock."""

from __future__ import annotations

from dataclasses import replace

import msgspec

from allocator.cache import Cache
from allocator.model import AppView, DriverRecord, PodRecord, Snapshot
from allocator.registry import AppRegistry
from sparkgate.contract import LABEL_APP_ID, AppKey

KEY = AppKey("spark", "app")


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
    assert registry.observe(snap(running, pod(2)), 0) == set()
    # A running executor is a sign of life at every observation, even when nothing changes.
    assert registry.observe(snap(running, pod(2)), 1000) == set()
    # The JVM was killed: its executor failed, its gated pod stays forever (as on the real cluster).
    dead = snap(msgspec.structs.replace(running, phase="Failed"), pod(2))
    assert registry.observe(dead, 1001) == set()
    assert registry.observe(dead, 1299) == set()  # the grace runs from the last sign of life, seen at 1000
    assert registry.observe(dead, 1300) == {KEY} and KEY in registry.ended
    assert registry.observe(dead, 1400) == set()  # over once
    # Its pods gone from the cluster: nothing of it is kept.
    assert registry.observe(Snapshot({}, frozenset()), 1500) == set() and not registry.ended


def test_a_new_pod_is_a_sign_of_life_and_revives_a_client_mode_app() -> None:
    registry = AppRegistry(client_grace=10)
    registry.observe(snap(pod(1)), 0)
    assert registry.observe(snap(pod(1), pod(2)), 9) == set()  # a pod created: the grace starts again
    assert registry.observe(snap(pod(1), pod(2)), 18) == set()
    assert registry.observe(snap(pod(1), pod(2)), 19) == {KEY}
    assert registry.observe(snap(pod(1), pod(2), pod(3)), 20) == set() and KEY not in registry.ended
    # The loop learns of the revival once (its deletion history must not expire while it runs).
    assert registry.take_revived() == {KEY} and registry.take_revived() == set()
    assert registry.tracks(KEY) and not registry.tracks(AppKey("spark", "never-seen"))


def test_copies_alone_end_after_the_grace_and_a_cluster_mode_app_ends_with_its_driver() -> None:
    registry = AppRegistry(client_grace=10)
    assert registry.observe(snap(cms=True), 0) == set()
    assert registry.observe(snap(cms=True), 10) == {KEY}  # a copy left by an app gone before a restart
    registry = AppRegistry(client_grace=10)
    driver = DriverRecord("spark", "drv", "d", "app", "Running", False)
    assert registry.observe(snap(pod(1), driver=driver), 0) == set()
    assert registry.observe(snap(pod(1), driver=driver), 10_000) == set()  # a driver: no grace applies
    assert registry.observe(snap(pod(1), driver=replace(driver, phase="Succeeded")), 10_001) == {KEY}
    registry = AppRegistry(client_grace=10)
    assert registry.observe(snap(pod(1), seen=True), 0) == {KEY}  # its driver was seen and is gone


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
    registry.observe(snap(pod(1, gated=False, phase="Running")), 0)
    empty = Snapshot({}, frozenset())
    assert registry.observe(empty, 9) == set()
    assert registry.observe(snap(pod(1, gated=False, phase="Running")), 9) == set()  # back: one life
    assert registry.observe(empty, 18) == set()
    assert registry.observe(empty, 19) == {KEY}
    assert registry.observe(empty, 100) == set() and not registry.ended
