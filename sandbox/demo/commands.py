"""`sparkgate demo`: the same workload on kubesim without and then with sparkgate, and the comparison (an
autoscaled scenario: once more per setting of what the autoscaler sees, scenarios.py `RUNS_AUTOSCALED`)."""

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
        help="bound of each run (default: the scenario's)",
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
    if not console.is_terminal:  # a log: a line as long as the comparison's columns need
        console = Console(width=max(console.width, 120))
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
    apps = ", ".join(
        f"{a.name} ({a.executors}{f' -> {a.final}' if a.final != a.executors else ''})" for a in scenario.apps
    )
    grows = scenario.autoscaling
    cluster = (
        f"{scenario.nodes} nodes, room for {scenario.capacity} executors"
        if grows is None
        else f"{scenario.nodes} node and a node group of up to {grows.max_nodes} nodes of "
        f"{grows.executors_per_node} executors, each ready {grows.config().provisioning_delay:g}s after "
        "cluster-autoscaler asks for it"
    )
    console.print(
        f"[bold]sparkgate demo[/bold] · scenario [bold]{scenario.name}[/bold]: {scenario.description}\n"
        f"kubesim cluster: {cluster} · apps: {apps}\n"
        f"policy: batchSize {scenario.batch_size}, maxPendingPerApp {scenario.max_pending_per_app}, "
        f"maxPendingCluster {scenario.max_pending_cluster}, pacing {scenario.pacing} · "
        f"each run is bounded to {duration:g}s"
        + (" · sparkgate as a MutatingAdmissionPolicy, no webhook" if args.admission == "policy" else "")
    )
    results: list[RunResult] = []
    for spec in scenario.runs:
        run = Run(scenario, spec, duration=duration, admission=args.admission)
        results.append(_execute(run, console, live))
    console.print(comparison(scenario, results))
    report = report_dict(scenario, results)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return _verdict(console, scenario, results)


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


def _verdict(console: Console, scenario: Scenario, results: list[RunResult]) -> int:
    """What must hold in every run with sparkgate: no release past a limit, so never more unscheduled executor
    pods than the cap; every app complete; no executor admitted without sparkgate."""
    problems = []
    cap = scenario.max_pending_cluster
    for result in results:
        title = result.run.title
        if not result.sparkgate:
            if not result.complete:
                console.print(f"[yellow]{title}: not every app completed within the run's duration[/yellow]")
            continue
        if result.peak_unscheduled > cap:
            problems.append(
                f"{title}: the peak of unscheduled pods ({result.peak_unscheduled}) went past the cap ({cap})"
            )
        problems += [f"{title}: {violation}" for violation in result.cap_violations[:5]]
        if not result.complete:
            problems.append(f"{title}: not every app completed within the run's duration")
        if result.bypassed:
            problems.append(f"{title}: {result.bypassed} executor pods were admitted without sparkgate")
    for problem in problems:
        console.print(f"[red]{problem}[/red]")
    if not problems:
        peaks = "; ".join(f"{r.run.title} {r.peak_unscheduled}" for r in results)
        console.print(
            f"[green]peak unscheduled executor pods: {peaks} (cap {cap}); every app complete with sparkgate."
            "[/green]"
        )
    return 1 if problems else 0
