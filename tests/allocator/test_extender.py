"""The extender's decisions and protocol in-process: the placement index fed with pod record transitions,
the pure filter and scores, and the ExtenderArgs / ExtenderFilterResult / HostPriorityList documents of
k8s.io/kube-scheduler/extender/v1 (Go field names; Go decodes them case-insensitively)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest

from allocator.cache import pod_record
from allocator.extender import (
    Extender,
    exclusions,
    failing_scores,
    filter_nodes,
    parse_args,
    scores,
    suspect_nodes,
)
from allocator.metrics import AllocatorMetrics
from allocator.model import PodRecord
from allocator.placement import Placement
from sparkgate.cli import main
from sparkgate.contract import AppKey
from sparkgate.policy import Scheduling, load_policy

A, B, C = AppKey("spark", "spark-aaaaaaaaaaaaaaaa"), AppKey("spark", "spark-b"), AppKey("jobs", "spark-c")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(app: AppKey, name: str, node: str | None, phase: str = "Running", **kw: Any) -> PodRecord:
    return PodRecord(
        app.namespace, name, f"uid-{name}", app.app_id, 1, "0", False, "spark", node, phase, False, 0.0, **kw
    )


def fail(placement: Placement, app: AppKey, name: str, node: str, **kw: Any) -> None:
    running = record(app, name, node)
    placement.observe(None, running)
    placement.observe(running, msgspec.structs.replace(running, phase="Failed", **kw))


class Policy:
    def __init__(self, text: str) -> None:
        self.policy = load_policy(text)

    def current(self) -> Any:
        return self.policy


POLICY = """
apiVersion: sparkgate.io/v1alpha1
kind: Policy
scheduling: {failuresPerApp: 2, suspectNodeApps: 2, failureWindowSeconds: 60}
profiles:
  - name: spark
    scheduling: {packing: app, driverZone: prefer}
  - name: wide
    scheduling: {packing: spread, failuresPerApp: 5}
"""


def args(app: AppKey | None, names: list[str], profile: str = "spark") -> bytes:
    labels = {"spark-role": "executor", "spark-app-selector": app.app_id} if app else {"app": "web"}
    pod = {
        "metadata": {
            "name": "p",
            "namespace": app.namespace if app else "default",
            "labels": labels,
            "annotations": {"sparkgate.io/profile": profile},
        }
    }
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()


def answer(extender: Extender, verb: str, body: bytes) -> tuple[int, Any]:
    code, document = extender.handle(verb, body)
    return code, json.loads(document)


def refusing(placement: Placement, app: AppKey, settings: Scheduling, now: float) -> dict[str, Any]:
    """exclusions() as the extender composes them: the app's own failures, then the suspect nodes."""
    suspect, _, _ = suspect_nodes(placement.failures(600), settings, now)
    return exclusions(placement.app_failures(app, 600), app, settings, suspect, now)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def placement(clock: Clock) -> Placement:
    p = Placement(monotonic=clock)
    p.nodes_replace([{"metadata": {"name": f"n{i}"}} for i in range(1, 5)])
    return p


@pytest.fixture
def extender(placement: Placement) -> Extender:
    return Extender(placement, Policy(POLICY), AllocatorMetrics())  # type: ignore[arg-type]


def test_a_failed_pod_counts_once_with_its_kind_and_live_executors_are_counted_per_node(
    placement: Placement, clock: Clock
) -> None:
    fail(placement, A, "a1", "n1", reason="OOMKilled", exit_code=137)
    failed = msgspec.structs.replace(record(A, "a1", "n1"), phase="Failed", reason="OOMKilled", exit_code=137)
    placement.observe(failed, msgspec.structs.replace(failed, deleting=True))  # the same failure seen again
    fail(placement, A, "a2", "n1", exit_code=1, reason="Error")
    fail(placement, B, "b1", "n2", reason="Evicted", exit_code=137)
    fail(placement, B, "b2", "n2", reason="OutOfcpu")
    assert {n: [f.kind for f in fs] for n, fs in placement.failures(60).items()} == {
        "n1": ["OOMKilled", "exit 1"],
        "n2": ["Evicted", "OutOfcpu"],
    }
    pending = record(A, "a3", None, "Pending")
    placement.observe(None, pending)
    placement.observe(pending, msgspec.structs.replace(pending, node="n3"))
    placement.observe(None, record(A, "a4", "n3"))
    assert placement.executors(A) == {"n3": 2}
    placement.observe(record(A, "a4", "n3"), None)
    assert placement.executors(A) == {"n3": 1}
    clock.now += 61
    assert placement.failures(60) == {}


