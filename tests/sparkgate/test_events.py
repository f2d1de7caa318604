"""sparkgate/events.py against kubesim over HTTP: client-go's EventCorrelator behaviour
(k8s.io/client-go/tools/record/events_cache.go): one Event object per series whose count, lastTimestamp and
message are patched, client-go's Event names, a token bucket per object (burst 25, one more per 300 s),
an Event that is gone created again, and caches that stay within their bound. Both clocks are injected: the
wall clock stamps the Events, the monotonic one refills the buckets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kubesim.cluster import Cluster
from sparkgate import contract
from sparkgate.events import EventRecorder, stamp
from sparkgate.kube import Kube

Obj = dict[str, Any]
POD = {"apiVersion": "v1", "kind": "Pod", "name": "app-exec-1", "namespace": "spark", "uid": "u-1"}


class Clocks:
    """The recorder's two clocks: the wall clock (`now`, what the Events say) and the monotonic one."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.25
        self.elapsed = 1000.0

    def wall(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.elapsed

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.elapsed += seconds

    def recorder(self, kube: Kube, **options: Any) -> EventRecorder:
        return EventRecorder(kube, wall=self.wall, monotonic=self.monotonic, **options)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(nodes=1) as c:
        c.add_namespace("spark")
        yield c


@pytest.fixture
def kube(cluster: Cluster) -> Iterator[Kube]:
    for event in cluster.store.list_objects("events", "spark")[0]:
        cluster.store.delete("events", "spark", event["metadata"]["name"])
    client = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
    yield client
    client.close()


def events(cluster: Cluster) -> list[Obj]:
    items, _, _ = cluster.store.list_objects("events", "spark")
    return sorted(items, key=lambda e: e["metadata"]["name"])


def writes(cluster: Cluster, since: int) -> list[tuple[str, str | None]]:
    return [
        (e.verb, e.name)
        for e in cluster.requests.entries()[since:]
        if e.resource == "events" and e.user == contract.ALLOCATOR_USER
    ]


def test_a_repeated_event_is_one_object_patched_with_its_count_and_last_timestamp(
    cluster: Cluster, kube: Kube
) -> None:
    clock = Clocks()
    recorder = clock.recorder(kube, identity="pod-a")
    since = len(cluster.requests.entries())
    first = clock.now
    for _ in range(3):
        assert recorder.record(POD, type="Warning", reason="Waiting", message="waiting: room")
        clock.advance(10)
    [event] = events(cluster)
    name = f"app-exec-1.{int(first * 1e9):x}"  # client-go makeEvent: <name>.<hex unix nanos>
    assert event["metadata"]["name"] == name
    assert event["count"] == 3 and event["message"] == "waiting: room"
    assert event["firstTimestamp"] == stamp(first) and event["lastTimestamp"] == stamp(first + 20)
    assert event["involvedObject"] == POD and event["reportingInstance"] == "pod-a"
    assert writes(cluster, since) == [("create", None), ("patch", name), ("patch", name)]


def test_a_series_keeps_one_object_whose_message_is_replaced_and_messages_alone_are_apart(
    cluster: Cluster, kube: Kube
) -> None:
    recorder = Clocks().recorder(kube)
    recorder.record(POD, type="Normal", reason="Waiting", message="1/20 in flight", series="app/waiting")
    recorder.record(POD, type="Normal", reason="Waiting", message="2/20 in flight", series="app/waiting")
    [event] = events(cluster)
    assert (event["count"], event["message"]) == (2, "2/20 in flight")
    recorder.record(POD, type="Normal", reason="Other", message="a")
    recorder.record(POD, type="Normal", reason="Other", message="b")
    assert [(e["reason"], e["message"], e["count"]) for e in events(cluster)] == [
        ("Waiting", "2/20 in flight", 2),
        ("Other", "a", 1),
        ("Other", "b", 1),
    ]


def test_a_count_from_the_caller_is_written_only_when_it_or_the_message_changes(
    cluster: Cluster, kube: Kube
) -> None:
    recorder = Clocks().recorder(kube)
    since = len(cluster.requests.entries())
    report = {"type": "Warning", "reason": "BypassedWebhook", "series": "bypassed"}
    assert recorder.record(POD, message="500 pods", count=500, **report)
    assert not recorder.record(POD, message="500 pods", count=500, **report)
    assert recorder.record(POD, message="501 pods", count=501, **report)
    [event] = events(cluster)
    assert (event["count"], event["message"]) == (501, "501 pods")
    assert [verb for verb, _ in writes(cluster, since)] == ["create", "patch"]


def test_the_spam_filter_lets_25_through_then_one_per_300s_and_the_next_write_carries_the_count(
    cluster: Cluster, kube: Kube
) -> None:
    clock = Clocks()
    recorder = clock.recorder(kube)
    since = len(cluster.requests.entries())
    sent = [recorder.record(POD, type="Normal", reason="Waiting", message="same") for _ in range(30)]
    assert sent == [True] * 25 + [False] * 5
    # Another object has a bucket of its own.
    other = {**POD, "name": "app-exec-2", "uid": "u-2"}
    assert recorder.record(other, type="Normal", reason="Waiting", message="same")
    clock.advance(299)
    assert not recorder.record(POD, type="Normal", reason="Waiting", message="same")
    clock.advance(1)  # 300 s after the burst: one token
    assert recorder.record(POD, type="Normal", reason="Waiting", message="same")
    assert not recorder.record(POD, type="Normal", reason="Waiting", message="same")
    [event] = [e for e in events(cluster) if e["involvedObject"]["name"] == "app-exec-1"]
    assert event["count"] == 32, "every report is counted, written or not"
    assert len(writes(cluster, since)) == 27


@pytest.mark.parametrize("step", [3600.0, -3600.0], ids=["forward", "backward"])
def test_a_step_of_the_wall_clock_neither_bursts_nor_starves_the_spam_filter(
    cluster: Cluster, kube: Kube, step: float
) -> None:
    """The buckets refill on the monotonic clock; the wall clock (NTP, a VM resumed) only stamps the Events.
    An hour's step halfway between the burst and the next token: forward, still no token (timed on the wall
    clock, 12 came at once); backward, the token comes 300 s after the burst all the same (on the wall
    clock, the half token due was lost and the next came 150 s late)."""
    clock = Clocks()
    recorder = clock.recorder(kube)
    same = {"type": "Normal", "reason": "Waiting", "message": "same"}
    assert all(recorder.record(POD, **same) for _ in range(25))
    clock.advance(150)
    clock.now += step
    assert not any(recorder.record(POD, **same) for _ in range(5)), "no burst"
    clock.advance(150)  # 300 s after the burst on the monotonic clock
    assert recorder.record(POD, **same), "the token that is due"
    assert not recorder.record(POD, **same)
    [event] = events(cluster)
    assert event["count"] == 25 + 5 + 1, "every report counted, the last one not yet written"
    assert event["lastTimestamp"] == stamp(clock.now)  # the wall clock, as it was stepped


def test_an_event_that_is_gone_is_created_again_with_its_count(cluster: Cluster, kube: Kube) -> None:
    clock = Clocks()
    recorder = clock.recorder(kube)
    recorder.record(POD, type="Warning", reason="Waiting", message="m")
    [event] = events(cluster)
    cluster.store.delete("events", "spark", event["metadata"]["name"])  # the API server's --event-ttl
    clock.advance(1)
    assert recorder.record(POD, type="Warning", reason="Waiting", message="m")
    [again] = events(cluster)
    assert again["metadata"]["name"] == event["metadata"]["name"] and again["count"] == 2


def test_events_of_one_object_at_one_instant_get_names_of_their_own(cluster: Cluster, kube: Kube) -> None:
    recorder = Clocks().recorder(kube)
    for reason in ("A", "B", "C"):
        assert recorder.record(POD, type="Normal", reason=reason, message="m")
    assert len({e["metadata"]["name"] for e in events(cluster)}) == 3


def test_the_caches_stay_within_their_bound_and_a_forgotten_series_starts_again(
    cluster: Cluster, kube: Kube
) -> None:
    recorder = Clocks().recorder(kube, cache_entries=3)
    for i in range(5):
        pod = {**POD, "name": f"app-exec-{i}", "uid": f"u-{i}"}
        recorder.record(pod, type="Normal", reason="Waiting", message="m")
    assert recorder.cached() == (3, 3)
    recorder.record({**POD, "name": "app-exec-0", "uid": "u-0"}, type="Normal", reason="Waiting", message="m")
    assert len([e for e in events(cluster) if e["involvedObject"]["name"] == "app-exec-0"]) == 2


def test_after_leadership_lapses_events_are_recorded_quietly_and_cost_nothing(
    cluster: Cluster, kube: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 37: each Event queued when leadership lapsed logged a warning and took a token of the client's
    write budget before the gate refused it. Now: no request, no token (of the budget or of the spam filter),
    no warning; the next leader reports what still holds."""
    leading, tokens = [True], []
    recorder = Clocks().recorder(kube.gated(lambda: leading[0], timeout=30).limited(lambda: tokens.append(1)))
    since = len(cluster.requests.entries())
    assert recorder.record(POD, type="Warning", reason="Stuck", message="m", series="s")
    leading[0] = False
    for n in range(30):  # more than the spam filter's burst
        assert not recorder.record(POD, type="Warning", reason="Stuck", message=f"m{n}", series="s")
    assert writes(cluster, since) == [("create", None)]  # a POST names the collection
    assert len(tokens) == 1 and not [r for r in caplog.records if r.levelname == "WARNING"]
    leading[0] = True  # leading again (a new term): the filter has its tokens, the series its count
    assert recorder.record(POD, type="Warning", reason="Stuck", message="back", series="s")
    assert events(cluster)[0]["count"] == 2
