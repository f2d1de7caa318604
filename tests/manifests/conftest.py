"""The manifests rendered once per session by tests/manifests/kustomize.py (`kubectl kustomize`, with the
virtual environment's kubectl, which the run names after collection), and what the install tests need to
run them on kubesim: patient webhook configurations, Secret volumes written as the kubelet writes them,
executor pods as Spark sends them."""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sparkgate.contract import ANNOTATION_PROFILE, GATE

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
# What the install tests register instead of the rendered `timeoutSeconds` (3 s): the most kube-apiserver
# accepts (1-30 s, kubernetes pkg/apis/admissionregistration/validation/validation.go) and kubesim's cap.
# Under failurePolicy Ignore a webhook call slower than its timeout admits the pod silently without
# sparkgate, and a busy test machine can pause the test's processes for seconds: the tests would blame
# sparkgate for the machine. The shipped value is checked in test_manifests.py; a TLS or CA failure is
# still ignored at once, at the handshake, not after the timeout.
PATIENT_TIMEOUT_SECONDS = 30


def _load_kustomize() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "sparkgate_test_kustomize", Path(__file__).with_name("kustomize.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


KUSTOMIZE = _load_kustomize()


@pytest.fixture(scope="session")
def kustomize() -> ModuleType:
    return KUSTOMIZE


def pytest_report_collectionfinish() -> str:
    """Which kubectl renders the manifests (printed after collection, with -q too)."""
    try:
        kubectl, kustomize = KUSTOMIZE.versions()
    except KUSTOMIZE.KustomizeError as e:
        return f"manifests rendered by: no kubectl: {e}"
    return f"manifests rendered by: kubectl {kubectl} (kustomize {kustomize}) at {KUSTOMIZE.kubectl()}"


@pytest.fixture(scope="session")
def rendered(kustomize: ModuleType) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) → object, for the base install."""
    objects: dict[tuple[str, str], dict[str, Any]] = kustomize.by_kind(kustomize.build(MANIFESTS))
    return objects


def patient(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a rendered webhook configuration whose webhooks wait PATIENT_TIMEOUT_SECONDS."""
    copied: dict[str, Any] = copy.deepcopy(config)
    for webhook in copied["webhooks"]:
        webhook["timeoutSeconds"] = PATIENT_TIMEOUT_SECONDS
    return copied


@pytest.fixture(scope="session")
def patient_webhook() -> Callable[[dict[str, Any]], dict[str, Any]]:
    """`patient`, for the test modules (conftest is not importable under --import-mode=importlib)."""
    return patient


def project_secret_volume(directory: Path, items: dict[str, bytes]) -> None:
    """Write a Secret volume's items as the kubelet does (kubernetes pkg/volume/util/atomic_writer.go): only
    when they changed, into a new hidden directory onto which the `..data` symlink is renamed in one step,
    each item a symlink through `..data`. A reader never sees a new certificate beside an old key."""
    data = directory / "..data"
    if (
        data.is_dir()
        and sorted(os.listdir(data)) == sorted(items)
        and all((data / name).read_bytes() == content for name, content in items.items())
    ):
        return
    previous = os.readlink(data) if data.is_symlink() else None
    version = Path(tempfile.mkdtemp(prefix="..", dir=directory))
    for name, content in items.items():
        (version / name).write_bytes(content)
    _symlink(directory / "..data", version.name)
    for name in items:  # the first time only: later the rename of `..data` swaps them all at once
        if not (directory / name).is_symlink():
            _symlink(directory / name, f"..data/{name}")
    if previous is not None:
        shutil.rmtree(directory / previous, ignore_errors=True)


def _symlink(path: Path, target: str) -> None:
    """`path` -> `target`, replacing whatever `path` was in one rename."""
    staged = path.with_name(f"{path.name}_tmp")
    staged.unlink(missing_ok=True)
    staged.symlink_to(target)
    os.replace(staged, path)


@pytest.fixture(scope="session")
def secret_volume() -> Callable[[Path, dict[str, bytes]], None]:
    """`project_secret_volume`, for the test modules."""
    return project_secret_volume


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
