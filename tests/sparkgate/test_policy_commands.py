"""`sparkgate policy check`: exit status and the exact place of every error, and which kubeconfig
`--cluster` uses."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kubesim.cluster import Cluster
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


def test_a_malformed_template_is_an_error_with_its_place_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text(
        "apiVersion: sparkgate.io/v1alpha1\nkind: Policy\nprofiles:\n- name: a\n  template: {metadata: [1]}\n"
    )
    assert main(["policy", "check", str(bad)]) == 1
    assert "profiles[0].template.metadata: input should be a valid dictionary" in capsys.readouterr().err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", str(tmp_path / "nope.yaml")]) == 1
    assert "No such file" in capsys.readouterr().err


ONE_PROFILE = """
apiVersion: sparkgate.io/v1alpha1
kind: Policy
profiles:
  - name: standard
    match: {namespaces: [spark-a]}
"""


def test_cluster_check_from_a_workstation_uses_kube_config_in_home(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As kubectl and `sparkgate release`: --kubeconfig, else $KUBECONFIG, else ~/.kube/config."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(ONE_PROFILE)
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    with Cluster(nodes=1, namespaces=("spark-a",), workdir=tmp_path) as cluster:
        shutil.copy(cluster.kubeconfig(), home / ".kube" / "config")
        assert main(["policy", "check", str(policy), "--cluster"]) == 0
        captured = capsys.readouterr()
        assert f"dry runs on {cluster.url.rstrip('/')} (nothing is stored):" in captured.out
        assert "profile standard in namespace spark-a: admitted" in captured.out
        assert "cannot reach the cluster" not in captured.err

        # $KUBECONFIG comes before ~/.kube/config.
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
        assert main(["policy", "check", str(policy), "--cluster"]) == 1
        assert "cannot reach the cluster" in capsys.readouterr().err
