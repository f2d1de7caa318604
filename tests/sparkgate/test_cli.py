"""The production commands never import the simulator or the demo (issue 13): the image carries neither."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
from sparkgate.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def imported_by(*argv: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120, check=True
    )
    modules: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return modules


@pytest.mark.parametrize(
    "argv",
    [
        ("allocator", "--help"),
        ("webhook", "--help"),
        ("certs", "sync", "--help"),
        ("policy", "check", "--help"),
        ("status", "--help"),
        ("release", "--help"),
    ],
)
def test_production_commands_import_no_simulator_or_demo(argv: tuple[str, ...]) -> None:
    modules = imported_by(*argv)
    assert "sparkgate.cli" in modules and any(
        m.startswith(argv[0]) or m.startswith("sparkgate") for m in modules
    )
    wing = [m for m in modules if m.split(".")[0] in ("kubesim", "sandbox")]
    assert wing == [], wing


def test_demo_is_registered_where_the_sandbox_is_installed() -> None:
    modules = imported_by("demo", "--help")
    assert "sandbox.demo.commands" in modules
