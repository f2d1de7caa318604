"""Where an admission's work goes, in CPU instructions: bench/admission_cpu.py's stages under callgrind.

Thread CPU time moves with the machine's load (other processes' cache and frequency effects); the number of
instructions a stage executes does not, so on a shared machine this is the figure to compare code by. The
stages are bench/admission_cpu.py's (the production functions, on the captured reviews in turn), run in one
process under `valgrind --tool=callgrind`, which writes its counters at each `getppid` call: the process
calls it between stages, so each dump holds one stage's calls (and the loop's own cost, measured as a stage
that does nothing and subtracted). Hash randomization is fixed (PYTHONHASHSEED=0) so runs repeat.

    python -m bench.admission_instructions [--calls 45] [POLICY REVIEW...]    (needs valgrind)

Prints instructions per call by stage, in thousands, and one JSON document with `--json`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import common

_EMPTY = "(loop)"


def child(policy: str, reviews: list[str], calls: int) -> None:
    """Under callgrind: each stage warmed up, then `calls` calls of it between two dumps."""
    from .admission_cpu import stages

    bodies = [Path(p).read_bytes() for p in reviews]
    found = {_EMPTY: lambda i: None, **stages(policy, bodies)}
    for fn in found.values():
        for i in range(len(bodies)):
            fn(i)
    print(json.dumps(list(found)), flush=True)
    for fn in found.values():
        os.getppid()  # the dump before this stage
        for i in range(calls):
            fn(i)
    os.getppid()


def count(policy: str, reviews: list[str], calls: int) -> dict[str, float]:
    """Thousands of instructions per call, by stage (the empty loop's subtracted)."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="sparkgate-callgrind-") as tmp:
        done = subprocess.run(
            [
                "valgrind", "--tool=callgrind", "--dump-before=getppid",
                f"--callgrind-out-file={tmp}/out.%p", sys.executable, "-m", "bench.admission_instructions",
                "--child", "--calls", str(calls), policy, *reviews,
            ],
            capture_output=True, text=True, cwd=common.REPO, timeout=3600,
            env={**os.environ, "PYTHONHASHSEED": "0", "PROMETHEUS_MULTIPROC_DIR": tmp},
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"callgrind run failed: {done.stderr[-3000:]}")
        names: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
        dumps = sorted(Path(tmp).glob("out.*.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
        totals = [_total(p) for p in dumps]
    # dump 1 is everything before the first stage; dumps 2.. each hold one stage
    per_stage = totals[1 : 1 + len(names)]
    if len(per_stage) != len(names):
        raise RuntimeError(f"expected {len(names) + 1} dumps, found {len(totals)}")
    loop = per_stage[0] / calls
    return {
        name: round((total / calls - loop) / 1000, 1)
        for name, total in zip(names[1:], per_stage[1:], strict=True)
    }


def _total(dump: Path) -> int:
    match = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no totals in {dump}")
    return int(match.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=45, help="calls of each stage (the reviews in turn)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("policy", nargs="?", default=str(common.EXAMPLE_POLICY))
    parser.add_argument("reviews", nargs="*")
    args = parser.parse_args(argv)
    reviews = args.reviews or [str(p) for p in sorted(common.FIXTURES.glob("*.admissionreview.json"))]
    if args.child:
        child(args.policy, reviews, args.calls)
        return 0
    figures = count(args.policy, reviews, args.calls)
    figures["webhook_beyond_floor"] = round(figures["webhook_app"] - figures["floor_app"], 1)
    if args.json:
        print(json.dumps(figures))
    else:
        for name, value in figures.items():
            print(f"{name:28} {value:10,.1f} k")
    return 0


if __name__ == "__main__":
    sys.exit(main())
