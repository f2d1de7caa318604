"""`sparkgate demo`: the same workload on kubesim without and then with sparkgate, and the comparison."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from .scenarios import DEFAULT, SCENARIOS, Scenario
from .view import comparison, live_view, plain_line, report_dict
from .workload import Run, RunResult


def register(subparsers: Any) -> None:
    d = subparsers.add_parser(
        "demo",
        help="run sparkgate on a simulated cluster, without and with it, and compare",
        description="Runs the real webhook (gunicorn, TLS) and the real allocator against kubesim, a "
        "simulated cluster too small for its Spark applications: first without sparkgate, then with it.",
    )
    d.add_argument(
        "--scenario", choices=sorted(SCENARIOS), default=DEFAULT, help="the workload and cluster (--list)"
    )
    d.add_argument(
        "--duration",
        type=float,
        metavar="SECONDS",
        help="bound of each of the two runs (default: the scenario's)",
    )
    d.add_argument(
        "--admission",
        choices=("webhook", "policy"),
        default="webhook",
        help="how sparkgate shapes and gates executor pods in the run with it: its webhook, or the "
        "MutatingAdmissionPolicy the allocator renders from the policy (docs/install.md)",
    )
    d.add_argument("--no-live", action="store_true", help="plain progress lines instead of the live view")
    d.add_argument("--json", type=Path, metavar="FILE", help="also write the comparison to this file")
    d.add_argument(
        "--pacing",
        choices=("adaptive", "fixed"),
        help="the policy's pacing (default: the scenario's, adaptive)",
    )
    d.add_argument("--list", action="store_true", help="list the scenarios and exit")
    d.set_defaults(run=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    console = Console()
    if args.list:
        for name, s in sorted(SCENARIOS.items()):
            console.print(f"[bold]{name}[/bold]: {s.description}")
        return 0
    # The simulated drivers log retries and refusals; the runs are measured, not logged.
    logging.basicConfig(level=logging.ERROR)
    scenario = SCENARIOS[args.scenario]
    if args.pacing:
        scenario = dataclasses.replace(scenario, pacing=args.pacing)
    duration = args.duration if args.duration is not None else scenario.duration
    live = not args.no_live and console.is_terminal
    apps = ", ".join(f"{a.name} ({a.executors})" for a in scenario.apps)
    console.print(
        f"[bold]sparkgate demo[/bold] · scenario [bold]{scenario.name}[/bold]: {scenario.description}\n"
        f"kubesim cluster: {scenario.nodes} nodes, room for {scenario.capacity} executors · apps: {apps}\n"
        f"policy: batchSize {scenario.batch_size}, maxPendingPerApp {scenario.max_pending_per_app}, "
        f"maxPendingCluster {scenario.max_pending_cluster}, pacing {scenario.pacing} · "
        f"each run is bounded to {duration:g}s"
        + (" · sparkgate as a MutatingAdmissionPolicy, no webhook" if args.admission == "policy" else "")
    )
    results: list[RunResult] = []
    for sparkgate in (False, True):
        run = Run(scenario, sparkgate=sparkgate, duration=duration, admission=args.admission)
        results.append(_execute(run, console, live))
    without, with_ = results
    console.print(comparison(scenario, without, with_))
    report = report_dict(scenario, without, with_)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return _verdict(console, scenario, without, with_)


def _execute(run: Run, console: Console, live: bool) -> RunResult:
    if live:
        with Live(live_view(run), console=console, refresh_per_second=4) as display:
            run.on_tick = lambda r: display.update(live_view(r))
            return run.execute()
    last = [-10.0]

    def progress(r: Run) -> None:
        now = r.tracker.now()
        if now - last[0] >= 2.0:
            last[0] = now
            console.print(plain_line(r), highlight=False, soft_wrap=True, markup=False)
            if r.endpoints and last[0] < 2.0:
                console.print(
                    " · ".join(f"{k}: {v}" for k, v in r.endpoints.items()), highlight=False, markup=False
                )

    run.on_tick = progress
    result = run.execute()
    console.print(plain_line(run), highlight=False, soft_wrap=True, markup=False)
    return result


def _verdict(console: Console, scenario: Scenario, without: RunResult, with_: RunResult) -> int:
    problems = []
    if with_.peak_unscheduled > scenario.max_pending_cluster:
        problems.append(
            f"with sparkgate the peak of unscheduled pods ({with_.peak_unscheduled}) went past the cap "
            f"({scenario.max_pending_cluster})"
        )
    if not with_.complete:
        problems.append("with sparkgate not every app completed within the run's duration")
    if with_.bypassed:
        problems.append(f"{with_.bypassed} executor pods were admitted without sparkgate")
    if not without.complete:
        console.print("[yellow]without sparkgate not every app completed within the run's duration[/yellow]")
    for problem in problems:
        console.print(f"[red]{problem}[/red]")
    if not problems:
        console.print(
            f"[green]with sparkgate: at most {with_.peak_unscheduled} unscheduled executor pods "
            f"(cap {scenario.max_pending_cluster}, {without.peak_unscheduled} without), every app complete."
            "[/green]"
        )
    return 1 if problems else 0
