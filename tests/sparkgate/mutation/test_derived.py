"""What the API server's plugins derived from a field a template changes is dropped from the patched pod.

The captured pods (tests/data/spark-4.3) arrive after the built-in mutating plugins' first pass: they carry
`spec.priority: 0`, `spec.preemptionPolicy: PreemptLowerPriority`, the `kube-api-access-*` token volume and
the two default tolerations. kube-apiserver runs the plugins again after a webhook changed the pod
(docs/real-cluster-facts.md, "The admission chain"); the Priority plugin
(plugin/pkg/admission/priority/admission.go) refuses a pod whose `spec.priority` differs from what it
computes from the class, the RuntimeClass plugin (plugin/pkg/admission/runtimeclass/admission.go) one
whose `spec.overhead` differs from the class's.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgate.mutation import mutate
from sparkgate.mutation.derived import (
    NOT_READY,
    RULES,
    UNREACHABLE,
    covers,
    default_toleration,
    drop_stale,
    strip_derived,
)
from sparkgate.policy import Policy, load_policy

from .test_mutation import executor, request_for

Obj = dict[str, Any]
# A template's toleration of not-ready nodes for 900 s, in place of the default one's 300.
TOLERATED_900 = {"key": NOT_READY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 900}


def policy_with(template_spec: str, overrides: str = "") -> Policy:
    return load_policy(
        f"""
