"""The manifests rendered once per session by tests/manifests/kustomize.py (no kubectl here)."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sparkgate.contract import ANNOTATION_PROFILE, GATE

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"


def _load_kustomize() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "sparkgate_test_kustomize", Path(__file__).with_name("kustomize.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def kustomize() -> ModuleType:
    return _load_kustomize()


@pytest.fixture(scope="session")
def rendered(kustomize: ModuleType) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) → object, for the base install."""
    objects: dict[tuple[str, str], dict[str, Any]] = kustomize.by_kind(kustomize.build(MANIFESTS))
    return objects


class ExecutorPods:
    """Executor pods as a Spark 4.3 driver sends them (a captured fixture) for the install tests, and whether
    the installed sparkgate shaped one (gate and profile annotation)."""

    def __init__(self, reviews: dict[str, dict[str, Any]]) -> None:
        self.template = reviews["adhoc-query-exec-1"]["request"]["object"]

    def pod(self, name: str, namespace: str = "spark-jobs") -> dict[str, Any]:
        pod: dict[str, Any] = copy.deepcopy(self.template)
        pod["metadata"] = {**pod["metadata"], "name": name, "namespace": namespace}
        pod["metadata"].pop("managedFields", None)
        return pod

    @staticmethod
    def admitted(pod: dict[str, Any]) -> bool:
        gates = [g["name"] for g in pod["spec"].get("schedulingGates", [])]
        return GATE in gates and ANNOTATION_PROFILE in pod["metadata"].get("annotations", {})


@pytest.fixture(scope="session")
def executors(reviews: dict[str, dict[str, Any]]) -> ExecutorPods:
    return ExecutorPods(reviews)