def test_a_failure_keeps_its_age_from_finished_at_so_a_restart_does_not_renew_it(clock: Clock) -> None:
    """The first list after an allocator restart holds pods that failed long ago: each counts from when its
    container terminated (finishedAt, as the cache reads it from the pod), not from when it was seen."""
    wall = Clock()
    wall.now = 1_800_000_000.0
    placement = Placement(monotonic=clock, clock=wall, retention=lambda: 600)
    terminated = {
        "terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2027-01-15T07:50:00Z"}
    }
    pod = {
        "metadata": {"name": "a1", "namespace": "spark", "uid": "u1", "labels": {"spark-app-selector": A.app_id}},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Failed", "containerStatuses": [{"name": "spark-kubernetes-executor", "state": terminated}]},
    }  # fmt: skip
    listed = pod_record(pod)
    assert listed is not None and listed.finished == 1_800_000_000.0 - 10 * 60  # 08:00:00Z minus 10 minutes
    placement.observe(None, listed)  # older than the longest window: not counted at all
    assert placement.failures(600) == {} and placement.app_failures(A, 600) == []
    placement.observe(
        None, msgspec.structs.replace(listed, uid="u2", finished=wall.now - 300)
    )  # five minutes old
    placement.observe(
        None, msgspec.structs.replace(listed, uid="u3", finished=None, reason="Evicted")
    )  # no finishedAt: now
    placement.observe(
        None, msgspec.structs.replace(listed, uid="u4", finished=wall.now - 100, exit_code=1, reason="Error")
    )
    # Kept oldest first, whatever the order they were seen in.
    assert [f.kind for f in placement.app_failures(A, 600)] == ["OOMKilled", "exit 1", "Evicted"]
    assert [f.kind for f in placement.failures(200)["n1"]] == ["exit 1", "Evicted"]
    assert [f.kind for f in placement.failures(50)["n1"]] == ["Evicted"]
    clock.now += 301  # the five-minute-old failure reaches the window's end after five more minutes, not ten
    assert [f.kind for f in placement.app_failures(A, 600)] == ["exit 1", "Evicted"]
    placement.observe(
        None, msgspec.structs.replace(listed, uid="u5", finished=wall.now + 30)
    )  # a node clock ahead: now
    assert len(placement.failures(1)["n1"]) == 1


def test_a_node_is_refused_to_the_app_at_n_failures_and_to_every_app_at_m_apps(clock: Clock) -> None:
    placement = Placement(monotonic=clock)
    fail(placement, A, "a1", "n1", reason="OOMKilled", exit_code=137)
    settings = Scheduling(failures_per_app=2, suspect_node_apps=2, failure_window_seconds=600)
    assert refusing(placement, A, settings, clock.now) == {}
    fail(placement, A, "a2", "n1", exit_code=137)
    refused = refusing(placement, A, settings, clock.now)
    assert refused["n1"].scope == "app" and refused["n1"].message == (
        "sparkgate: 2 executors of spark/spark-aaaaaa… failed here in the last 10m (OOMKilled, exit 137)"
    )
    assert refusing(placement, B, settings, clock.now) == {}
    fail(placement, B, "b1", "n1", reason="OOMKilled", exit_code=137)
    refused = refusing(placement, C, settings, clock.now)
    assert refused["n1"].scope == "node" and refused["n1"].reason == "oom_killed"
    assert refused["n1"].message == (
        "sparkgate: executors of 2 apps failed here in the last 10m (suspect node: OOMKilled \u00d72, exit 137)"
    )


