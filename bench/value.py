"""The value: the demo's with/without comparison at a larger size, as numbers, and on an autoscaled cluster.

Runs `sparkgate demo --scenario large --no-live --json FILE` (the lead's demo, sandbox/demo/: the same Spark
workload on kubesim, first without sparkgate, then with the real webhook and allocator) and reads its JSON:
five drivers of 200 executors on room for 100. Reported per run: peak unscheduled executor pods, scheduling
attempts, API requests (by the drivers, by sparkgate, in all) and completion time per app, with the ratios
with/without. The demo is run as a command, as a user runs it, so this benchmark follows the demo as it
changes; a failed run is reported with the demo's output, not hidden.

Then an autoscaled scenario (`--autoscaled`, under the document's "autoscaled"; bench/value_autoscaled.py):
a node group grown by kubesim's cluster-autoscaler, run without sparkgate and once per setting of what the
autoscaler sees, with issue 36's targets checked. By default `autoscaled`, at cluster-autoscaler's and
Spark's own timers (about 13 minutes a round); `autoscaled-fast`, the apps at a tenth of them, is a quick look,
where what each request costs is not scaled with the timers (sandbox/demo/scenarios.py).

    python -m bench.value [--scenario large] [--autoscaled autoscaled|autoscaled-fast|none] [--pacing P]
                          [--rounds 3] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import common, value_autoscaled
from .common import Row, median

NAME = "value"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default="large", help="a `sparkgate demo --list` scenario")
    parser.add_argument(
        "--autoscaled",
        default="autoscaled",
        help="the autoscaled scenario to run its four runs of (`none`: skip it)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="demo runs of each scenario (each is all of its runs)"
    )
    parser.add_argument("--duration", type=float, help="bound of each run, seconds (default: the scenario's)")
    parser.add_argument(
        "--pacing", choices=("adaptive", "fixed"), help="the policy's (default: the scenario's)"
    )


def demo(scenario: str, duration: float | None, pacing: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sparkgate-bench-value-") as tmp:
        out = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "sparkgate.cli", "demo", "--scenario", scenario, "--no-live"]
        command += ["--json", str(out)]
        if duration is not None:
            command += ["--duration", str(duration)]
        if pacing is not None:
            command += ["--pacing", pacing]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=common.REPO,
            env={**os.environ, "TMPDIR": tmp},
            timeout=1800,
        )
        if not out.exists():
            raise RuntimeError(
                f"the demo wrote no report (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        report: dict[str, Any] = json.loads(out.read_text())
    report["demo_exit_code"] = done.returncode
    if done.returncode != 0:
        report["demo_output_tail"] = (done.stdout + done.stderr)[-2000:]
    return report


def compare(report: dict[str, Any]) -> dict[str, Any]:
    """The figures of one demo report, with/without side by side."""
    without, with_ = report["without"], report["with"]

    def requests(run: dict[str, Any]) -> int:
        return int(sum(run["api_requests"].values()))

    def completion(run: dict[str, Any]) -> dict[str, float | None]:
        return {name: app["complete_after_s"] for name, app in sorted(run["apps"].items())}

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    def all_created(run: dict[str, Any]) -> float | None:
        """When the drivers had created every executor, from the start of the run (None if none was)."""
        ends = [
            app["submitted_s"] + app["all_created_after_s"]
            for app in run["apps"].values()
            if app.get("all_created_after_s") is not None
        ]
        return round(max(ends), 2) if ends else None

    def start(run: dict[str, Any], q: float) -> float | None:
        """The q-th percentile of the executors' creation -> first Running, seconds (None: none ran)."""
        seconds = run["executor_start_s"]
        return round(common.percentile(seconds, q), 3) if seconds else None

    def side_by_side(get: Any) -> dict[str, float | None]:
        """A figure of each run, and with / without."""
        a, b = get(without), get(with_)
        return {"without": a, "with": b, "ratio": ratio(b, a)}

    done_without, done_with = completion(without), completion(with_)
    return {
        "peak_unscheduled": {
            "without": without["peak_unscheduled_executor_pods"],
            "with": with_["peak_unscheduled_executor_pods"],
            "cap": report.get("cap"),
            "ratio": ratio(
                with_["peak_unscheduled_executor_pods"], without["peak_unscheduled_executor_pods"]
            ),
        },
        "peak_gated_with": with_["peak_gated_executor_pods"],
        "scheduling_attempts": side_by_side(lambda run: run["scheduling_attempts"]),
        "api_requests": {
            "without": without["api_requests"],
            "with": with_["api_requests"],
            "total_without": requests(without),
            "total_with": requests(with_),
            "ratio": ratio(requests(with_), requests(without)),
        },
        "complete": {"without": without["complete"], "with": with_["complete"]},
        "completion_after_submission_s": {"without": done_without, "with": done_with},
        "completion_ratio_per_app": {
            name: ratio(done_with.get(name), done_without.get(name)) for name in sorted(done_without)
        },
        "all_complete_after_s": side_by_side(value_autoscaled.last_complete),
        "all_running_after_s": side_by_side(lambda run: run["all_running_s"]),
        # The fill split in two: how fast the drivers created the executors (the API server's time per
        # creation: the webhook's admission is in it), and how long each executor took from its creation
        # to running (the gate, the pacing, the scheduler and the kubelet are in it).
        "all_created_after_s": side_by_side(all_created),
        "executor_start_p50_s": side_by_side(lambda run: start(run, 0.5)),
        "executor_start_p90_s": side_by_side(lambda run: start(run, 0.9)),
        "demo_exit_code": report["demo_exit_code"],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    scenario, duration = args.scenario, args.duration
    rounds, autoscaled = args.rounds, args.autoscaled
    if args.smoke:
        scenario, rounds, autoscaled = "tiny", 1, "autoscaled-tiny" if autoscaled != "none" else "none"
    reports = [demo(scenario, duration, args.pacing) for _ in range(rounds)]
    comparisons = [compare(r) for r in reports]

    def med(get: Any) -> float | None:
        values = [v for v in (get(c) for c in comparisons) if v is not None]
        return round(median(values), 3) if values else None

    first = reports[0]
    summary: dict[str, Any] = {}
    for figure, get in (
        ("peak_unscheduled", lambda c: c["peak_unscheduled"]),
        ("scheduling_attempts", lambda c: c["scheduling_attempts"]),
        ("all_complete_after_s", lambda c: c["all_complete_after_s"]),
        ("all_running_after_s", lambda c: c["all_running_after_s"]),
        ("all_created_after_s", lambda c: c["all_created_after_s"]),
        ("executor_start_p50_s", lambda c: c["executor_start_p50_s"]),
        ("executor_start_p90_s", lambda c: c["executor_start_p90_s"]),
    ):
        summary[figure] = {
            side: med(lambda c, get=get, side=side: get(c)[side]) for side in ("without", "with", "ratio")
        }
    summary["api_requests"] = {
        "without": med(lambda c: c["api_requests"]["total_without"]),
        "with": med(lambda c: c["api_requests"]["total_with"]),
        "ratio": med(lambda c: c["api_requests"]["ratio"]),
    }
    summary["peak_gated_with"] = med(lambda c: c["peak_gated_with"])
    summary["every_app_complete_with"] = all(c["complete"]["with"] for c in comparisons)
    return {
        "scenario": scenario,
        "description": first.get("description"),
        "executor_slots": first.get("executor_slots"),
        "cap": first.get("cap"),
        "pacing": first.get("pacing"),
        "spark_allocator": first.get("spark_allocator"),
        "source": "python -m sparkgate.cli demo --scenario NAME --no-live --json FILE (sandbox/demo/)",
        "rounds": rounds,
        "summary": summary,
        "comparisons": comparisons,
        "reports": reports,
        "autoscaled": None
        if autoscaled == "none"
        else value_autoscaled.summarize([demo(autoscaled, duration, args.pacing) for _ in range(rounds)]),
    }


def rows(result: dict[str, Any]) -> list[Row]:
    s = result["summary"]
    peak, attempts, api, done = (
        s["peak_unscheduled"],
        s["scheduling_attempts"],
        s["api_requests"],
        s["all_complete_after_s"],
    )
    cap = result["cap"]

    def side_by_side(figure: dict[str, Any], unit: str = "", digits: int = 0) -> str:
        def one(value: float | None) -> str:
            return "n/a" if value is None else f"{value:,.{digits}f}{unit}"

        ratio = "n/a" if figure["ratio"] is None else f"x{figure['ratio']:.3f}"
        return f"{one(figure['without'])} / {one(figure['with'])} ({ratio})"

    rounds = f"median of {result['rounds']}" if result["rounds"] > 1 else "one run"
    return [
        Row(
            "scenario",
            f"{result['scenario']}: {result['description']}, pacing {result['pacing']} ({rounds})",
        ),
        Row(
            "peak unscheduled executor pods (without / with)",
            side_by_side(peak) + f", cap {cap}",
            "<= cap",
            peak["with"] is not None and cap is not None and peak["with"] <= cap,
        ),
        Row("peak gated executor pods (with)", f"{s['peak_gated_with'] or 0:,.0f}"),
        Row("scheduling attempts (without / with)", side_by_side(attempts)),
        Row("API requests, all clients (without / with)", side_by_side(api)),
        Row(
            "every executor running after (without / with)",
            side_by_side(s["all_running_after_s"], " s", 1),
        ),
        Row(
            "  of which: every executor created after (without / with)",
            side_by_side(s["all_created_after_s"], " s", 1),
        ),
        Row(
            "  each executor, creation -> running p50; p90 (without / with)",
            side_by_side(s["executor_start_p50_s"], " s", 2)
            + "; "
            + side_by_side(s["executor_start_p90_s"], " s", 2),
        ),
        Row(
            "last app complete after (without / with)",
            side_by_side(done, " s", 1),
            "every app",
            s["every_app_complete_with"],
        ),
        *(value_autoscaled.rows(result["autoscaled"]) if result.get("autoscaled") else []),
    ]


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
