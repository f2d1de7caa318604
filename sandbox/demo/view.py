"""What the demo shows: a live view of a run, plain progress lines for logs, and the final comparison of the
scenario's runs, a column each (without sparkgate, then with it; an autoscaled scenario once per setting)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from .scenarios import Scenario
from .workload import Run, RunResult


def _title(run: Run) -> str:
    return run.spec.title


def live_view(run: Run) -> RenderableType:
    """Per app: gated, waiting for a node, running, deleted, progress; the cluster against the cap."""
    tracker, scenario = run.tracker, run.scenario
    now = tracker.now()
    with tracker.lock:
        apps = list(tracker.apps.values())
        unscheduled, peak, gated, running, nodes = (
            tracker.unscheduled,
            tracker.peak_unscheduled,
            tracker.gated,
            tracker.running,
            tracker.nodes,
        )
        rows = [
            (
                a.spec.name,
                a.spec.target_at(now - a.submitted),
                a.gated,
                a.waiting + a.bound,
                a.running,
                a.deleted,
                min(1.0, a.work_at(now) / a.spec.work) if a.complete is None else 1.0,
                a.complete,
                a.first_running,
                a.submitted,
            )
            for a in apps
        ]
    table = Table(title=f"{scenario.name}: {_title(run)}  ·  {now:5.1f}s", expand=False)
    for header in ("app", "wants", "gated", "in flight", "running", "deleted", "work", "status"):
        table.add_column(header, justify="left" if header in ("app", "work", "status") else "right")
    for name, wants, g, flight, r, deleted, progress, complete, first, submitted in rows:
        if complete is not None:
            status = Text(f"done after {complete - submitted:.1f}s", style="green")
        elif first is not None:
            status = Text(f"first executor after {first - submitted:.1f}s")
        else:
            status = Text("waiting for executors", style="yellow")
        table.add_row(
            name,
            str(wants),
            str(g),
            str(flight),
            str(r),
            str(deleted),
            ProgressBar(total=1.0, completed=progress, width=24),
            status,
        )
    cap = f" / cap {scenario.max_pending_cluster}" if run.sparkgate else " (no cap)"
    style = "red" if run.sparkgate and unscheduled > scenario.max_pending_cluster else "bold"
    cluster = Text.assemble(
        ("cluster: ", "bold"),
        (f"{unscheduled} unscheduled{cap}", style),
        f" (peak {peak})  ·  {gated} gated  ·  {running}/{scenario.capacity} executor slots running",
    )
    parts: list[RenderableType] = [table, cluster]
    if scenario.autoscaling is not None:
        parts.append(_nodes(run, nodes))
    for what, url in run.endpoints.items():
        parts.append(Text(f"{what}: {url}", style="dim"))
    return Group(*parts)


def _nodes(run: Run, nodes: int) -> Text:
    """The autoscaled cluster: its nodes, those asked for and not there yet, its scale-ups so far (the
    autoscaler's target sizes and count, numbers its thread writes, read as they are for a display)."""
    autoscaler = run.system.cluster.autoscaler if run.system is not None else None
    if autoscaler is None:
        return Text(f"nodes: {nodes}")
    asked = sum(autoscaler.cloud.target.values()) + run.scenario.nodes
    rounds = autoscaler.rounds - run.rounds_before
    return Text.assemble(
        ("nodes: ", "bold"),
        f"{nodes} ",
        ("█" * nodes, "green"),
        ("░" * max(0, asked - nodes), "yellow"),
        f" {max(0, asked - nodes)} provisioning · peak {run.tracker.peak_nodes} · {rounds} scale-ups · "
        f"{run.tracker.node_seconds(run.tracker.now()) / 60:.1f} node-minutes",
    )


def plain_line(run: Run) -> str:
    tracker = run.tracker
    with tracker.lock:
        apps = " ".join(
            f"{a.spec.name}={a.running}r/{a.gated}g/{a.waiting + a.bound}f"
            + ("✓" if a.complete is not None else "")
            for a in tracker.apps.values()
        )
        nodes = f" nodes={tracker.nodes}" if run.scenario.autoscaling is not None else ""
        return (
            f"[{_title(run)}] t={tracker.now():5.1f}s unscheduled={tracker.unscheduled} "
            f"(peak {tracker.peak_unscheduled}) gated={tracker.gated} running={tracker.running}{nodes} | {apps}"
        )


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}s"


