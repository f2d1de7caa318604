"""The cache's snapshots (allocator/cache.py): each is immutable whatever the reflectors do after it, and it is
made per app that changed: the views of the apps that did not change are shared with the snapshot before,
not copied (a persistent map), and an app the cluster no longer holds anything of leaves the next one."""

from __future__ import annotations

import dataclasses
import gc
from typing import Any

from allocator.cache import Cache
from sparkgate.contract import AppKey

from .test_dispatch import executor

A, B = AppKey("spark", "app-a"), AppKey("spark", "app-b")


def synced(pods: list[dict[str, Any]]) -> Cache:
    cache = Cache(lambda apps: None, lambda record, removed: None)
    cache.pods_replace(pods)
    cache.drivers_replace([])
    cache.config_maps_replace([], source=True)
    cache.config_maps_replace([], source=False)
    return cache


def released(app: str, exec_id: int) -> dict[str, Any]:
    pod = executor(app, exec_id)
    del pod["spec"]["schedulingGates"]
    return pod


def test_a_snapshot_stays_as_taken_while_the_cache_changes() -> None:
    cache = synced([executor(app, i) for app in ("app-a", "app-b") for i in (1, 2)])
    before = cache.snapshot()
    cache.pod_event("MODIFIED", released("app-a", 1))
    cache.pod_event("DELETED", executor("app-b", 1))
    cache.pod_event("DELETED", executor("app-b", 2))
    after = cache.snapshot()
    assert before.apps[A].counts.gated == 2 and before.in_flight_by_namespace() == {}
    assert set(before.apps) == {A, B}
    assert after.apps[A].counts.gated == 1 and after.apps[A].counts.in_flight == 1
    assert set(after.apps) == {A}  # nothing of app-b is left
    assert after.in_flight_by_namespace() == {"spark": 1}


def test_a_snapshot_shares_the_views_of_the_apps_that_did_not_change() -> None:
    cache = synced([executor(f"app-{n}", i) for n in range(500) for i in (1, 2)])
    first = cache.snapshot()
    assert cache.snapshot().apps is first.apps  # nothing changed: the same map, nothing rebuilt or copied
    cache.pod_event("MODIFIED", released("app-7", 1))
    second = cache.snapshot()
    changed = {k for k in second.apps if second.apps[k] is not first.apps[k]}
    assert changed == {AppKey("spark", "app-7")}


def test_a_relist_without_an_app_drops_its_view_and_its_share_of_the_budget() -> None:
    cache = synced([released("app-a", 1), released("app-b", 1)])
    assert cache.snapshot().in_flight_by_namespace() == {"spark": 2}
    cache.pods_replace([released("app-b", 1)])  # the watch was gone too long: app-a went meanwhile
    after = cache.snapshot()
    assert set(after.apps) == {B} and after.in_flight_by_namespace() == {"spark": 1}


def test_the_cache_s_records_are_left_out_of_the_cyclic_gc() -> None:
    """A record holds only strings, numbers, None and a tuple of strings: the cache hands the GC none of its
    per-pod records to walk at each full collection (model.py `untracked`). CPython itself would track them
    (a dataclass instance always is), and at 100,000 pods they were half of what a collection walked."""
    cache = synced([executor("app-a", 1), executor("app-a", 2)])
    cache.pod_event("MODIFIED", released("app-a", 1))
    held = cache.snapshot().apps[A].pods
    assert len(held) == 2 and not any(gc.is_tracked(record) for record in held)
    assert gc.is_tracked(dataclasses.replace(held[0]))