def test_filter_never_refuses_every_node_of_the_cluster(placement: Placement, clock: Clock) -> None:
    settings = Scheduling(failures_per_app=1)
    for i, node in enumerate(("n1", "n2", "n3")):
        fail(placement, A, f"a{i}", node)
    refused = refusing(placement, A, settings, clock.now)
    cluster = placement.nodes()
    kept, failed, fell_back = filter_nodes(["n1", "n2"], refused, cluster)
    assert kept == [] and set(failed) == {"n1", "n2"} and not fell_back, "n4 is good: wait for room there"
    fail(placement, A, "a4", "n4")
    refused = refusing(placement, A, settings, clock.now)
    assert filter_nodes(["n1", "n2"], refused, cluster) == (["n1", "n2"], {}, True)


def test_scores_by_packing_and_driver_zone() -> None:
    names = ["n1", "n2", "n3", "n4"]
    executors = {"n1": 4, "n2": 2}
    zones = {"n1": "a", "n2": "b", "n3": "b"}
    pack = Scheduling(packing="app")
    assert scores(names, pack, executors, zones, None) == [("n1", 10), ("n2", 5), ("n3", 0), ("n4", 0)]
    spread = Scheduling(packing="spread")
    assert scores(names, spread, executors, zones, None) == [("n1", 0), ("n2", 5), ("n3", 10), ("n4", 10)]
    zone = Scheduling(driver_zone="prefer")
    assert scores(names, zone, executors, zones, "b") == [("n1", 0), ("n2", 10), ("n3", 10), ("n4", 0)]
    assert scores(names, zone, executors, zones, None) == [(n, 0) for n in names], "driver's zone unknown"
    both = Scheduling(packing="app", driver_zone="prefer")
    assert scores(names, both, executors, zones, "b") == [("n1", 4), ("n2", 8), ("n3", 6), ("n4", 0)]
    assert scores(names, Scheduling(), executors, zones, "b") == [(n, 0) for n in names]


def test_a_failing_node_scores_lower_from_its_first_failure_until_the_window_ends(clock: Clock) -> None:
    """failuresPerApp 3, suspectNodeApps 3: one failure of the app puts n1 a third of the way to its
    exclusion (floor(5 x 2/3) = 3) below every healthy node (7); a failure of another app lowers n2 for
    every app; the scores come back once the failures are older than the window."""
    placement = Placement(monotonic=clock)
    cluster = settings = Scheduling(failures_per_app=3, suspect_node_apps=3, failure_window_seconds=600)
    names = ["n1", "n2", "n3"]

    def scored(app: AppKey, settings: Scheduling = settings, executors: dict[str, int] | None = None) -> Any:
        _, apps, _ = suspect_nodes(placement.failures(600), cluster, clock.now)
        failing = failing_scores(placement.app_failures(app, 600), apps, settings, cluster, clock.now)
        return scores(names, settings, executors or {}, {}, None, failing)

    assert scored(A) == [("n1", 0), ("n2", 0), ("n3", 0)], "no failure: neutral, as before"
    fail(placement, A, "a1", "n1", reason="OOMKilled", exit_code=137)
    assert scored(A) == [("n1", 3), ("n2", 7), ("n3", 7)]
    assert scored(B) == [("n1", 3), ("n2", 7), ("n3", 7)], "1 app of 3 failed there: every app's risk"
    clock.now += 10
    fail(placement, A, "a2", "n1", exit_code=137)
    assert scored(A) == [("n1", 1), ("n2", 7), ("n3", 7)], "2 of 3: floor(5 x 1/3)"
    assert scored(B) == [("n1", 3), ("n2", 7), ("n3", 7)], "still 1 app of 3 for app b"
    fail(placement, B, "b1", "n2", reason="Evicted", exit_code=137)
    assert scored(C) == [("n1", 3), ("n2", 3), ("n3", 7)]
    # Preferences order the healthy nodes within 7..10 and never lift a failing node above them.
    spread = replace(settings, packing="spread")
    assert scored(A, spread, {"n2": 2, "n3": 4}) == [("n1", 1), ("n2", 3), ("n3", 7)]
    assert scored(C, spread, {"n3": 4}) == [("n1", 3), ("n2", 3), ("n3", 7)]
    pack = replace(settings, packing="app")
    fail(placement, C, "c1", "n1", exit_code=1)
    assert scored(B, pack, {"n3": 1}) == [("n1", 1), ("n2", 3), ("n3", 10)], "n1: 2 apps of 3"
    # A stricter profile: its own failures weigh more (1 of 2: floor(5 x 1/2) = 2).
    strict = replace(settings, failures_per_app=2)
    assert scored(B, strict) == [("n1", 1), ("n2", 2), ("n3", 7)]
    clock.now += 591  # a1 is 601 s old, a2 591 s: only a2, b1, c1 count
    assert scored(A) == [("n1", 1), ("n2", 3), ("n3", 7)]
    clock.now += 10
    assert scored(A) == [("n1", 0), ("n2", 0), ("n3", 0)], "every failure left the window"


