"""Fixtures shared by every test package: the captured Spark 4.3 AdmissionReviews and the example policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sparkgate.policy import Policy, load_policy

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "data" / "spark-4.3"
EXAMPLE_POLICY = REPO / "manifests" / "components" / "example-policy" / "policy.yaml"


def load_reviews() -> dict[str, dict[str, Any]]:
    return {
        p.name.removesuffix(".admissionreview.json"): json.loads(p.read_text())
        for p in sorted(FIXTURES.glob("*.admissionreview.json"))
    }


@pytest.fixture(scope="session")
def reviews() -> dict[str, dict[str, Any]]:
    """Every captured AdmissionReview, by name (etl-nightly-exec-1, adhoc-query-exec-2, ...)."""
    found = load_reviews()
    assert len(found) == 9, f"expected the 9 Spark 4.3 fixtures in {FIXTURES}"
    return found


@pytest.fixture(scope="session")
def example_policy() -> Policy:
    return load_policy(EXAMPLE_POLICY.read_text())
