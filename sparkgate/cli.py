"""The `sparkgate` command line.

Each part of sparkgate registers its own subcommands (a `commands` module with `register(subparsers)`),
so this module only assembles them and runs the chosen one. The production commands never import the
simulator or the demo: `sparkgate demo` lives in the sandbox wing (sandbox/, not in the image) and is
registered only where that wing is installed and only when it is asked for (or for the command list).
Every parser is a `cli_options.Parser`, whose `--help` shows each option's default and where it comes from.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from sparkgate.cli_options import Parser

COMMAND_MODULES = (
    "sparkgate.policy_commands",
    "sparkgate.release",
    "webhook.commands",
    "certs.commands",
    "allocator.commands",
)
SANDBOX_COMMANDS = "sandbox.demo.commands"


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser for `argv`: every production command, and `demo` when the sandbox wing is installed and
    `argv` names no other command (so `sparkgate allocator` never imports the simulator)."""
    parser = Parser(prog="sparkgate", description="Shape and pace Apache Spark executor pods on Kubernetes.")
    # The commands' parsers, and theirs, are of the parser's class (argparse's `parser_class`): Parser.
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = list(COMMAND_MODULES)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in (None, "demo") and importlib.util.find_spec("sandbox") is not None:
        modules.append(SANDBOX_COMMANDS)
    for name in modules:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
