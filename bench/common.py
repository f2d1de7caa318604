"""What every benchmark shares: where results go, the machine they ran on, medians and percentiles, CPU pinning,
and the command line (`--smoke`, `--out`).

A benchmark module exposes `NAME`, `run(args) -> dict` (the result document), `rows(result) -> list[Row]`
(its lines of the table) and `add_arguments(parser)`; `main(module)` turns that into `python -m bench.<name>`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple, Protocol, cast

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
SMOKE_RESULTS = RESULTS / "smoke"
FIXTURES = REPO / "tests" / "data" / "spark-4.3"
EXAMPLE_POLICY = REPO / "manifests" / "components" / "example-policy" / "policy.yaml"


class Row(NamedTuple):
    """One line of the table: what was measured, its value, the target (or ""), and whether it is met."""

    figure: str
    value: str
    target: str = ""
    met: bool | None = None


class Benchmark(Protocol):
    NAME: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> dict[str, Any]: ...

    def rows(self, result: dict[str, Any]) -> list[Row]: ...


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..1) of `values`; nan when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))])


def machine() -> dict[str, Any]:
    """The machine a result was measured on (these machines are shared and noisy: ratios, not absolutes)."""
    model = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model name":
                model = value.strip()
    return {
        "cpu": model or platform.processor(),
        "cpus": os.cpu_count(),
        "cpus_available": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "system": f"{platform.system()} {platform.release()}",
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


@contextlib.contextmanager
def pinned(cpu_set: set[int] | None) -> Iterator[None]:
    """Run the calling thread (and the processes it starts meanwhile) on `cpu_set`; None leaves it alone."""
    if not cpu_set:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpu_set)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def taskset(cpu: int | None) -> list[str]:
    """The `taskset` prefix that pins a command to `cpu` (empty when there is no CPU to spare)."""
    if cpu is None:
        return []
    return ["taskset", "-c", str(cpu)]


def group_cpu_seconds(pgid: int) -> tuple[float, float]:
    """(user, system) CPU seconds used so far by the live processes of process group `pgid` (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    user = system = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if int(fields[2]) == pgid:  # field 5 of stat, pgrp
            user += int(fields[11]) / tick  # utime
            system += int(fields[12]) / tick  # stime
    return user, system


def write_result(name: str, result: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def table(sections: Sequence[tuple[str, Sequence[Row]]]) -> str:
    """A plain-text table: benchmark, figure, value, target, met."""
    lines = [("benchmark", "figure", "value", "target", "met")]
    for name, rows in sections:
        for row in rows:
            met = "" if row.met is None else ("yes" if row.met else "NO")
            lines.append((name, row.figure, row.value, row.target, met))
    widths = [max(len(line[i]) for line in lines) for i in range(5)]
    out = []
    for n, line in enumerate(lines):
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def parser_for(benchmark: Benchmark, description: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m bench.{benchmark.NAME}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny run that takes seconds (for CI)")
    parser.add_argument(
        "--out",
        type=Path,
        help=f"directory for {benchmark.NAME}.json (default bench/results, bench/results/smoke with --smoke)",
    )
    benchmark.add_arguments(parser)
    return parser


def execute(benchmark: Benchmark, args: argparse.Namespace) -> dict[str, Any]:
    """Run one benchmark and write its result document; returns it."""
    started = time.time()
    result = benchmark.run(args)
    document = {
        "benchmark": benchmark.NAME,
        "smoke": bool(args.smoke),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "machine": machine(),
        **result,
    }
    out = args.out or (SMOKE_RESULTS if args.smoke else RESULTS)
    path = write_result(benchmark.NAME, document, out)
    print(f"# wrote {path}", file=sys.stderr)
    return document


def main(module: ModuleType, argv: list[str] | None = None) -> int:
    """`python -m bench.<name>`: run the benchmark module, write its result, print its table."""
    benchmark = cast(Benchmark, module)
    args = parser_for(benchmark, module.__doc__).parse_args(argv)
    document = execute(benchmark, args)
    print(table([(benchmark.NAME, benchmark.rows(document))]))
    return 0


def fmt(value: float, digits: int = 1, unit: str = "") -> str:
    return f"{value:,.{digits}f}{unit}"


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started
