"""The `sparkgate` command line.

Each part of sparkgate registers its own subcommands (a `commands` module with `register(subparsers)`),
so this module only assembles them and runs the chosen one.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMAND_MODULES = (
    "sparkgate.policy_commands",
    "webhook.commands",
    "certs.commands",
    "allocator.commands",
    "sparkgate.demo.commands",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkgate", description="Shape and pace Apache Spark executor pods on Kubernetes."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