apiVersion: sparkgate.io/v1alpha1
kind: Policy
profiles:
  - name: p
    template:
      spec:
{template_spec}
{overrides}
"""
    )


def patched(request: Obj, pol: Policy) -> Obj:
    result = mutate(request, pol)
    out: Obj = jsonpatch.apply_patch(request["object"], result.ops)
    assert mutate({**request, "object": out}, pol).ops == [], "re-mutating the patched pod is a no-op"
    return out


CLASS = "        priorityClassName: spark-batch"
OVERRIDE = "    overrides: [spec.priorityClassName]"


@pytest.mark.parametrize("overrides", ["", OVERRIDE], ids=["fills", "overrides"])
def test_a_template_class_drops_priority_and_preemption_policy_from_every_captured_pod(
    reviews: dict[str, Obj], overrides: str
) -> None:
    pol = policy_with(CLASS, overrides)
    for name, review in reviews.items():
        pod = review["request"]["object"]
        assert pod["spec"]["priority"] == 0 and pod["spec"]["preemptionPolicy"] == "PreemptLowerPriority"
        out = patched(review["request"], pol)
        assert out["spec"]["priorityClassName"] == "spark-batch", name
        assert "priority" not in out["spec"] and "preemptionPolicy" not in out["spec"], name
        assert out["spec"]["volumes"] == pod["spec"]["volumes"], "nothing else derived is touched"
        assert out["spec"]["tolerations"] == pod["spec"]["tolerations"]


def test_an_overridden_class_is_changed_and_its_priority_dropped(reviews: dict[str, Obj]) -> None:
    request = copy.deepcopy(reviews["adhoc-query-exec-1"]["request"])
    request["object"]["spec"].update(priorityClassName="spark-low", priority=10)
    kept = patched(request, policy_with(CLASS))
    assert kept["spec"]["priorityClassName"] == "spark-low" and kept["spec"]["priority"] == 10
    changed = patched(request, policy_with(CLASS, OVERRIDE))
    assert changed["spec"]["priorityClassName"] == "spark-batch" and "priority" not in changed["spec"]


def test_a_new_runtime_class_drops_the_old_overhead_and_the_same_one_keeps_it(
    reviews: dict[str, Obj],
) -> None:
    request = copy.deepcopy(reviews["adhoc-query-exec-1"]["request"])
    request["object"]["spec"].update(runtimeClassName="runc-fat", overhead={"cpu": "250m"})
    override = "    overrides: [spec.runtimeClassName]"
    changed = patched(request, policy_with("        runtimeClassName: gvisor", override))
    assert changed["spec"]["runtimeClassName"] == "gvisor" and "overhead" not in changed["spec"]
    same = patched(request, policy_with("        runtimeClassName: runc-fat", override))
    assert same["spec"]["overhead"] == {"cpu": "250m"}


def test_a_new_service_account_drops_the_token_volume_so_the_plugin_mounts_its_own(
    reviews: dict[str, Obj],
) -> None:
    for name in ("adhoc-query-exec-1", "etl-nightly-exec-1"):
        pod = reviews[name]["request"]["object"]
        token = next(v["name"] for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access-"))
        out = patched(
            reviews[name]["request"],
            policy_with("        serviceAccountName: spark-exec", "    overrides: [spec.serviceAccountName]"),
        )
        spec = out["spec"]
        assert spec["serviceAccountName"] == "spark-exec" and "serviceAccount" not in spec
        assert token not in {v["name"] for v in spec["volumes"]}
        for container in spec["containers"]:
            assert all(m["name"] != token for m in container.get("volumeMounts", [])), name
        assert {v["name"] for v in spec["volumes"]} == {v["name"] for v in pod["spec"]["volumes"]} - {token}


def test_a_template_toleration_for_not_ready_replaces_the_default_one(reviews: dict[str, Obj]) -> None:
    template = """        tolerations:
          - key: node.kubernetes.io/not-ready
            operator: Exists
            effect: NoExecute
            tolerationSeconds: 900"""
    out = patched(reviews["adhoc-query-exec-1"]["request"], policy_with(template))
    tolerations = out["spec"]["tolerations"]
    assert [t["key"] for t in tolerations].count(NOT_READY) == 1
    assert TOLERATED_900 in tolerations
    assert any(t["key"] == UNREACHABLE and t["tolerationSeconds"] == 300 for t in tolerations)


def test_nothing_derived_is_dropped_when_the_template_changes_no_source(reviews: dict[str, Obj]) -> None:
    pod = reviews["etl-nightly-exec-1"]["request"]["object"]
    out = patched(
        reviews["etl-nightly-exec-1"]["request"], policy_with("        nodeSelector: {pool: spark}")
    )
    for field in ("priority", "preemptionPolicy", "serviceAccount", "volumes", "tolerations"):
        assert out["spec"][field] == pod["spec"][field], field


def test_strip_derived_gives_back_the_pod_spark_sent(reviews: dict[str, Obj]) -> None:
    for name, review in reviews.items():
        spec = review["request"]["object"]["spec"]
        before = copy.deepcopy(spec)
        stripped = strip_derived(spec)
        assert spec == before, "never mutates its input"
        for field in ("priority", "preemptionPolicy", "serviceAccount"):
            assert field not in stripped, (name, field)
        assert not any(v["name"].startswith("kube-api-access-") for v in stripped["volumes"]), name
        assert stripped.get("tolerations", []) == [
            t for t in spec["tolerations"] if t.get("tolerationSeconds") != 300
        ], name
        assert drop_stale(stripped, stripped) == stripped


def test_every_rule_names_its_plugin_and_sources() -> None:
    assert {r.plugin for r in RULES} == {
        "Priority",
        "RuntimeClass",
        "ServiceAccount",
        "DefaultTolerationSeconds",
    }
    for rule in RULES:
        assert rule.sources and rule.derived


NOT_READY_900 = """        tolerations:
          - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 900}"""


class Counted(dict[str, Any]):
    """A toleration that counts the comparisons made with it, and fails the run past a budget."""

    made = 0
    budget = math.inf

    def __eq__(self, other: object) -> bool:
        Counted.made += 1
        assert Counted.made <= Counted.budget, f"more than {Counted.budget} comparisons of tolerations"
        return super().__eq__(other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]


@pytest.mark.parametrize("overrides", ["", "    overrides: [spec.tolerations]"], ids=["fills", "overrides"])
def test_the_default_toleration_rules_compare_each_toleration_a_bounded_number_of_times(
    overrides: str,
) -> None:
    """A pod of 20,000 tolerations (2 MiB): the work is counted in comparisons, not timed, and is linear
    (the rules compared every toleration with the whole list: 2 * 10^8 comparisons, minutes of a worker)."""
    n = 20_000
    own = [Counted({"key": f"k{i}", "operator": "Exists", "effect": "NoSchedule"}) for i in range(n)]
    pod = executor(
        tolerations=[*own, Counted(default_toleration(NOT_READY)), Counted(default_toleration(UNREACHABLE))]
    )
    pol = policy_with(NOT_READY_900, overrides)
    Counted.made, Counted.budget = 0, 10 * n
    try:
        result = mutate(request_for(pod), pol)
    finally:
        Counted.budget = math.inf
    tolerations = jsonpatch.apply_patch(pod, result.ops)["spec"]["tolerations"]
    assert default_toleration(NOT_READY) not in tolerations
    assert TOLERATED_900 in tolerations
    assert (default_toleration(UNREACHABLE) in tolerations) == (overrides == "")


toleration = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["", NOT_READY, UNREACHABLE, "other"]),
        "operator": st.just("Exists"),
        "effect": st.sampled_from(["", "NoExecute", "NoSchedule"]),
    },
    optional={"tolerationSeconds": st.sampled_from([300, 900])},
)


@given(
    st.lists(toleration, max_size=5),
    st.lists(toleration, max_size=3),
    st.booleans(),
    st.sampled_from([NOT_READY, UNREACHABLE]),
)
def test_a_default_toleration_is_stale_exactly_when_an_added_toleration_covers_its_key(
    pod: list[Obj], template: list[Obj], override: bool, key: str
) -> None:
    """The rule's meaning, stated by value: the default is in the pod, and the spec as sparkgate wants it has
    a toleration covering the key that the pod did not have (whether it shares the pod's elements or not)."""
    pod = [*pod, default_toleration(key)]
    after = copy.deepcopy(template) if override else [*pod, *copy.deepcopy(template)]
    rule = next(r for r in RULES if r.plugin == "DefaultTolerationSeconds" and key in r.derived)
    expected = any(covers(t, key) for t in after if t not in pod)
    assert rule.stale({"tolerations": pod}, {"tolerations": after}) == expected
