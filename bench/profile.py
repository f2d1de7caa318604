"""Where the time goes, for the two benchmarks whose targets are about CPU: how docs/performance.md's
profiles were taken.

    python -m bench.profile admission [--server webhook|floor] [--seconds 10]
        The webhook (or the floor) under saturated wrk load, sampled by py-spy in the gunicorn worker while it
        holds the GIL (Python's own work; TLS and socket I/O release the GIL). py-spy is not a dependency of
        sparkgate: `.venv/bin/pip install py-spy` first.
    python -m bench.profile scale [--pods 100000]
        bench/scale.py's timed pass at one size, its loop thread (`Controller.run`) under cProfile (stdlib),
        timed by the thread's CPU time (`time.thread_time`: its waits for the GIL and for locks, which the
        wall clock would count against whatever held them, are left out). cProfile inflates small
        functions; read the shares, not the times.

Both print the functions with the largest inclusive and self shares.
"""

from __future__ import annotations

import argparse
import collections
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sandbox.local_webhook import LocalWebhook

from . import common, scale
from .admission import wrk
from .floor import FloorServer


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy")
    return found


def collapsed_shares(path: Path, top: int) -> tuple[int, list[tuple[float, str]], list[tuple[float, str]]]:
    """(samples, inclusive shares, self shares) of py-spy's raw (collapsed) output, gunicorn workers only."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";") if not f.startswith("process ")]
        if not frames or not any("gunicorn/workers" in f for f in frames):
            continue  # the arbiter, not a worker
        n = int(count)
        total += n
        for frame in set(frames):
            inclusive[frame] += n
        own[frames[-1]] += n
    return (
        total,
        [(n / total, f) for f, n in inclusive.most_common(top)] if total else [],
        [(n / total, f) for f, n in own.most_common(top)] if total else [],
    )


def profile_admission(args: argparse.Namespace) -> None:
    spy = py_spy()
    paths = sorted(common.FIXTURES.glob("*.admissionreview.json"))
    available = common.cpus()
    server_cpus = {available[0]} if len(available) >= 2 else None
    client_cpu = available[1] if len(available) >= 2 else None
    with tempfile.TemporaryDirectory(prefix="sparkgate-profile-") as tmp:
        kind = FloorServer if args.server == "floor" else LocalWebhook
        server = kind(common.EXAMPLE_POLICY, Path(tmp) / "server", workers=1, threads=4)
        with common.pinned(server_cpus):
            server.start()
        try:
            wrk(server, paths, keepalive=True, duration=1, connections=8, cpu=client_cpu)  # warm-up
            out = Path(tmp) / "profile.txt"
            assert server.pid is not None
            sampler = subprocess.Popen(
                [
                    spy,
                    "record",
                    "--pid",
                    str(server.pid),
                    "--subprocesses",
                    "--gil",
                    "--nonblocking",
                    "--format",
                    "raw",
                    "--rate",
                    "250",
                    "--duration",
                    str(args.seconds + 1),
                    "-o",
                    str(out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)  # py-spy attaches to the processes
            load = wrk(server, paths, keepalive=True, duration=args.seconds, connections=8, cpu=client_cpu)
            sampler.wait(timeout=args.seconds + 60)
        finally:
            server.stop()
        total, inclusive, own = collapsed_shares(out, args.top)
    print(
        f"# {args.server}: {load['rps']:,.0f} req/s under wrk; {total} samples of the worker holding the GIL"
    )
    print("# inclusive")
    for share, frame in inclusive:
        print(f"{share:6.1%}  {frame}")
    print("# self")
    for share, frame in own:
        print(f"{share:6.1%}  {frame}")


def profile_scale(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="sparkgate-profile-") as tmp:
        path = Path(tmp) / "loop.pstats"
        options = common.parser_for(scale, None).parse_args(
            ["--sizes", str(args.pods), "--trace-up-to", "0", "--profile", str(path)]
        )
        size = scale.run(options)["sizes"][0]
        stats = pstats.Stats(str(path))
    print(
        f"# scale, {args.pods:,} pods: the loop thread under cProfile, {size['events_per_second']:,.0f} "
        f"events/s, {size['steps']:,} steps, loop CPU {size['loop_cpu_s']:.1f} s"
    )
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    a = sub.add_parser("admission")
    a.add_argument("--server", choices=("webhook", "floor"), default="webhook")
    a.add_argument("--seconds", type=int, default=10)
    a.add_argument("--top", type=int, default=25)
    s = sub.add_parser("scale")
    s.add_argument("--pods", type=int, default=100_000)
    s.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    (profile_admission if args.what == "admission" else profile_scale)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