def _worst(result: RunResult, key: str) -> float | None:
    values = [a[key] for a in result.apps.values()]
    return None if any(v is None for v in values) else max(values)


def _mean(result: RunResult, key: str) -> float | None:
    values = [a[key] for a in result.apps.values()]
    return None if not values or any(v is None for v in values) else sum(values) / len(values)


def comparison(scenario: Scenario, results: list[RunResult]) -> Table:
    """The runs side by side, a column each."""
    settings = "; ".join(
        f"{r.run.title}: sparkgate with " + ", ".join(f"{k}: {v}" for k, v in r.run.allocation.items())
        for r in results
        if r.run.allocation
    )
    table = Table(
        title=f"{scenario.name}: {scenario.description}", caption=settings or None, show_lines=False
    )
    table.add_column("measured in this run")
    for result in results:
        table.add_column(result.run.title, justify="right")

    def row(figure: str, value: Callable[[RunResult], str]) -> None:
        table.add_row(figure, *(value(r) for r in results))

    cap = scenario.max_pending_cluster
    if scenario.autoscaling is not None:
        row("every executor running after", lambda r: _seconds(r.all_running))
        row("scale-up rounds", lambda r: str(_autoscaled(r, "scale_up_rounds")))
        row("peak nodes", lambda r: str(_autoscaled(r, "peak_nodes")))
        row("node-minutes", lambda r: f"{_autoscaled(r, 'node_minutes'):.1f}")
        row("peak pods waiting in the scheduler", lambda r: str(r.scheduler_peak_pending))
        row("executor pods marked while held", lambda r: str(_autoscaled(r, "marked_while_held")))
        row(
            "ProvisioningRequests (provisioned)",
            lambda r: f"{_autoscaled(r, 'provisioning_requests')} ({_autoscaled(r, 'provisioned_requests')})",
        )
    row(
        "peak unscheduled executor pods",
        lambda r: f"{r.peak_unscheduled} (cap {cap})" if r.sparkgate else str(r.peak_unscheduled),
    )
    row("peak executor pods held back (gated)", lambda r: str(r.peak_gated))
    row("releases past a limit", lambda r: str(len(r.cap_violations)) if r.sparkgate else "—")
    row("scheduling attempts", lambda r: str(r.scheduling_attempts))
    row("every app had its first executor after", lambda r: _seconds(_worst(r, "first_executor_after_s")))
    row("mean time to first executor", lambda r: _seconds(_mean(r, "first_executor_after_s")))
    row("every app had all its executors running after", lambda r: _seconds(_worst(r, "all_running_after_s")))
    for app in scenario.apps:
        table.add_row(
            f"  {app.name} complete after",
            *(_seconds(r.apps.get(app.name, {}).get("complete_after_s")) for r in results),
        )
    row("all apps complete after", lambda r: _seconds(_total(r)))
    for who in ("spark drivers", "sparkgate"):
        table.add_row(f"API requests by {who}", *(str(r.api_requests[who]) for r in results))
    row(
        "executor pods deleted before running",
        lambda r: str(sum(a["deleted_before_running"] for a in r.apps.values())),
    )
    return table


def _autoscaled(result: RunResult, key: str) -> Any:
    return (result.autoscaling or {}).get(key, 0)


def _total(result: RunResult) -> float | None:
    if not result.complete:
        return None
    return max(float(a["submitted_s"] + a["complete_after_s"]) for a in result.apps.values())


def report_dict(scenario: Scenario, results: list[RunResult]) -> dict[str, Any]:
    """The comparison as JSON: the scenario, then each run under its key ("without", "with"; an autoscaled
    scenario's "without", "released", ...), in the order `runs` lists them."""
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "executor_slots": scenario.capacity,
        "executors": scenario.executors,
        "cap": scenario.max_pending_cluster,
        "pacing": scenario.pacing,
        "spark_allocator": scenario.spark_allocator,
        "autoscaling": None
        if scenario.autoscaling is None
        else {
            "static_nodes": scenario.nodes,
            "executors_per_node": scenario.autoscaling.executors_per_node,
            "max_nodes": scenario.autoscaling.max_nodes,
            **{
                key: getattr(scenario.autoscaling.config(), key)
                for key in (
                    "provisioning_delay",
                    "scan_interval",
                    "loop_duration",
                    "new_pods_buffer",
                    "unneeded_time",
                )
            },
        },
        "runs": [r.run.key for r in results],
        **{r.run.key: r.to_dict() for r in results},
    }
