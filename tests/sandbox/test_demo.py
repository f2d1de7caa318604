"""`sparkgate demo`: the command end to end on its fixed-cluster CI scenario, and the tracker and view it is
built on. The autoscaled scenario's end-to-end run is the value benchmark's smoke round
(tests/bench/test_smoke.py `autoscaled_demo`): its four runs are made once, for both."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from sandbox.caps import Caps
from sandbox.demo.scenarios import SCENARIOS, WITH, AppSpec, dynamic_allocation
from sandbox.demo.view import comparison, live_view, plain_line, report_dict
from sandbox.demo.workload import Run, RunResult, Tracker
from sparkgate import contract
from sparkgate.policy import load_policy

DURATION = 120  # seconds


def processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


@pytest.mark.parametrize(
    "admission", ["webhook", "policy"]
)  # policy: the MutatingAdmissionPolicy, no webhook
def test_the_demo_compares_without_and_with_and_leaves_nothing_behind(tmp_path: Path, admission: str) -> None:
    out = tmp_path / "report.json"
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the demo's workdirs, to look for leftovers
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparkgate.cli",
            "demo",
            "--scenario",
            "tiny",
            # Each run's bound, instead of the scenario's 30 s (an idle machine needs about 7): a busy one
            # must not turn slow progress into an incomplete run. A run that completes ends at once.
            "--duration",
            str(DURATION),
            "--admission",
            admission,
            "--no-live",
            "--json",
            str(out),
            "--pacing",  # the scenario's is adaptive (bench/value's smoke run); this run is the fixed rule
            "fixed",
        ],
        capture_output=True,
        text=True,
        timeout=2 * DURATION + 120,  # both runs at their bound, and the processes' start and stop
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    cap = SCENARIOS["tiny"].max_pending_cluster
    without, with_ = report["without"], report["with"]
    assert report["pacing"] == "fixed" and "pacing fixed" in done.stdout
    # The cluster is too small: without sparkgate the scheduler queue floods; with it, never past the cap.
    assert without["peak_unscheduled_executor_pods"] > cap
    assert 0 < with_["peak_unscheduled_executor_pods"] <= cap
    assert with_["peak_gated_executor_pods"] > 0 and without["peak_gated_executor_pods"] == 0
    assert without["complete"] and with_["complete"]
    assert set(with_["apps"]) == {"a", "b", "c"}
    assert all(a["first_executor_after_s"] is not None for a in with_["apps"].values())
    assert with_["api_requests"]["sparkgate"] > 0 and "sparkgate" not in without["api_requests"]
    assert with_["bypassed_pods"] == 0
    assert with_["scheduling_attempts"] < without["scheduling_attempts"]
    # The printed report is the JSON's numbers.
    assert f"{with_['peak_unscheduled_executor_pods']} (cap {cap})" in done.stdout
    assert "allocator /apps: http://127.0.0.1:" in done.stdout
    assert processes_mentioning(str(tmp_path)) == []


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pod(
    uid: str, app: str, *, gated: bool, node: str | None = None, phase: str = "Pending", marked: bool = False
) -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}
    return {
        "metadata": {
            "uid": uid,
            "name": uid,
            "namespace": "spark",
            "labels": {contract.LABEL_ROLE: contract.ROLE_EXECUTOR, contract.LABEL_APP_ID: app},
            "annotations": {contract.ANNOTATION_PROFILE: "demo"},
        },
        "spec": {"schedulingGates": [{"name": contract.GATE}] if gated else [], "nodeName": node},
        "status": {"phase": phase, **({"conditions": [condition]} if marked else {})},
    }


def test_tracker_counts_states_peaks_and_integrates_work() -> None:
    clock = Clock()
    tracker = Tracker(0.0, clock)
    app = tracker.register(AppSpec("etl", 2, 0.0, 3.0), "app-1")  # 6 executor-seconds of work
    tracker.on_change("ADDED", "pods", pod("p1", "app-1", gated=True))
    tracker.on_change("ADDED", "pods", pod("p2", "app-1", gated=True))
    assert (tracker.gated, tracker.unscheduled, tracker.peak_gated) == (2, 0, 2)
    tracker.on_change("MODIFIED", "pods", pod("p1", "app-1", gated=False))
    tracker.on_change("MODIFIED", "pods", pod("p2", "app-1", gated=False))
    assert (tracker.gated, tracker.unscheduled, tracker.peak_unscheduled) == (0, 2, 2)
    tracker.on_change("MODIFIED", "pods", pod("p1", "app-1", gated=False, node="n1"))
    assert (tracker.unscheduled, app.waiting, app.bound) == (1, 1, 1)
    clock.now = 1.0
    tracker.on_change("MODIFIED", "pods", pod("p1", "app-1", gated=False, node="n1", phase="Running"))
    assert tracker.start_latencies == [1.0]  # created at 0, running at 1
    assert (app.running, app.first_running, app.due(1.0)) == (1, 1.0, 7.0)  # 6 s of work at one executor
    clock.now = 2.0
    tracker.on_change("MODIFIED", "pods", pod("p2", "app-1", gated=False, node="n1", phase="Running"))
    assert app.work_at(2.0) == 1.0 and app.due(2.0) == 4.5  # 5 s left at two executors
    assert tracker.start_latencies == [1.0, 2.0] and tracker.created == {}
    clock.now = 3.0
    tracker.on_change("ADDED", "pods", pod("p3", "app-1", gated=True))
    tracker.on_change("DELETED", "pods", pod("p3", "app-1", gated=True))
    assert app.deleted == 1 and tracker.gated == 0 and tracker.created == {}  # never ran: no latency
    assert app.summary()["all_created_after_s"] == 3.0
    tracker.finish(app, 4.5)
    assert app.summary()["complete_after_s"] == 4.5 and app.summary()["first_executor_after_s"] == 1.0
    assert app.summary()["all_running_after_s"] == 2.0  # both of its executors ran from then on
    tracker.on_change("ADDED", "pods", {**pod("p4", "app-1", gated=False), "metadata": {
        **pod("p4", "app-1", gated=False)["metadata"], "annotations": {}}})  # fmt: skip
    assert tracker.bypassed == 1


def test_tracker_judges_each_release_counts_nodes_and_times_the_marks() -> None:
    """With sparkgate every gate removal is judged by the one cap checker (sandbox/caps.py); nodes are
    counted as they join; each executor's creation -> first PodScheduled=False/Unschedulable is timed."""
    clock = Clock()
    tracker = Tracker(0.0, clock, Caps(per_app=2, per_namespace=2, cluster=2))
    tracker.register(AppSpec("etl", 3, 0.0, 1.0), "app-1")
    for uid in ("p1", "p2", "p3"):
        tracker.on_change("ADDED", "pods", pod(uid, "app-1", gated=True))
    clock.now = 0.5
    tracker.on_change("MODIFIED", "pods", pod("p1", "app-1", gated=True, marked=True))  # held, marked
    tracker.on_change("MODIFIED", "pods", pod("p2", "app-1", gated=False))
    tracker.on_change("MODIFIED", "pods", pod("p1", "app-1", gated=False, marked=True))
    assert tracker.checker is not None and tracker.checker.violations == []
    clock.now = 1.5
    tracker.on_change("MODIFIED", "pods", pod("p2", "app-1", gated=False, marked=True))  # the scheduler's
    tracker.on_change("MODIFIED", "pods", pod("p3", "app-1", gated=False))  # a third in flight: past 2
    assert len(tracker.checker.violations) == 3  # the app's, the namespace's and the cluster's limit
    tracker.on_change("MODIFIED", "pods", pod("p3", "app-1", gated=False, node="n1", marked=True))
    assert tracker.mark_latencies == [0.5, 1.5]  # p3 was bound before it was ever marked
    assert tracker.marked_held == 1  # p1, marked by sparkgate while gated; p2 by the scheduler, released
    tracker.on_change("ADDED", "nodes", {"metadata": {"name": "n1"}})
    clock.now = 2.0
    tracker.on_change("ADDED", "nodes", {"metadata": {"name": "n2"}})
    tracker.on_change("MODIFIED", "nodes", {"metadata": {"name": "n1"}})  # a taint: still there
    tracker.on_change("DELETED", "nodes", {"metadata": {"name": "n1"}})
    assert (tracker.nodes, tracker.peak_nodes, tracker.node_joins()) == (1, 2, [1.5, 2.0])
    assert tracker.node_seconds(3.0) == 0.5 + 1.0 and tracker.node_seconds(1.75) == 0.25
    assert Tracker(0.0, clock).checker is None  # without sparkgate nothing is judged


