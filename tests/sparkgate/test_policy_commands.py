"""`sparkgate policy check`: exit status and the exact place of every error."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkgate.cli import main

EXAMPLE = Path(__file__).parents[2] / "manifests" / "components" / "example-policy" / "policy.yaml"


def test_valid_policy_is_summarised(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "valid" in out
    assert "profile 1 'analytics': spark-* with labels team=analytics" in out
    assert "spark-log4j -> /opt/spark/conf-extra" in out


def test_errors_are_printed_with_their_location(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text(
        "apiVersion: sparkgate.io/v1alpha1\nkind: Policy\n"
        "profiles:\n  - name: a\n  - name: b\n  - name: c\n    configMaps:\n      - source: log4j\n"
    )
    assert main(["policy", "check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "1 error(s)" in err
    assert "profiles[2].configMaps[0].mountPath: required" in err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", str(tmp_path / "nope.yaml")]) == 1
    assert "No such file" in capsys.readouterr().err
