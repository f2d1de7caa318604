"""`--help` of every `sparkgate` command shows each option's default, its unit (the option's argument) and the
variable that replaces it, from the one definition (sparkgate/cli_options.py); docs/operations.md's table of
settings is those definitions, option by option, and its "Bounds" name the same defaults.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkgate.cli import build_parser
from sparkgate.cli_options import described, shown

REPO = Path(__file__).resolve().parents[2]
OPERATIONS = REPO / "docs" / "operations.md"
SANDBOX = ("demo",)  # the sandbox wing's command (not in the image): the README documents it
WIDE = "1000"  # COLUMNS: argparse wraps help at the terminal's width, and breaks words at hyphens


@pytest.fixture
def plain_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No variable that a default comes from, help on one line per option, and the host name as the
    settings table writes it (the one default that depends on the machine)."""
    for name in list(os.environ):
        if name.startswith("SPARKGATE_") or name in ("POD_NAME", "KUBECONFIG"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", WIDE)
    monkeypatch.setattr(socket, "gethostname", lambda: "the host name")
    return monkeypatch


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(`certs sync`, its parser) for every command that runs (the leaves of the subcommand tree)."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        yield " ".join(path), parser
    for action in subcommands:
        for name, sub in action.choices.items():
            yield from commands(sub, (*path, name))


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def flat(text: str) -> str:
    return " ".join(text.split())


def test_allocator_help_shows_the_client_app_grace_in_seconds() -> None:
    """The command as an admin runs it (a process of its own), in a shell without the variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKGATE_")}
    done = subprocess.run(
        [sys.executable, "-m", "sparkgate.cli", "allocator", "--help"],
        capture_output=True, text=True, timeout=120, check=True, env={**env, "COLUMNS": WIDE},
    )  # fmt: skip
    assert (
        "--client-app-grace SECONDS a client-mode app (no driver pod) with no sign of life this many seconds is "
        "over (default: 300, or $SPARKGATE_CLIENT_APP_GRACE)"
    ) in flat(done.stdout)


def test_every_option_of_every_command_shows_its_default(plain_environment: pytest.MonkeyPatch) -> None:
    checked = 0
    for name, parser in commands(build_parser()):
        text = flat(parser.format_help())
        for action in options(parser):
            where = f"sparkgate {name} {action.option_strings[-1]}"
            assert action.help, f"{where}: no help, so --help would show no default"
            if action.required:
                continue  # nothing to default to
            if "(default" in action.help:  # worked out when the command runs: the help says how
                assert action.default is None, where
                continue
            assert f"{flat(action.help)} ({described(action)})" in text, where
            checked += 1
            default = action.default
            if isinstance(default, int | float | dt.timedelta) and not isinstance(default, bool):
                assert action.metavar and action.metavar.isupper(), f"{where}: a number names its unit"
    assert checked >= 60


def test_a_variable_replaces_the_default_and_help_says_so(plain_environment: pytest.MonkeyPatch) -> None:
    plain_environment.setenv("SPARKGATE_CLIENT_APP_GRACE", "60")
    plain_environment.setenv("SPARKGATE_CA_OVERLAP", "5m")
    plain_environment.setenv("SPARKGATE_CERTS_SYNC", "No")
    plain_environment.setenv("SPARKGATE_ALLOCATOR_USER", "system:serviceaccount:ops:allocator")
    plain_environment.setenv("SPARKGATE_STALL_AFTER", "")  # empty: as good as unset
    parser = build_parser()
    args = parser.parse_args(["allocator"])
    assert args.client_app_grace == 60.0 and args.ca_overlap == dt.timedelta(minutes=5)
    assert args.certs is False and args.stall_after == 300.0
    assert parser.parse_args(["allocator", "--client-app-grace", "30", "--certs"]).client_app_grace == 30.0
    assert parser.parse_args(["allocator", "--certs"]).certs is True
    assert parser.parse_args(["webhook"]).allocator_user == ["system:serviceaccount:ops:allocator"]
    given = parser.parse_args(["webhook", "--allocator-user", "a", "--allocator-user", "b"]).allocator_user
    assert given == ["a", "b"]  # the option replaces the variable's user, it does not add to it

    allocator = next(p for name, p in commands(parser) if name == "allocator")
    text = flat(allocator.format_help())
    assert "(default: 60 from $SPARKGATE_CLIENT_APP_GRACE, else 300)" in text
    assert "(default: 5m from $SPARKGATE_CA_OVERLAP, else 10m)" in text
    assert "(default: off from $SPARKGATE_CERTS_SYNC, else on)" in text
    assert "(default: 300, or $SPARKGATE_STALL_AFTER)" in text


def test_a_bad_variable_is_refused_by_the_command_that_reads_it(
    plain_environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused when the command runs, naming the option; the commands without the option still run."""
    plain_environment.setenv("SPARKGATE_CLIENT_APP_GRACE", "soon")
    plain_environment.setenv("SPARKGATE_CA_LIFETIME", "forever")
    parser = build_parser()
    assert parser.parse_args(["status"]).url == "http://127.0.0.1:8080"
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["allocator"])
    assert exit_.value.code == 2
    assert "argument --client-app-grace: invalid float value: 'soon'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["certs", "generate", "--out", "x"])
    assert "argument --ca-lifetime: 'forever' is not a duration" in capsys.readouterr().err


