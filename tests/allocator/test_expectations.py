"""Expectations (allocator/expectations.py): a gate removal or a delete counts from the moment it is sent
until the watch shows it, is forgotten when the write failed, and expires if the watch never shows it."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from msgspec.structs import replace

from allocator.cache import Cache
from allocator.expectations import BindTimes, Expectations
from allocator.model import AppView, PodRecord, Release, Snapshot
from sparkgate.contract import GATE, LABEL_APP_ID, LABEL_EXEC_ID, AppKey

KEY = AppKey("spark", "a")


def pod(uid: str, *, gated: bool = True, deleting: bool = False, node: str | None = None) -> PodRecord:
    return PodRecord(
        "spark", f"a-{uid}", uid, "a", int(uid), "0", gated, "spark", node, "Pending", deleting, 0.0,
        gate_index=0 if gated else None,
    )  # fmt: skip


def releases(key: AppKey, *uids: str) -> list[Release]:
    """The gate removals of these pods, as the loop dispatches them."""
    return [
        Release(
            key,
            PodRecord(key.namespace, u, u, key.app_id, None, "0", True, "spark", None, "Pending", False, 0.0),
        )
        for u in uids
    ]


def snap(*pods: PodRecord) -> Snapshot:
    return Snapshot({KEY: AppView(KEY, pods, None, False, frozenset())}, frozenset())


def expect(e: Expectations, snapshot: Snapshot) -> Snapshot:
    return e.apply(snapshot, e.pending())


def pods_of(snapshot: Snapshot) -> dict[str, tuple[bool, bool]]:
    return {p.uid: (p.gated, p.deleting) for p in snapshot.apps[KEY].pods}


def test_a_release_counts_as_done_until_the_watch_shows_it() -> None:
    now = [0.0]
    e = Expectations(expiry=60, monotonic=lambda: now[0])
    s = snap(pod("1"), pod("2"))
    assert expect(e, s) is s  # nothing expected: the same snapshot
    e.released(releases(KEY, "1"))
    assert pods_of(expect(e, s)) == {"1": (False, False), "2": (True, False)}
    e.observe(pod("1"), replace(pod("1"), gated=False, gate_index=None))
    assert len(e) == 0 and pods_of(expect(e, s)) == {"1": (True, False), "2": (True, False)}


def test_a_failed_release_is_forgotten_and_an_unseen_one_expires() -> None:
    now = [0.0]
    e = Expectations(expiry=60, monotonic=lambda: now[0])
    e.released(releases(KEY, "1", "2"))
    e.answered(failed=["2"])
    assert pods_of(expect(e, snap(pod("1"), pod("2")))) == {"1": (False, False), "2": (True, False)}
    now[0] = 61  # a relist replaced the pod and the watch never showed the change: the cache wins again
    assert pods_of(expect(e, snap(pod("1"), pod("2")))) == {"1": (True, False), "2": (True, False)}
    assert len(e) == 0


def test_a_release_whose_answer_was_lost_counts_until_the_watch_says_and_only_what_it_shows_is_counted() -> (
    None
):
    """Issue 37: an unclear answer (none, a 5xx, a 422 after a lost one) leaves the pod released,
    unconfirmed: in flight for the budgets until the watch shows it (then it is a release, counted once,
    whether the watch came before or after the answer) or its expectation expires a minute after the answer
    (then it is none: the cache wins). A refused release is dropped at once; one gone while gated is none."""
    now = [0.0]
    confirmed: list[str] = []
    e = Expectations(expiry=60, monotonic=lambda: now[0], on_confirmed=lambda r: confirmed.append(r.pod.uid))
    s = snap(*(pod(str(i)) for i in range(1, 6)))
    e.released(releases(KEY, "1", "2", "3", "4", "5"))
    ungated = replace(pod("2"), gated=False, gate_index=None)
    e.observe(pod("2"), ungated)  # 2: the watch first, the answer (lost) after
    now[0] = 50
    e.answered(released=["5"], failed=["4"], unclear=["1", "2", "3"])
    assert confirmed == ["2"]  # 5 was accepted: the actor counts it at its answer, not here
    assert pods_of(expect(e, s)) == {
        "1": (False, False),  # unconfirmed: in flight
        "2": (True, False),  # the snapshot is older than the watch: nothing expected of it any more
        "3": (False, False),
        "4": (True, False),  # refused: gated
        "5": (False, False),  # accepted, not seen yet
    }
    e.observe(pod("1"), replace(pod("1"), gated=False, gate_index=None))  # the watch shows 1 released
    e.observe(pod("1"), replace(pod("1"), gated=False, gate_index=None))  # and again: counted once
    assert confirmed == ["2", "1"]
    now[0] = 105  # 3 is 55 s past its answer, 110 s past its dispatch: still counted
    assert pods_of(expect(e, s))["3"] == (False, False)
    now[0] = 111  # a minute after its answer, unseen: not released (the API server's request timeout)
    assert pods_of(expect(e, s))["3"] == (True, False)
    e.observe(pod("3"), replace(pod("3"), gated=False, gate_index=None))  # too late to count as ours
    assert confirmed == ["2", "1"] and len(e) == 0
    e.released(releases(KEY, "6"))
    e.answered(unclear=["6"])
    e.observe(pod("6"), None)  # gone while gated: no release
    assert confirmed == ["2", "1"] and len(e) == 0


def test_a_delete_counts_until_the_watch_shows_the_pod_deleting_or_gone() -> None:
    e = Expectations()
    e.deleted(KEY, "1")
    assert pods_of(expect(e, snap(pod("1")))) == {"1": (True, True)}
    e.observe(pod("1"), None)  # the watch: DELETED
    assert len(e) == 0
    e.deleted(KEY, "2")
    e.observe(pod("2"), pod("2", deleting=True))
    assert len(e) == 0


def test_release_to_bind_is_measured_once_when_the_pod_gets_a_node() -> None:
    seen: list[tuple[str, float]] = []
    now = [10.0]
    times = BindTimes(lambda ns, seconds: seen.append((ns, seconds)), clock=lambda: now[0])
    times.released("1")
    now[0] = 12.5
    times.observe(pod("1"), pod("1", gated=False))  # released, not bound yet
    times.observe(pod("1", gated=False), pod("1", gated=False, node="n1"))
    times.observe(pod("1", gated=False, node="n1"), pod("1", gated=False, node="n1"))
    assert seen == [("spark", 2.5)]


def test_the_expected_snapshot_keeps_the_in_flight_sums_and_touches_only_the_apps_written_to() -> None:
    other = AppKey("spark", "b")
    b_pod = replace(pod("9"), app_id="b", name="b-9")
    s = Snapshot(
        {
            KEY: AppView(KEY, (pod("1"), pod("2", gated=False)), None, False, frozenset()),
            other: AppView(other, (b_pod,), None, False, frozenset()),
        },
        frozenset(),
        {"spark": 1},
    )
    e = Expectations()
    e.released(releases(KEY, "1"))
    expected = expect(e, s)
    # a's release is in flight from the moment it is sent: the namespace's sum says 2, as a count would
    assert expected.in_flight_by_namespace() == {"spark": 2}
    assert expected.apps[KEY].counts.in_flight == 2 and expected.apps[KEY].counts.gated == 0
    assert expected.apps[other] is s.apps[other]  # an app nothing was written to is the cache's view
    e.deleted(KEY, "2")  # deleting: no longer in flight
    assert expect(e, s).in_flight_by_namespace() == {"spark": 1}


def test_expectations_expire_oldest_first() -> None:
    now = [0.0]
    e = Expectations(expiry=60, monotonic=lambda: now[0])
    e.released(releases(KEY, "1"))
    now[0] = 30
    e.released(releases(KEY, "2"))
    now[0] = 61  # the first is past its expiry, the second is not
    assert pods_of(expect(e, snap(pod("1"), pod("2")))) == {"1": (True, False), "2": (False, False)}
    assert len(e) == 1


def test_expectations_taken_before_the_snapshot_survive_a_watch_event_handled_in_between() -> None:
    """The loop takes the expectations, then the snapshot, then applies them: a watch event that drops an
    expectation between the two must not make the pod look gated again (it would be released twice:
    bench/scale.py's threaded run found it, 0.2 % of the releases at 10,000 pods)."""
    e = Expectations()
    e.released(releases(KEY, "1"))
    pending = e.pending()
    s = snap(pod("1"))  # a snapshot the watch's event had not reached yet
    e.observe(pod("1"), replace(pod("1"), gated=False, gate_index=None))  # the event, handled meanwhile
    assert len(e) == 0
    assert pods_of(e.apply(s, pending)) == {"1": (False, False)}  # still released, not gated


def executor(app: str, n: int, *, gated: bool = True, phase: str = "Pending") -> dict[str, Any]:
    """An executor pod as the cache reads it."""
    return {
        "metadata": {
            "name": f"{app}-exec-{n}", "namespace": "spark", "uid": f"{app}-{n}",
            "labels": {LABEL_APP_ID: app, LABEL_EXEC_ID: str(n)},
        },
        "spec": {"schedulingGates": [{"name": GATE}]} if gated else {"nodeName": "node-1"},
        "status": {"phase": phase},
    }  # fmt: skip


def reference(snapshot: Snapshot, pending: dict[AppKey, tuple[set[str], set[str]]]) -> dict[AppKey, Any]:
    """What the expected snapshot must show, computed from scratch: each app's pods (uid, gated, deleting)
    with its unseen writes made, and the in-flight pods per namespace."""
    apps = {}
    for key, view in snapshot.apps.items():
        released, deleted = pending.get(key, (set(), set()))
        apps[key] = sorted(
            (p.uid, p.gated and p.uid not in released, p.deleting or p.uid in deleted) for p in view.pods
        )
    return apps


def test_the_expected_views_kept_across_steps_follow_every_write_and_every_view_and_cost_per_change() -> None:
    """The loop's tracked snapshots (Cache.snapshot(track=True)) name the apps whose views changed, and the
    expectations name the apps whose writes changed: a step makes again the expected views of those apps
    only (bench/scale.py: thousands of apps with unseen writes at 100,000 pods), and what it shows is what a
    computation from scratch shows, through 400 random steps of writes, watch events and expiries."""
    rng = random.Random(19)
    now = [0.0]
    cache = Cache(lambda apps: None, lambda record, removed: None)
    e = Expectations(expiry=5, monotonic=lambda: now[0])
    cache.pod_observers.append(e.observe)
    apps = [f"app{i}" for i in range(12)]
    pods: dict[tuple[str, int], dict[str, Any]] = {}
    looked: list[AppKey] = []
    update = e._update

    def counted(key: AppKey, *args: Any) -> None:
        looked.append(key)
        update(key, *args)

    e._update = counted  # type: ignore[method-assign]
    for app in apps:
        for n in range(3):
            pods[(app, n)] = executor(app, n)
            cache.pod_event("ADDED", pods[(app, n)])
    followed = False  # whether the last step applied a tracked snapshot
    for step in range(400):
        touched: set[AppKey] = set()
        for _ in range(rng.randint(0, 3)):
            app, n = rng.choice(apps), rng.randint(0, 5)
            key, obj = AppKey("spark", app), pods.get((app, n))
            action = rng.choice(
                ["release", "delete", "fail", "unclear", "accepted", "watch ungated", "watch gone", "new pod"]
            )
            touched.add(key)
            if obj is None:
                pods[(app, n)] = executor(app, n)
                cache.pod_event("ADDED", pods[(app, n)])
            elif action == "release":
                e.released(releases(key, obj["metadata"]["uid"]))
            elif action == "delete":
                e.deleted(key, obj["metadata"]["uid"])
            elif action == "fail":
                e.answered(failed=[obj["metadata"]["uid"]])
            elif action == "unclear":
                e.answered(unclear=[obj["metadata"]["uid"]])
            elif action == "accepted":
                e.answered(released=[obj["metadata"]["uid"]])
            elif action == "watch ungated":
                pods[(app, n)] = executor(app, n, gated=False)
                cache.pod_event("MODIFIED", pods[(app, n)])
            else:
                del pods[(app, n)]
                cache.pod_event("DELETED", obj)
        if rng.random() < 0.05:
            now[0] += 3  # some writes expire (their watch events never came)
            touched |= {AppKey("spark", a) for a in apps}
        pending = e.pending()
        with e._lock:  # the reference: the writes as they are now (the snapshot below is taken after)
            writes = {k: (set(v[1]), set(v[2])) for k, v in e._apps.items()}
        tracked = rng.random() > 0.1  # now and then an untracked snapshot: the next step looks at every app
        observed = cache.snapshot(track=tracked)
        looked.clear()
        expected = e.apply(observed, pending)
        assert reference(expected, {}) == reference(observed, writes), f"step {step}"
        sums: Counter[str] = Counter()
        for view in expected.apps.values():
            sums["spark"] += view.counts.in_flight
        assert +Counter(expected.in_flight_by_namespace()) == +sums, f"step {step}"
        if tracked and followed:
            assert set(looked) <= touched, f"step {step}: looked at {set(looked) - touched}, unchanged"
        followed = tracked


def test_an_expected_copy_is_kept_while_its_pod_and_its_writes_stay_and_made_again_when_either_changes() -> (
    None
):
    e = Expectations()
    pods = [pod(str(i)) for i in range(1, 5)]
    e.released(releases(KEY, "1", "2", "3"))
    first = expect(e, snap(*pods)).apps[KEY].pods
    # The watch shows pod 1 released: the app's view is made again, the copies of 2 and 3 are the same.
    seen = replace(pods[0], gated=False, gate_index=None)
    e.observe(pods[0], seen)
    e.deleted(KEY, "3")  # and pod 3 is deleted: its copy changes
    second = expect(e, snap(seen, *pods[1:])).apps[KEY].pods
    assert second[0] is seen and second[1] is first[1] and second[3] is pods[3]
    assert (second[2].gated, second[2].deleting) == (False, True) and second[2] is not first[2]
    # A pod changed in the cache (another watch event) is copied from its new record, not the old copy.
    labelled = replace(pods[1], profile="etl")
    third = expect(e, snap(seen, labelled, *pods[2:])).apps[KEY].pods
    assert third[1] == replace(labelled, gated=False, gate_index=None) and third[2] is second[2]


def test_the_watch_event_of_its_own_release_decides_nothing_and_any_other_change_does() -> None:
    """The cache queues an app at each change of its pods, but not for the watch event of a gate removal the
    allocator made and its decisions already count (Expectations.confirms): that event changes nothing a
    decision reads. A gate removed by anyone else, or a release seen together with another change (the pod
    already bound), is news and queues the app."""
    queued: list[set[AppKey]] = []
    cache = Cache(queued.append, lambda record, removed: None)
    e = Expectations()
    cache.pod_observers.append(e.observe)
    cache.confirms = e.confirms
    key = AppKey("spark", "app")

    def released(n: int, **spec: Any) -> dict[str, Any]:
        obj = executor("app", n)
        obj["spec"] = dict(spec)
        return obj

    for n in range(3):
        cache.pod_event("ADDED", executor("app", n))
    assert queued == [{key}] * 3
    queued.clear()
    e.released(releases(key, "app-0", "app-2"))
    before = e.apply(cache.snapshot(), e.pending())

    cache.pod_event("MODIFIED", released(0))  # its own release, seen
    assert queued == []
    after = e.apply(cache.snapshot(), e.pending())
    assert after.apps[key].pods == before.apps[key].pods  # what the decision reads is the same
    assert after.in_flight_by_namespace() == before.in_flight_by_namespace() == {"spark": 2}
    assert e.pending().by_app[key][1] == {"app-2"}  # the write is seen: no longer expected

    cache.pod_event("MODIFIED", released(0, nodeName="node-1"))  # then bound: news
    cache.pod_event("MODIFIED", released(1))  # a gate removed by someone else (break-glass)
    cache.pod_event("MODIFIED", released(2, nodeName="node-1"))  # its release, and bound, in one event
    assert queued == [{key}] * 3
