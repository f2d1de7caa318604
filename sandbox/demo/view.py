"""What the demo shows: a live view of a run, plain progress lines for logs, and the final comparison."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from .scenarios import Scenario
from .workload import Run, RunResult


def _title(run: Run) -> str:
    return "with sparkgate" if run.sparkgate else "without sparkgate"


def live_view(run: Run) -> RenderableType:
    """Per app: gated, waiting for a node, running, deleted, progress; the cluster against the cap."""
    tracker, scenario = run.tracker, run.scenario
    now = tracker.now()
    with tracker.lock:
        apps = list(tracker.apps.values())
        unscheduled, peak, gated, running = (
            tracker.unscheduled,
            tracker.peak_unscheduled,
            tracker.gated,
            tracker.running,
        )
        rows = [
            (
                a.spec.name,
                a.spec.executors
                if a.spec.scale_to is None or now < a.submitted + a.spec.scale_to[0]
                else a.spec.scale_to[1],
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
    for what, url in run.endpoints.items():
        parts.append(Text(f"{what}: {url}", style="dim"))
    return Group(*parts)


def plain_line(run: Run) -> str:
    tracker = run.tracker
    with tracker.lock:
        apps = " ".join(
            f"{a.spec.name}={a.running}r/{a.gated}g/{a.waiting + a.bound}f"
            + ("✓" if a.complete is not None else "")
            for a in tracker.apps.values()
        )
        return (
            f"[{_title(run)}] t={tracker.now():5.1f}s unscheduled={tracker.unscheduled} "
            f"(peak {tracker.peak_unscheduled}) gated={tracker.gated} running={tracker.running} | {apps}"
        )


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}s"


def _worst(result: RunResult, key: str) -> float | None:
    values = [a[key] for a in result.apps.values()]
    return None if any(v is None for v in values) else max(values)


def _mean(result: RunResult, key: str) -> float | None:
    values = [a[key] for a in result.apps.values()]
    return None if not values or any(v is None for v in values) else sum(values) / len(values)


def comparison(scenario: Scenario, without: RunResult, with_: RunResult) -> Table:
    table = Table(title=f"{scenario.name}: {scenario.description}", show_lines=False)
    table.add_column("measured in this run")
    table.add_column("without sparkgate", justify="right")
    table.add_column("with sparkgate", justify="right")
    table.add_row(
        "peak unscheduled executor pods",
        str(without.peak_unscheduled),
        f"{with_.peak_unscheduled} (cap {scenario.max_pending_cluster})",
    )
    table.add_row("peak executor pods held back (gated)", str(without.peak_gated), str(with_.peak_gated))
    table.add_row("scheduling attempts", str(without.scheduling_attempts), str(with_.scheduling_attempts))
    table.add_row(
        "every app had its first executor after",
        _seconds(_worst(without, "first_executor_after_s")),
        _seconds(_worst(with_, "first_executor_after_s")),
    )
    table.add_row(
        "mean time to first executor",
        _seconds(_mean(without, "first_executor_after_s")),
        _seconds(_mean(with_, "first_executor_after_s")),
    )
    table.add_row(
        "every app had all its executors running after",
        _seconds(_worst(without, "all_running_after_s")),
        _seconds(_worst(with_, "all_running_after_s")),
    )
    for name in without.apps:
        table.add_row(
            f"  {name} complete after",
            _seconds(without.apps[name]["complete_after_s"]),
            _seconds(with_.apps.get(name, {}).get("complete_after_s")),
        )
    table.add_row("all apps complete after", _seconds(_total(without)), _seconds(_total(with_)))
    for who in ("spark drivers", "sparkgate"):
        table.add_row(f"API requests by {who}", str(without.api_requests[who]), str(with_.api_requests[who]))
    table.add_row(
        "executor pods deleted before running",
        str(sum(a["deleted_before_running"] for a in without.apps.values())),
        str(sum(a["deleted_before_running"] for a in with_.apps.values())),
    )
    return table


def _total(result: RunResult) -> float | None:
    if not result.complete:
        return None
    return max(float(a["submitted_s"] + a["complete_after_s"]) for a in result.apps.values())


def report_dict(scenario: Scenario, without: RunResult, with_: RunResult) -> dict[str, Any]:
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "executor_slots": scenario.capacity,
        "cap": scenario.max_pending_cluster,
        "pacing": scenario.pacing,
        "spark_allocator": scenario.spark_allocator,
        "without": without.to_dict(),
        "with": with_.to_dict(),
    }
