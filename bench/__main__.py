"""`python -m bench` (`make bench`): every benchmark in turn, each writing bench/results/<name>.json, then one
table. `--smoke` runs each at its tiny size; `--only NAME ...` runs some of them."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from . import admission, admission_policy, common, extender, gates, kubesim_policy, refill, scale, value
from .common import Benchmark, Row

BENCHMARKS: dict[str, Benchmark] = {
    "admission": admission,
    "scale": scale,
    "refill": refill,
    "value": value,
    "extender": extender,
    "kubesim_policy": kubesim_policy,
    "gates": gates,
    "admission_policy": admission_policy,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="each benchmark at its tiny size")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these")
    options = parser.parse_args(argv)
    sections: list[tuple[str, list[Row]]] = []
    failed = []
    for name, benchmark in BENCHMARKS.items():
        if options.only and name not in options.only:
            continue
        # Each benchmark with its own defaults, as `python -m bench.<name>` would run it.
        args = common.parser_for(benchmark, None).parse_args(["--smoke"] if options.smoke else [])
        print(f"# {name} ...", file=sys.stderr, flush=True)
        try:
            document: dict[str, Any] = common.execute(benchmark, args)
        except Exception as e:  # one broken benchmark must not hide the others' figures
            print(f"# {name} failed: {e!r}", file=sys.stderr)
            failed.append(name)
            sections.append((name, [Row("failed", repr(e)[:100])]))
            continue
        sections.append((name, benchmark.rows(document)))
    print(common.table(sections))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
