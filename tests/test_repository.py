"""The repository stands alone: nothing in it reads files from beside it (issue 13: a clone with nothing
next to it must pass its tests; the captured Spark pods live in tests/data/)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"""\.\./shared|parents?\[\d\]\s*/\s*["']shared["']|\.parent\s*/\s*["']shared["']""")


def test_no_code_reads_outside_the_repository() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "*.py", "Makefile", ".ci/*", "*.toml", "*.cfg"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert len(tracked) > 50
    offenders = [
        f"{name}:{n}"
        for name in tracked
        if name != "tests/test_repository.py"
        for n, line in enumerate((REPO / name).read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert offenders == []


def test_captured_fixtures_are_in_the_repository() -> None:
    data = REPO / "tests" / "data" / "spark-4.3"
    assert (data / "README.md").is_file()
    assert len(list(data.glob("*.admissionreview.json"))) == 9
