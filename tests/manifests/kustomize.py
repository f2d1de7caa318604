"""The manifests rendered by the real kustomize (`kubectl kustomize`, kubectl is on every machine of the
project's kind; `make tools` checks), so the tests see what `kubectl apply -k` applies: a Python stand-in
once hid that kustomize writes `namespace:` into ValidatingAdmissionPolicies.

`build(directory)` renders one kustomization; `install(components)` renders the base with optional parts
from manifests/components/ the way docs/install.md tells an admin to combine them: a kustomization of their
own that lists the base under `resources` and the components, in the documented order, under `components`.
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
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


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        raise KustomizeError("kubectl is not installed (`make tools`)")
    return found


def build(directory: Path) -> list[Obj]:
    """The objects `kubectl kustomize directory` renders, in its order."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
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
