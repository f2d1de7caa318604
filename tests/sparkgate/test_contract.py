"""The pod contract shared by the webhook and the allocator."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from sparkgate import contract

FIXTURES = Path(__file__).parents[1] / "data" / "spark-4.3"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def fixture_pod(name: str) -> dict:
    review = json.loads((FIXTURES / f"{name}.admissionreview.json").read_text())
    return review["request"]["object"]


def test_spark_container_is_found_by_its_env_not_its_index() -> None:
    pod = fixture_pod("etl-nightly-exec-1")
    containers = pod["spec"]["containers"]
    assert containers[0]["name"] == "log-shipper"
    assert contract.spark_container_index(containers) == 1
    assert contract.spark_container_index(fixture_pod("adhoc-query-exec-1")["spec"]["containers"]) == 0


def test_spark_container_fallbacks() -> None:
    assert contract.spark_container_index([{"name": "a"}, {"name": "spark-kubernetes-executor"}]) == 1
    assert contract.spark_container_index([{"name": "a"}, {"name": "b"}]) == 0


def test_fixture_pods_are_executors() -> None:
    labels = fixture_pod("etl-nightly-exec-3")["metadata"]["labels"]
    assert contract.is_executor(labels)
    assert not contract.is_executor({**labels, contract.LABEL_ROLE: "driver"})
    assert not contract.is_executor({contract.LABEL_ROLE: "executor"})


@given(st.text(max_size=300), st.text(max_size=300))
def test_configmap_names_are_valid_for_any_input(app_id: str, source: str) -> None:
    name = contract.app_configmap_name(app_id, source)
    assert DNS_LABEL.match(name) and len(name) <= 63
    volume = contract.configmap_volume_name(source)
    assert DNS_LABEL.match(volume) and len(volume) <= 63


def test_configmap_names_do_not_collide_when_folded() -> None:
    assert contract.app_configmap_name("App_1", "conf") != contract.app_configmap_name("app-1", "conf")
    assert contract.app_configmap_name("a", "conf") == contract.app_configmap_name("a", "conf")