def settings_table() -> dict[tuple[str, str], tuple[str, str, str]]:
    """docs/operations.md "Settings": (option, command) → (option with its argument, variable, default)."""
    text = OPERATIONS.read_text()
    section = text[text.index("\n## Settings\n") :].split("\n## ")[1]
    rows: dict[tuple[str, str], tuple[str, str, str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not line.startswith("| `-") or len(cells) != 5:
            continue
        signature, names, variable, default, _ = cells
        for command in re.findall(r"`([a-z ]+)`", names):
            key = (signature.strip("`").split()[0], command)
            assert key not in rows, f"{key} twice in the table"
            rows[key] = (signature.strip("`"), variable.strip("`"), default.strip("`"))
    return rows


def signature(action: argparse.Action) -> str:
    """The long option and its argument as --help writes them: `--tick SECONDS`, `--admission {webhook,policy}`."""
    flag = next(o for o in action.option_strings if o.startswith("--"))
    if action.nargs == 0:
        return flag
    metavar = action.metavar or (
        "{" + ",".join(action.choices) + "}" if action.choices else action.dest.upper()
    )
    return f"{flag} {metavar}"


def settings(parser: argparse.ArgumentParser) -> dict[tuple[str, str], tuple[str, str, str]]:
    """What the table must hold: every option of the image's commands that has a default (not required,
    not off, not empty) or a variable."""
    found: dict[tuple[str, str], tuple[str, str, str]] = {}
    for name, command in commands(parser):
        if name.split()[0] in SANDBOX:
            continue
        for action in options(command):
            env = getattr(action, "env", None)
            empty = action.default is None or action.default is False or action.default == []
            if action.required or (empty and env is None):
                continue
            sig = signature(action)
            found[(sig.split()[0], name)] = (sig, env or "—", shown(action.default))
    return found


def test_the_settings_table_of_operations_md_is_the_options(plain_environment: pytest.MonkeyPatch) -> None:
    documented, defined = settings_table(), settings(build_parser())
    assert documented.keys() - defined.keys() == set(), "in docs/operations.md, no such option"
    assert defined.keys() - documented.keys() == set(), "missing from docs/operations.md's Settings"
    for key, (sig, variable, default) in defined.items():
        assert documented[key] == (sig, variable, default), key
    assert len(defined) >= 60


def test_the_bounds_name_the_options_defaults(plain_environment: pytest.MonkeyPatch) -> None:
    """docs/operations.md "Bounds": `--client-app-grace`, `$SPARKGATE_CLIENT_APP_GRACE` (300 s)."""
    allocator = next(p for name, p in commands(build_parser()) if name == "allocator")
    by_flag = {signature(a).split()[0]: a for a in options(allocator)}
    text = OPERATIONS.read_text()
    bounds = text[text.index("\n## Bounds\n") :].split("\n## ")[1]
    found = re.findall(r"`(--[a-z-]+)`, `\$([A-Z_]+)` \((\d+)", bounds)
    assert len(found) == 3
    for flag, variable, default in found:
        action = by_flag[flag]
        assert (getattr(action, "env", None), shown(action.default)) == (variable, default), flag
