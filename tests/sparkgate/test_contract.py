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


def test_a_plain_app_id_is_kept_whole_in_the_copy_name_so_cel_can_compute_it() -> None:
    """Spark's own ids (`spark-` + 32 hex digits) are DNS labels: the copy is `sg-<app id>-<digest of the
    source>`, which a MutatingAdmissionPolicy writes by concatenation (sparkgate/render.py)."""
    app_id = "spark-d26cd641513a48f2bd6c307f1a3bcf30"
    name = contract.app_configmap_name(app_id, "spark-log4j")
    assert name == f"sg-{app_id}-{contract.source_digest('spark-log4j')}"
    assert DNS_LABEL.match(name) and len(name) <= 63
    longest = "a" * contract.PLAIN_APP_ID_MAX
    assert len(contract.app_configmap_name(longest, "x")) == 63
    assert contract.app_configmap_name(longest + "a", "x").startswith("sg-" + "a" * 28 + "-x-")
    assert contract.app_configmap_name(app_id, "a") != contract.app_configmap_name(app_id, "b")
