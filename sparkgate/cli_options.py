"""How a `sparkgate` command's option declares its default, and how `--help` shows it.

Each default is written once: in the option's declaration, or in the dataclass the option feeds, which the
declaration names (`default=Options.tick`). `--help` prints it from there, so the two cannot differ.

- `FromEnv` (`action=FromEnv, env="NAME"`): a variable of the environment, when set and not empty,
  replaces the declared default (the manifests give the pod its settings that way). The variable's text is
  the default as typed: argparse converts a string default with the option's `type` when the command runs,
  so a bad value is refused with the option's name, and only by a command that has the option.
  `FromEnvSwitch` is the same for an on/off option (`--certs`/`--no-certs`: `false`, `0` or `no` is off),
  `FromEnvRepeated` for a repeatable option (the variable holds one value; given on the command line, the
  option replaces the default instead of adding to it).
- `HelpFormatter` ends the help of every option with its default and where it comes from, e.g. `(default:
  300, or $SPARKGATE_CLIENT_APP_GRACE)`, or `(default: 60 from $SPARKGATE_CLIENT_APP_GRACE, else 300)` in a
  shell where the variable is set. The unit is the option's metavar (`--client-app-grace SECONDS`). An
  option whose default is worked out when the command runs says so in its own help, `(default: ...)`, which
  is left as written.
- `Parser` is the ArgumentParser of every `sparkgate` command and subcommand (sparkgate/cli.py): it has
  that formatter.
- The options several commands share are declared here once: `install_namespace`, `client_options` (the
  kubeconfig and the identity in a Lease), `server_options` (the policy file and the log level).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import socket
from collections.abc import Sequence
from typing import Any

from sparkgate import contract

# The units of a duration as typed (`90d`, `12h`, `10m`, `30s`: certs/commands.py) and as shown.
DURATION_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
OFF = ("false", "0", "no")  # what turns a FromEnvSwitch's variable off, in any case


def switch(text: str) -> bool:
    return text.lower() not in OFF


def _variable(name: str) -> str | None:
    return os.environ.get(name) or None  # an empty variable is as good as unset


class FromEnv(argparse.Action):
    """An option that takes one value, whose declared default the variable `env` replaces when set."""

    def __init__(
        self, option_strings: Sequence[str], dest: str, *, env: str, default: Any = None, **kwargs: Any
    ) -> None:
        self.env = env
        self.declared = default
        self.variable = _variable(env)
        super().__init__(
            option_strings, dest, default=default if self.variable is None else self.variable, **kwargs
        )

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: Any = None) -> None:
        setattr(namespace, self.dest, self.given(getattr(namespace, self.dest), values))

    def given(self, before: Any, value: Any) -> Any:
        """What the option holds once `value` is given on the command line after `before`."""
        return value


class FromEnvRepeated(FromEnv):
    """A repeatable FromEnv: the default is a list of one value (no `type`: the text as it is)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.default = [self.default]

    def given(self, before: Any, value: Any) -> Any:
        return [*([] if before is self.default else before), value]


class FromEnvSwitch(argparse.BooleanOptionalAction):
    """`--NAME`/`--no-NAME`, whose declared default the variable `env` replaces when set."""

    def __init__(
        self, option_strings: Sequence[str], dest: str, *, env: str, default: bool, help: str | None = None
    ) -> None:
        self.env = env
        self.declared = default
        self.variable = _variable(env)
        super().__init__(
            option_strings, dest, default=default if self.variable is None else switch(self.variable)
        )
        # Set after: Python 3.11's BooleanOptionalAction writes a default of its own into the help.
        self.help = help


def shown(value: Any) -> str:
    """A default as --help and docs/operations.md write it: `300`, `0.005`, `90d`, `10m`, `on`, `none`."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
        unit = next(u for u, size in DURATION_UNITS.items() if seconds % size == 0 or u == "s")
        return f"{seconds / DURATION_UNITS[unit]:g}{unit}"
    if isinstance(value, list | tuple):
        return ", ".join(shown(v) for v in value) or "none"
    return str(value)


def described(action: argparse.Action) -> str:
    """`default: 300, or $VAR`; `default: 60 from $VAR, else 300` when the variable is set."""
    env: str | None = getattr(action, "env", None)
    if env is None:
        return f"default: {shown(action.default)}"
    if getattr(action, "variable", None) is None:
        return f"default: {shown(action.default)}, or ${env}"
    return f"default: {shown(action.default)} from ${env}, else {shown(getattr(action, 'declared', None))}"


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, each option's help ended by `described` (the help is a %-format: escaped)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if not action.option_strings or action.required or action.default is argparse.SUPPRESS:
            return text
        if "(default" in text:  # a default worked out when the command runs, described by its help
            return text
        return text + f" ({described(action)})".replace("%", "%%")


def install_namespace(
    parser: argparse.ArgumentParser, flag: str = "--namespace", *, in_pod: bool = True
) -> None:
    """The install namespace option: in the pod's commands (`in_pod`) the manifests set $SPARKGATE_NAMESPACE."""
    taken: dict[str, Any] = {"action": FromEnv, "env": "SPARKGATE_NAMESPACE"} if in_pod else {}
    parser.add_argument(
        flag,
        default=contract.INSTALL_NAMESPACE,
        metavar="NAME",
        help="the install namespace, whose pods sparkgate never shapes",
        **taken,
    )


def client_options(parser: argparse.ArgumentParser, lease: str) -> None:
    """The options of a pod's process that talks to the API server under a Lease (`lease`: which)."""
    parser.add_argument(
        "--kubeconfig",
        action=FromEnv,
        env="KUBECONFIG",
        metavar="FILE",
        help="kubeconfig file; none: the in-cluster service account",
    )
    parser.add_argument(
        "--identity",
        action=FromEnv,
        env="POD_NAME",
        default=socket.gethostname(),
        metavar="NAME",
        help=f"this replica's name in {lease}",
    )


def server_options(parser: argparse.ArgumentParser) -> None:
    """The options of the pod's two servers (allocator, webhook): the policy they read and their log level."""
    parser.add_argument(
        "--policy",
        action=FromEnv,
        env="SPARKGATE_POLICY",
        default=contract.POLICY_FILE,
        metavar="FILE",
        help="the policy file (the ConfigMap's volume), read again when it changes",
    )
    parser.add_argument(
        "--log-level",
        action=FromEnv,
        env="SPARKGATE_LOG_LEVEL",
        default="info",
        metavar="LEVEL",
        help="debug, info, warning or error",
    )


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
