"""The manifests rendered once per session by tests/manifests/kustomize.py (no kubectl here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

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