def test_tracker_counts_the_provisioning_requests_made_and_provisioned() -> None:
    tracker = Tracker(0.0, Clock())

    def request(name: str, *conditions: tuple[str, str]) -> dict[str, Any]:
        status = {"conditions": [{"type": t, "status": s} for t, s in conditions]}
        return {"metadata": {"name": name}, "status": status}

    tracker.on_change("ADDED", "provisioningrequests", request("sg-a-pr1"))
    tracker.on_change("MODIFIED", "provisioningrequests", request("sg-a-pr1", ("Accepted", "True")))
    tracker.on_change("ADDED", "provisioningrequests", request("sg-b-pr1"))
    tracker.on_change("MODIFIED", "provisioningrequests", request("sg-b-pr1", ("Provisioned", "False")))
    tracker.on_change("MODIFIED", "provisioningrequests", request("sg-a-pr1", ("Provisioned", "True")))
    tracker.on_change("DELETED", "provisioningrequests", request("sg-a-pr1", ("Provisioned", "True")))
    assert (tracker.requests, tracker.provisioned) == ({"sg-a-pr1", "sg-b-pr1"}, {"sg-a-pr1"})


def test_dynamic_allocation_ramps_as_spark_does_and_the_target_follows() -> None:
    """ExecutorAllocationManager `addExecutors`: from the initial executors, 1, 2, 4, ... more at each
    sustained backlog timeout, capped at what the tasks need."""
    app = dynamic_allocation(
        "dyn", initial=8, needed=120, submit_at=0.5, backlog_at=8.0, backlog_timeout=0.1, task_seconds=2.0,
        spark_batch=10,
    )  # fmt: skip
    assert app.scale == ((8.0, 9), (8.1, 11), (8.2, 15), (8.3, 23), (8.4, 39), (8.5, 71), (8.6, 120))
    assert (app.executors, app.final, app.work) == (8, 120, 240.0)
    assert [app.target_at(t) for t in (0.0, 7.99, 8.0, 8.25, 9.0)] == [8, 8, 9, 15, 120]