def test_a_node_refused_to_every_app_but_kept_by_the_fallback_scores_0(clock: Clock) -> None:
    """At its exclusion (r = 1) a node scores 0: when the filter kept every node (all refused), the ones
    with fewer failures still win."""
    settings = Scheduling(failures_per_app=1, suspect_node_apps=5)
    failing = failing_scores([], {"n1": 2, "n2": 7}, settings, settings, clock.now)
    assert failing == {"n1": 3, "n2": 0}, "floor(5 x 3/5); r = 7/5 counts as 1"
    assert scores(["n1", "n2", "n3"], settings, {}, {}, None, failing) == [("n1", 3), ("n2", 0), ("n3", 7)]


def test_the_protocol_answers_filter_and_prioritize(extender: Extender, placement: Placement) -> None:
    fail(placement, A, "a1", "n1", reason="OOMKilled", exit_code=137)
    fail(placement, A, "a2", "n1", reason="OOMKilled", exit_code=137)
    placement.observe(None, record(A, "a3", "n2"))
    placement.node_event(
        "ADDED", {"metadata": {"name": "n2", "labels": {"topology.kubernetes.io/zone": "z"}}}
    )
    placement.driver_event(
        "ADDED",
        {
            "metadata": {"namespace": "spark", "labels": {"spark-app-selector": A.app_id}},
            "spec": {"nodeName": "n2"},
        },
    )
    code, result = answer(extender, "filter", args(A, ["n1", "n2", "n3"]))
    message = "sparkgate: 2 executors of spark/spark-aaaaaa… failed here in the last 1m (OOMKilled \u00d72)"
    assert code == 200 and result == {
        "NodeNames": ["n2", "n3"],
        "FailedNodes": {"n1": message},
        "FailedAndUnresolvableNodes": {"n1": message},
        "Error": "",
    }
    code, result = answer(extender, "prioritize", args(A, ["n2", "n3"]))
    assert code == 200 and result == [{"Host": "n2", "Score": 10}, {"Host": "n3", "Score": 0}]
    code, result = answer(extender, "prioritize", args(A, ["n1", "n2", "n3"]))  # as after a fallback
    assert result == [{"Host": "n1", "Score": 0}, {"Host": "n2", "Score": 10}, {"Host": "n3", "Score": 7}]
    code, result = answer(extender, "filter", args(A, ["n1", "n2"], profile="wide"))
    assert result["NodeNames"] == ["n1", "n2"], "the profile allows 5 failures"
    assert extender.app_document(A, "spark")[0]["node"] == "n1"


def test_a_pod_that_is_not_an_executor_keeps_every_node_with_a_neutral_score(extender: Extender) -> None:
    assert answer(extender, "filter", args(None, ["n1", "n2"]))[1]["NodeNames"] == ["n1", "n2"]
    assert answer(extender, "prioritize", args(None, ["n1"]))[1] == [{"Host": "n1", "Score": 0}]
    assert extender.metrics.extender_requests.labels("filter", "not_executor")._value.get() == 1


