"""The value: the demo's with/without comparison at a larger size, as numbers.

Runs `sparkgate demo --scenario large --no-live --json FILE` (the lead's demo, sparkgate/demo/: the same Spark
workload on kubesim, first without sparkgate, then with the real webhook and allocator) and reads its JSON:
five drivers of 200 executors on room for 100. Reported per run: peak unscheduled executor pods, scheduling
attempts, API requests (by the drivers, by sparkgate, in all) and completion time per app, with the ratios
with/without. The demo is run as a command, as a user runs it, so this benchmark follows the demo as it
changes; a failed run is reported with the demo's output, not hidden.

    python -m bench.value [--scenario large] [--rounds 1] [--smoke]
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

from . import common
from .common import Row, median

NAME = "value"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default="large", help="a `sparkgate demo --list` scenario")
    parser.add_argument("--rounds", type=int, default=1, help="demo runs (each is without, then with)")
    parser.add_argument("--duration", type=float, help="bound of each run, seconds (default: the scenario's)")


def demo(scenario: str, duration: float | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sparkgate-bench-value-") as tmp:
        out = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "sparkgate.cli", "demo", "--scenario", scenario, "--no-live"]
        command += ["--json", str(out)]
        if duration is not None:
            command += ["--duration", str(duration)]
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

    done_without, done_with = completion(without), completion(with_)
    last_without = max((v for v in done_without.values() if v is not None), default=None)
    last_with = max((v for v in done_with.values() if v is not None), default=None)
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
        "scheduling_attempts": {
            "without": without["scheduling_attempts"],
            "with": with_["scheduling_attempts"],
            "ratio": ratio(with_["scheduling_attempts"], without["scheduling_attempts"]),
        },
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
        "all_complete_after_s": {
            "without": last_without,
            "with": last_with,
            "ratio": ratio(last_with, last_without),
        },
        "demo_exit_code": report["demo_exit_code"],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    scenario, duration = args.scenario, args.duration
    rounds = args.rounds
    if args.smoke:
        scenario, rounds = "tiny", 1
    reports = [demo(scenario, duration) for _ in range(rounds)]
    comparisons = [compare(r) for r in reports]

    def med(get: Any) -> float | None:
        values = [v for v in (get(c) for c in comparisons) if v is not None]
        return round(median(values), 3) if values else None

    first = reports[0]
    return {
        "scenario": scenario,
        "description": first.get("description"),
        "executor_slots": first.get("executor_slots"),
        "cap": first.get("cap"),
        "source": "python -m sparkgate.cli demo --scenario NAME --no-live --json FILE (sparkgate/demo/)",
        "rounds": rounds,
        "summary": {
            "peak_unscheduled_ratio": med(lambda c: c["peak_unscheduled"]["ratio"]),
            "scheduling_attempts_ratio": med(lambda c: c["scheduling_attempts"]["ratio"]),
            "api_requests_ratio": med(lambda c: c["api_requests"]["ratio"]),
            "all_complete_ratio": med(lambda c: c["all_complete_after_s"]["ratio"]),
        },
        "comparisons": comparisons,
        "reports": reports,
    }


def rows(result: dict[str, Any]) -> list[Row]:
    c = result["comparisons"][0]
    s = result["summary"]
    peak, attempts, api = c["peak_unscheduled"], c["scheduling_attempts"], c["api_requests"]
    done = c["all_complete_after_s"]

    def x(value: float | None) -> str:
        return "n/a" if value is None else f"x{value:.3f}"

    def sec(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1f} s"

    return [
        Row("scenario", f"{result['scenario']}: {result['description']}"),
        Row(
            "peak unscheduled executor pods (without / with)",
            f"{peak['without']} / {peak['with']} (cap {peak['cap']}, {x(s['peak_unscheduled_ratio'])})",
            "<= cap",
            peak["cap"] is not None and peak["with"] <= peak["cap"],
        ),
        Row(
            "scheduling attempts (without / with)",
            f"{attempts['without']:,} / {attempts['with']:,} ({x(s['scheduling_attempts_ratio'])})",
        ),
        Row(
            "API requests, all clients (without / with)",
            f"{api['total_without']:,} / {api['total_with']:,} ({x(s['api_requests_ratio'])})",
        ),
        Row(
            "all apps complete after (without / with)",
            f"{sec(done['without'])} / {sec(done['with'])} ({x(s['all_complete_ratio'])})",
            "",
            c["complete"]["with"],
        ),
    ]


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