def test_the_comparison_has_a_column_per_run_and_the_autoscalers_figures() -> None:
    scenario = SCENARIOS["autoscaled-tiny"]
    specs = (*scenario.runs, dataclasses.replace(scenario.runs[-1], key="extra", title="a fifth run"))

    def result(n: int, spec: Any) -> RunResult:
        apps = {
            a.name: {"submitted_s": 0.0, "first_executor_after_s": 1.0, "all_running_after_s": 2.0 + n,
                     "complete_after_s": 5.0 + n, "deleted_before_running": 0}
            for a in scenario.apps
        }  # fmt: skip
        grown = {"scale_up_rounds": 10 + n, "nodes_added": [], "peak_nodes": 20 + n, "node_minutes": 1.25 + n,
                 "marked_while_held": 30 + n, "provisioning_requests": 2 * n, "provisioned_requests": n}  # fmt: skip
        return RunResult(spec, 9.0, apps, 5, 0, 100, scheduler_peak_pending=7 + n, autoscaling=grown)

    results = [result(n, spec) for n, spec in enumerate(specs)]
    console = Console(record=True, width=240)
    console.print(comparison(scenario, results))
    text = console.export_text()
    header = next(line for line in text.splitlines() if "measured in this run" in line)
    assert [title.strip() for title in header.split("┃")[2:-1]] == [s.title for s in specs]

    def cells(figure: str) -> list[str]:
        line = next(line for line in text.splitlines() if line.startswith(f"│ {figure} "))
        return [cell.strip() for cell in line.split("│")[2:-1]]

    n = range(len(specs))
    assert cells("every executor running after") == [f"{2.0 + i:.1f}s" for i in n]
    assert cells("scale-up rounds") == [str(10 + i) for i in n]
    assert cells("peak nodes") == [str(20 + i) for i in n]
    assert cells("node-minutes") == [f"{1.25 + i:.1f}" for i in n]
    assert cells("peak pods waiting in the scheduler") == [str(7 + i) for i in n]
    assert cells("executor pods marked while held") == [str(30 + i) for i in n]
    assert cells("ProvisioningRequests (provisioned)") == [f"{2 * i} ({i})" for i in n]
    report = report_dict(scenario, results)
    assert report["runs"] == [s.key for s in specs]
    assert [report[s.key]["all_running_s"] for s in specs] == [2.0 + i for i in n]


def test_the_live_view_shows_each_app_and_the_cluster_against_the_cap() -> None:
    scenario = SCENARIOS["tiny"]
    run = Run(scenario, WITH, duration=1.0)
    clock = Clock()
    run.tracker = Tracker(0.0, clock)
    run.tracker.register(scenario.apps[0], "app-a")
    for i in range(3):
        run.tracker.on_change("ADDED", "pods", pod(f"g{i}", "app-a", gated=True))
    run.tracker.on_change("ADDED", "pods", pod("w", "app-a", gated=False))
    clock.now = 2.0
    console = Console(record=True, width=140)
    console.print(live_view(run))
    text = console.export_text()
    assert "tiny: with sparkgate" in text and "2.0s" in text
    row = next(line for line in text.splitlines() if line.startswith("│ a "))
    assert row.replace("│", " ").split()[:6] == ["a", "10", "3", "1", "0", "0"]
    assert "waiting for executors" in row
    assert "1 unscheduled / cap 4 (peak 1)" in text and "3 gated" in text
    assert plain_line(run).startswith("[with sparkgate] t=  2.0s unscheduled=1 (peak 1) gated=3")


def test_every_scenarios_policy_loads_with_its_pacing_and_the_roomy_ones_cover_spark_allocators() -> None:
    for scenario in SCENARIOS.values():
        for pacing in ("adaptive", "fixed"):
            for run in scenario.runs:
                policy = load_policy(dataclasses.replace(scenario, pacing=pacing).policy_yaml(run))
                assert policy.allocation.pacing == pacing
                assert policy.allocation.max_pending_per_app == scenario.max_pending_per_app
    assert SCENARIOS["tiny"].pacing == "adaptive"  # the shipped policies' choice
    roomy = [s for name, s in SCENARIOS.items() if name.startswith("roomy")]
    assert {s.spark_allocator for s in roomy} == {"direct", "deployment"}
    assert {a.spark_batch for s in roomy for a in s.apps} == {10, 100}
    assert all(s.capacity >= sum(a.executors for a in s.apps) for s in roomy)