def test_node_objects_in_are_node_objects_out_and_field_names_match_case_insensitively(
    extender: Extender, placement: Placement
) -> None:
    fail(placement, A, "a1", "n1")
    fail(placement, A, "a2", "n1")
    pod = json.loads(args(A, []))["Pod"]
    nodes = {"items": [{"metadata": {"name": "n1"}}, {"metadata": {"name": "n2"}}]}
    code, result = answer(extender, "filter", json.dumps({"pod": pod, "nodes": nodes}).encode())
    assert code == 200 and result["NodeNames"] is None
    assert result["Nodes"]["items"] == [{"metadata": {"name": "n2"}}]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"{", "the body is not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "the body is nested too deeply"),
        (b"[]", "expected an ExtenderArgs object"),
        (b'{"NodeNames": []}', "Pod: expected the pod object"),
        (b'{"Pod": {}, "NodeNames": [1]}', "NodeNames: expected a list of node names"),
        (b'{"Pod": {}}', "expected NodeNames (nodeCacheCapable: true) or Nodes (a NodeList)"),
        (b'{"Pod": {"metadata": ["x"]}, "NodeNames": ["a"]}', "Pod.metadata: expected an object"),
        (
            b'{"Pod": {"metadata": {"namespace": ["n"]}}, "NodeNames": []}',
            "Pod.metadata.namespace: expected a string",
        ),
        (
            b'{"Pod": {"metadata": {"labels": ["x"]}}, "NodeNames": []}',
            "Pod.metadata.labels: expected a map of strings",
        ),
        (
            b'{"Pod": {"metadata": {"annotations": {"a": 1}}}, "NodeNames": []}',
            "Pod.metadata.annotations: expected a map of strings",
        ),
        (
            b'{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": 5}}]}}',
            "Nodes.items[0].metadata.name: expected a string",
        ),
        (b'{"Pod": {}, "Nodes": {"items": ["a"]}}', "Nodes.items: expected node objects"),
    ],
)
def test_a_malformed_request_is_a_400_saying_what_is_wrong(
    extender: Extender, body: bytes, error: str
) -> None:
    code, result = answer(extender, "filter", body)
    assert code == 400 and error in result["Error"]
    with pytest.raises(ValueError, match=re.escape(error)):
        parse_args(body)


def test_the_policy_sets_the_extender_per_profile_with_defaults_and_says_what_is_wrong() -> None:
    """docs/policy.md "Scheduling": top-level defaults, profiles override (suspectNodeApps is cluster-wide,
    schedulerName per profile), errors name their place."""
    policy = load_policy(POLICY)
    assert load_policy("apiVersion: sparkgate.io/v1alpha1\nkind: Policy\n").scheduling == Scheduling(
        failures_per_app=3,
        suspect_node_apps=3,
        failure_window_seconds=600.0,
        packing="none",
        driver_zone="ignore",
    )
    assert policy.scheduling_for("wide") == Scheduling(5, 2, 60.0, "spread", "ignore", None)
    assert policy.scheduling_for("unknown") == policy.scheduling
    bad = """
apiVersion: sparkgate.io/v1alpha1
kind: Policy
scheduling: {failuresPerApp: 0, packing: tight, schedulerName: x}
profiles:
  - name: p
    scheduling: {failureWindowSeconds: 0, suspectNodeApps: 2, driverZone: always, schedulerName: Not_A_Name}
"""
    with pytest.raises(ValueError) as raised:
        load_policy(bad)
    assert str(raised.value).splitlines() == [
        "scheduling.schedulerName: unknown key (expected one of: driverZone, failureWindowSeconds, "
        "failuresPerApp, packing, suspectNodeApps)",
        "scheduling.failuresPerApp: must be between 1 and 1000, got 0",
        "scheduling.packing: expected one of none, app, spread, got 'tight'",
        "profiles[0].scheduling.suspectNodeApps: unknown key (expected one of: driverZone, "
        "failureWindowSeconds, failuresPerApp, packing, schedulerName)",
        "profiles[0].scheduling.failureWindowSeconds: expected seconds between 1 and 86400, got 0",
        "profiles[0].scheduling.driverZone: expected one of ignore, prefer, got 'always'",
        "profiles[0].scheduling.schedulerName: 'Not_A_Name' is not a valid scheduler name (a DNS subdomain)",
    ]


