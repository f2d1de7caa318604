"""Every benchmark at its smoke size, as `python -m bench.<name> --smoke` runs it, so the scripts cannot rot.

Benchmarks are not tests: nothing here checks a timing, only that each run completes, leaves no process
behind, writes its result document with the keys docs/performance.md reports, and that the figures are sane
(positive rates, counts that add up, latencies that are finite). The value benchmark's autoscaled round is
also the end-to-end test of `sparkgate demo --scenario autoscaled-tiny` (`test_the_autoscaled_demo`, on the
report the demo wrote): its four runs take a minute, run once for both. Every benchmark is started at once
(independent processes on loopback ports of their own) and awaited.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandbox.demo.scenarios import SCENARIOS
from tests.sandbox.test_demo import processes_mentioning

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = (
    "admission",
    "scale",
    "refill",
    "value",
    "extender",
    "gates",
    "kubesim_policy",
    "admission_policy",
)


# name -> (exit code, output, result document, the processes left behind) of each smoke run
Results = dict[str, tuple[int, str, dict[str, Any], list[str]]]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Results:
    out = tmp_path_factory.mktemp("bench")
    # The admission benchmark drives the webhook with wrk (`make tools` installs it, as the README's test
    # command does): a missing wrk fails its test rather than skipping it.
    return smoke([name for name in BENCHMARKS if name != "admission" or shutil.which("wrk")], out)


def smoke(names: list[str], out: Path) -> Results:
    """Run these benchmarks at their smoke size at once and wait for them all. Each has a temporary folder of
    its own (TMPDIR): a process left behind that names it is that benchmark's."""
    running = {}
    for name in names:
        tmp(out, name).mkdir()
        running[name] = subprocess.Popen(
            [sys.executable, "-m", f"bench.{name}", "--smoke", "--out", str(out)],
            cwd=REPO,
            env={**os.environ, "TMPDIR": str(tmp(out, name))},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    found: Results = {}
    try:
        for name, process in running.items():
            output, _ = process.communicate(timeout=600)
            path = out / f"{name}.json"
            document = json.loads(path.read_text()) if path.exists() else {}
            found[name] = (
                process.returncode,
                output,
                document,
                processes_mentioning(f"{tmp(out, name)}{os.sep}"),
            )
    finally:
        for process in running.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    return found


def tmp(out: Path, name: str) -> Path:
    """A benchmark's TMPDIR; `admission` is a prefix of `admission_policy`, hence the separator after it where
    the processes are looked for."""
    return out / f"tmp-{name}"


def finished(results: Results, name: str) -> dict[str, Any]:
    assert name in results, f"{name}: wrk is not installed (`make tools` installs it)"
    code, output, document, left = results[name]
    assert code == 0, output[-3000:]
    assert left == [], "processes left behind"
    assert document["benchmark"] == name and document["smoke"] is True, output[-3000:]
    assert {"machine", "seconds", "started_at"} <= document.keys()
    assert document["machine"]["python"] and document["machine"]["cpus"] >= 1
    assert "benchmark" in output and name in output  # the table was printed
    return document


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_admission(results: Results) -> None:
    document = finished(results, "admission")
    summary = document["summary"]
    assert summary["runs_without_answers"] == 0 and document["worker_timeouts"] == {"webhook": 0, "floor": 0}
    for key in ("saturated_keepalive", "saturated_no_keepalive"):
        entry = summary[key]
        assert positive(entry["webhook_rps"]) and positive(entry["floor_rps"]) and positive(entry["ratio"])
        assert positive(entry["webhook_server_cpu_us_per_request"]) and entry["errors"] == 0
    for key in ("at_rate_keepalive", "at_rate_no_keepalive"):
        entry = summary[key]
        for server in ("webhook", "floor"):
            assert 0 < entry[server]["p50"] <= entry[server]["p99"]
            assert positive(entry[server]["achieved_rps"])
        assert entry["errors"] == 0
    assert document["config"]["webhook_patch_base64_bytes"] > 0  # the webhook did patch; the floor did not
    assert len(document["rounds"]) == document["config"]["rounds"] == 1


def test_scale(results: Results) -> None:
    document = finished(results, "scale")
    config = document["config"]
    assert [size["pods"] for size in document["sizes"]] == config["sizes"] and document["problems"] == []
    for size in document["sizes"]:
        pods, apps = size["pods"], size["apps"]
        assert apps * config["executors_per_app"] == pods
        # Every fifth app scaled down by 5 executors and up again with 5 new ids.
        created = pods + (apps // 5) * 5
        assert size["executor_pods_created"] == created
        events = size["pod_events"]
        assert size["events"] == sum(events.values()) > 0
        assert events["executor ADDED"] == events["executor DELETED"] == created
        # A driver: ADDED, Succeeded (MODIFIED), its deletion's deletionTimestamp (MODIFIED), DELETED.
        assert events["driver ADDED"] == events["driver DELETED"] == apps
        assert events["driver MODIFIED"] == 2 * apps
        # Each executor alive at the peak: its gate removal, its bind, its start and its graceful deletion.
        assert events["executor MODIFIED"] >= 4 * pods
        assert size["released_twice"] == 0 and size["released"] + size["deleted_while_gated"] == created
        peak = size["peak"]
        assert peak["live_executors"] == peak["running"] == peak["released_once"] == pods
        assert peak["tracked_pods"] == peak["running_in_cache"] == pods
        assert size["left_after_teardown"] == {
            "apps": 0, "memory": 0, "settings": 0, "ended": 0, "app_series": 0
        }  # fmt: skip
        assert size["violation_count"] == 0 and size["writes"]["patch pods"] >= size["released"]
        assert positive(size["events_per_second"]) and positive(size["arrival"]["events_per_second"])
        assert size["arrival"]["events"] + size["teardown"]["events"] == size["events"]
        usage = size["process_per_event"]  # getrusage over the timed phases: the process did work in them
        assert usage["user_us"] > 0 and usage["system_us"] >= 0 and usage["voluntary_switches"] >= 0
        assert size["steps"] >= size["steps_until_peak"] > 0
        for figure in ("step_cpu_ms", "step_wall_ms", "keys_per_step"):
            assert 0 <= size[figure]["p50"] <= size[figure]["p99"] <= size[figure]["max"]
        assert size["keys_per_step"]["max"] <= apps
        assert size["scrape"]["series"] > pods // config["executors_per_app"]
        assert 0 < size["scrape"]["ms"]["p50"] <= size["scrape"]["ms"]["max"]
        memory = size["memory"]
        assert memory["tracked_pods"] == pods and positive(memory["bytes_per_pod"])
        owners = memory["by_owner"]  # smoke sizes are small enough to split the traced memory by owner
        # The records keep the strings their list parsed (names, uids): a part of the allocator's, not all of it
        # (the listed objects themselves are freed once handled).
        assert owners["allocator"] >= owners["list"] > 0 and owners["stand-in"] > 0


def test_refill(results: Results) -> None:
    document = finished(results, "refill")
    refill = document["refill"]
    assert refill["released"] == refill["executors"] > 0
    assert (
        refill["refill_ms"]["count"] > 0 and 0 < refill["refill_ms"]["median"] <= refill["refill_ms"]["p99"]
    )
    assert refill["pod_writes_per_released_executor"] >= 1.0  # at least the gate removal itself
    assert refill["pod_patches_applied"] == refill["released"] <= refill["requests_by_verb"]["patch pods"]
    (ramp,) = document["ramp_up"]
    assert sum(ramp["batch_sizes"]) == ramp["executors"] and max(ramp["batch_sizes"]) <= ramp["batch"]
    assert ramp["batches"] >= -(-ramp["executors"] // ramp["batch"])
    assert ramp["first_to_last_release_s"] >= ramp["policy_minimum_s"] > 0


def test_value(results: Results) -> None:
    document = finished(results, "value")
    (comparison,) = document["comparisons"]
    peak = comparison["peak_unscheduled"]
    assert peak["without"] > peak["cap"] >= peak["with"] > 0
    assert comparison["api_requests"]["total_with"] > 0 and comparison["api_requests"]["total_without"] > 0
    assert comparison["scheduling_attempts"]["with"] < comparison["scheduling_attempts"]["without"]
    assert set(comparison["completion_after_submission_s"]["with"]) == {"a", "b", "c"}
    assert document["pacing"] == "adaptive"  # the scenario's, as the shipped policies
    running = comparison["all_running_after_s"]
    assert set(running) == {"without", "with", "ratio"}
    # The fill's two parts: the drivers' creations end before the last app completes (tiny's apps do not
    # all run at once: room for 8), and each executor's creation -> running is measured in both runs.
    created, done = comparison["all_created_after_s"], comparison["all_complete_after_s"]
    assert 0 < created["with"] <= done["with"] and 0 < created["without"] <= done["without"]
    for side in ("without", "with"):
        started = document["reports"][0][side]["executor_start_s"]
        assert (
            started
            and 0 < comparison["executor_start_p50_s"][side] <= comparison["executor_start_p90_s"][side]
        )
        assert comparison["executor_start_p90_s"][side] <= max(started)
    # The autoscaled scenario: without sparkgate and each setting of what the autoscaler sees, side by side.
    autoscaled = document["autoscaled"]
    assert autoscaled["scenario"] == "autoscaled-tiny"
    assert autoscaled["runs"] == ["without", "released", "held", "provisioning"]
    assert (
        autoscaled["demo_exit_codes"] == [0] and len(autoscaled["comparisons"]) == autoscaled["rounds"] == 1
    )
    for key in autoscaled["runs"]:
        figures = autoscaled["summary"][key]
        assert (
            figures["scale_up_rounds"] >= 1
            and figures["peak_nodes"] > 1
            and positive(figures["node_minutes"])
        )
        assert figures["peak_unscheduled"] > 0 and figures["cap_violations"] == 0
        assert 0 <= figures["marked_p50_s"] <= figures["marked_p90_s"]
    summary = autoscaled["summary"]
    assert (
        summary["without"]["peak_unscheduled"] > autoscaled["cap"] >= summary["released"]["peak_unscheduled"]
    )
    assert positive(summary["without"]["all_running_s"])
    # Sparkgate's marks only with `held`, its requests only with a class; each run's slowdown beside.
    assert summary["held"]["marked_while_held"] > 0 == summary["released"]["marked_while_held"]
    assert summary["provisioning"]["provisioning_requests"] > 0 == summary["held"]["provisioning_requests"]
    for key in ("released", "held", "provisioning"):
        assert positive(autoscaled["ratios"][key]["all_complete_s"]["median"])
    held = autoscaled["targets"]
    assert set(held) == {"all_running", "scale_up_rounds", "peak_nodes", "node_minutes", "cap"}
    assert all(isinstance(target["met"], bool) for target in held.values())
    assert held["cap"]["met"]  # the cap holds in every round, whatever the load


def test_the_autoscaled_demo(results: Results) -> None:
    """The autoscaled demo end to end, on the report `sparkgate demo --scenario autoscaled-tiny --json` wrote
    in the value benchmark's round (the demo's four runs take a minute: run once, for both; the demo's other
    scenarios are tests/sandbox/test_demo.py's): one run per setting of what the autoscaler sees; the node
    group grows in every run, and with sparkgate the scheduler never sees more than the cap."""
    (report,) = finished(results, "value")["autoscaled"]["reports"]
    scenario = SCENARIOS["autoscaled-tiny"]
    assert report["runs"] == [run.key for run in scenario.runs] and report["runs"][0] == "without"
    assert report["autoscaling"]["static_nodes"] == 1 and report["executors"] == scenario.executors
    cap, drivers = scenario.max_pending_cluster, len(scenario.apps)
    for run in scenario.runs:
        result = report[run.key]
        grown = result["autoscaling"]
        assert result["complete"] and result["sparkgate"] == run.sparkgate, run.key
        # Nodes joined (the static one counted from the start), each after a scale-up asked for it.
        assert grown["scale_up_rounds"] == len(grown["nodes_added"]) >= 1
        assert sum(grown["nodes_added"]) >= len(grown["node_joins_s"]) >= grown["peak_nodes"] - 1 >= 1
        assert grown["node_minutes"] > 0
        assert result["executor_marked_s"], run.key  # the autoscaler had pods to see
        if run.sparkgate:
            assert result["cap_violations"] == [] and 0 < result["peak_unscheduled_executor_pods"] <= cap
            assert result["scheduler_peak_pending"] <= cap + drivers  # the drivers wait there too
            assert result["peak_gated_executor_pods"] > 0 and result["bypassed_pods"] == 0
        # What the autoscaler was shown of the held pods: marks only with `held` and no request, requests
        # (each app's held pods released once one is provisioned) only with a class.
        assert result["policy"] == dict(run.allocation), run.key
        requests = run.allocation.get("provisioning", "none") != "none"
        held = run.allocation.get("autoscalerDemand") == "held" and not requests
        assert (grown["marked_while_held"] > 0) == held, run.key
        assert (grown["provisioned_requests"] > 0) == requests, run.key
        assert grown["provisioning_requests"] >= grown["provisioned_requests"]
    assert [r.key for r in scenario.runs] == ["without", "released", "held", "provisioning"]
    without = report["without"]
    # Without sparkgate the node group grows to fit every executor at once: all of them run.
    assert without["all_running_s"] is not None and without["scheduler_peak_pending"] > cap
    assert without["autoscaling"]["peak_nodes"] * 4 >= scenario.executors


def test_extender(results: Results) -> None:
    document = finished(results, "extender")
    config = document["config"]
    assert config["apps_with_refused_nodes"] > 0 and config["most_refused_nodes"] > 0  # filter has work
    for key in ("in_process_ms", "in_process_cpu_ms", "http_ms"):
        for verb in ("filter", "prioritize"):
            figures = document[key][verb]
            assert figures["count"] == config["requests"] and 0 < figures["p50"] <= figures["p99"]
            assert figures["p99_range"] == [figures["p99"], figures["p99"]]
    assert len(document["rounds"]) == config["rounds"] == 1


def test_kubesim_policy(results: Results) -> None:
    document = finished(results, "kubesim_policy")
    (round_,) = document["rounds"]
    for case in ("without", "with_policy"):
        for where in ("http_ms", "chain_ms"):
            entry = round_[case][where]
            assert entry["count"] == document["config"]["pods"] and 0 < entry["p50"] <= entry["p99"]
    assert set(document["summary"]["added_p50_ms"]) == {"http_ms", "chain_ms"}


def test_gates(results: Results) -> None:
    document = finished(results, "gates")
    floor, actor, config = document["floor"], document["actor"], document["config"]
    assert floor["removals"] == actor["removals"] == config["executors"] > 0
    assert positive(floor["per_second"]) and positive(actor["per_second"]) and positive(document["ratio"])
    assert actor["kube_api_qps"] > 0 and actor["kube_api_burst"] > 0
    # The allocator's own histogram saw the gate removals (the last one may land after the scrape).
    metric = actor["gate_removal_metric_ms"]
    assert config["executors"] - 1 <= metric["count"] <= config["executors"]
    assert 0 <= metric["p50"] <= metric["p99"]
    paced = actor["paced"]["created_to_removed_ms"]
    assert actor["paced"]["pods"] == config["paced"] > 0 and 0 < paced["p50"] <= paced["p99"] <= paced["max"]


def test_admission_policy(results: Results) -> None:
    document = finished(results, "admission_policy")
    for entry in document["cel_cost"].values():
        for kind in ("estimate", "measured_kubesim"):
            assert 0 < entry[kind]["max_expression"] <= entry[kind]["total"] < 10_000_000
        measured = entry["measured_kubesim"]
        assert measured["model"].startswith("cel-go runtime cost")
        assert measured["by_expression"][measured["dearest"]] == measured["max_expression"]
        # The estimate bounds what kubesim measures on a real Spark pod.
        assert entry["estimate"]["total"] >= measured["total"]
    for mode in ("policy", "webhook"):
        figures = document["create_ms"][mode]
        assert figures["count"] == document["config"]["pods"] and 0 < figures["p50"] <= figures["p95"]