def test_policy_check_shows_the_extender_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    assert main(["policy", "check", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "  scheduling: a node is refused to an app after 2 of its executors failed there, to every app after "
        "executors of 2 apps did, within 60s; packing none, driverZone ignore\n"
    ) in out
    assert "    scheduling: a node is refused to an app after 5 of its" in out and "packing spread" in out


def test_a_defect_is_answered_500_and_counted_as_an_error(
    extender: Extender, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kube-scheduler's HTTPExtender.send: a status other than 200 is the extender's failure (skipped when
    `ignorable`); an exception must not leave the connection without an answer."""

    def broken(*_: Any) -> Any:
        raise KeyError("n9")

    monkeypatch.setattr(extender, "filter", broken)
    code, result = answer(extender, "filter", args(A, ["n1"]))
    assert code == 500 and result == {"Error": "sparkgate: internal error: KeyError: 'n9'"}
    assert (
        extender.metrics.sample(
            "sparkgate_allocator_extender_requests_total", {"verb": "filter", "outcome": "error"}
        )
        == 1
    )


def test_failures_are_kept_for_the_longest_window_of_the_policy_from_the_first_list(clock: Clock) -> None:
    """After a restart the first list comes before any scheduling request: a failure 20 minutes old is
    within a one-hour window (a profile's, longer than the defaults') and refuses its node at once."""
    policy = Policy(
        """
apiVersion: sparkgate.io/v1alpha1
kind: Policy
scheduling: {failuresPerApp: 1, suspectNodeApps: 5}
profiles:
  - name: spark
    scheduling: {failureWindowSeconds: 3600}
"""
    )
    assert policy.policy.longest_failure_window() == 3600.0
    wall = Clock()
    placement = Placement(monotonic=clock, clock=wall, retention=policy.policy.longest_failure_window)
    placement.nodes_replace([{"metadata": {"name": n}} for n in ("n1", "n2")])
    placement.observe(
        None, record(A, "e1", "n1", phase="Failed", reason="OOMKilled", finished=wall.now - 1200)
    )
    extender = Extender(placement, cast(Any, policy), AllocatorMetrics())
    assert answer(extender, "filter", args(A, ["n1", "n2"]))[1]["NodeNames"] == ["n2"]
    placement.observe(
        None, record(A, "e2", "n2", phase="Failed", reason="OOMKilled", finished=wall.now - 3700)
    )
    assert answer(extender, "filter", args(A, ["n1", "n2"]))[1]["NodeNames"] == ["n2"]  # past every window


def test_a_replica_whose_watches_have_not_listed_answers_neutrally_and_says_so(
    placement: Placement, clock: Clock
) -> None:
    """Just after a start the placement knows no failure and no node: rather than answer as if every node
    were healthy, the extender answers as for a pod it does not manage, counted `not_synced`."""
    fail(placement, A, "a1", "n1")
    fail(placement, A, "a2", "n1")
    listed = [False]
    extender = Extender(placement, Policy(POLICY), AllocatorMetrics(), synced=lambda: listed[0])
    code, result = answer(extender, "filter", args(A, ["n1", "n2"]))
    assert code == 200 and result["NodeNames"] == ["n1", "n2"] and not result.get("FailedNodes")
    assert answer(extender, "prioritize", args(A, ["n1", "n2"]))[1] == [
        {"Host": "n1", "Score": 0},
        {"Host": "n2", "Score": 0},
    ]
    outcome = {"verb": "filter", "outcome": "not_synced"}
    assert extender.metrics.sample("sparkgate_allocator_extender_requests_total", outcome) == 1
    listed[0] = True
    assert answer(extender, "filter", args(A, ["n1", "n2"]))[1]["NodeNames"] == ["n2"]


def test_the_retention_is_asked_for_failures_only(clock: Clock) -> None:
    """Every executor event reaches Placement.observe: the retention (the policy in force, which reads its
    file now and then) is asked only when a pod failed, not on the hot path of every other change."""
    asked: list[int] = []
    placement = Placement(monotonic=clock, retention=lambda: asked.append(1) or 600.0)
    running = record(A, "a1", "n1")
    placement.observe(None, running)
    placement.observe(running, msgspec.structs.replace(running, node="n2"))
    assert asked == []
    placement.observe(running, msgspec.structs.replace(running, phase="Failed"))
    assert asked == [1] and len(placement.app_failures(A, 600)) == 1
