"""The policy rendered as a MutatingAdmissionPolicy (sparkgate/render.py): its shape, what it refuses to
render, and the API server's limits it is held to. The parity with the webhook is test_render_parity.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sparkgate import cel
from sparkgate.cli import main
from sparkgate.mutation.derived import RULES
from sparkgate.policy import Policy, load_policy
from sparkgate.render import DERIVED_RULES_RENDERED, POLICY_NAME, RenderError, render

HEAD = "apiVersion: sparkgate.io/v1alpha1\nkind: Policy\n"


def test_the_example_policy_renders_one_policy_and_its_binding(example_policy: Policy) -> None:
    policy, binding = render(example_policy).objects
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert (policy["kind"], binding["kind"]) == ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")
    assert policy["metadata"]["name"] == binding["spec"]["policyName"] == POLICY_NAME
    spec = policy["spec"]
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert spec["matchConstraints"]["objectSelector"] == {"matchLabels": {"spark-role": "executor"}}
    assert spec["failurePolicy"] == "Ignore"  # never deny an executor pod (docs/architecture.md)
    assert spec["reinvocationPolicy"] == "IfNeeded"
    assert [m["patchType"] for m in spec["mutations"]] == ["JSONPatch"]  # never ApplyConfiguration
    assert "Object." not in spec["mutations"][0]["jsonPatch"]["expression"]  # no typed values
    assert policy["metadata"]["annotations"]["sparkgate.io/policy-digest"] == example_policy.digest


def test_every_derived_rule_has_a_rendering() -> None:
    """One table of derived fields (sparkgate/mutation/derived.py): a rule added there must be rendered."""
    assert {r.plugin for r in RULES} == set(DERIVED_RULES_RENDERED)


@pytest.mark.parametrize(
    "override", ["spec.containers", "spec.containers[spark-kubernetes-executor]"], ids=["list", "spark"]
)
def test_an_override_that_replaces_sparks_container_is_refused_with_the_reason(override: str) -> None:
    policy = load_policy(
        HEAD + "profiles:\n  - name: p\n    template:\n      spec:\n        containers:\n"
        "          - name: spark-kubernetes-executor\n            image: x\n"
        f"    overrides: ['{override}']\n"
    )
    with pytest.raises(RenderError) as e:
        render(policy)
    assert e.value.errors == [
        f"profiles[0] (p): overrides: {override} replaces Spark's own container; the admission-policy mode "
        "does not render it (name the fields to override instead)"
    ]


def big_template_policy(tolerations: int) -> Policy:
    items = "".join(
        f"          - {{key: k{i}, operator: Exists, effect: NoSchedule}}\n" for i in range(tolerations)
    )
    return load_policy(
        HEAD + f"profiles:\n  - name: p\n    template:\n      spec:\n        tolerations:\n{items}"
    )


def test_a_rendering_above_the_per_expression_cost_limit_is_refused() -> None:
    """Each template toleration is looked for in the pod's list (up to cel.BOUNDS["tolerations"]): enough
    of them exceed PerCallLimit, and the API server would fail the evaluation (failurePolicy Ignore: the
    pod would be admitted unshaped and ungated)."""
    small = render(big_template_policy(10))
    assert small.costs["mutations[0]"] < cel.PER_CALL_LIMIT
    with pytest.raises(RenderError) as e:
        render(big_template_policy(3000))
    (line,) = e.value.errors
    assert line.startswith("mutations[0]: a CEL cost of up to ")
    assert (
        "above the API server's per-expression limit of 1,000,000 (PerCallLimit, apis/cel/config.go)" in line
    )


def test_render_prints_both_objects_as_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(HEAD + "profiles:\n  - name: p\n    labels: {tier: batch}\n")
    assert main(["policy", "render", "--admission", "policy", str(path)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"]
    assert docs == render(load_policy(path.read_text())).objects


def test_check_in_policy_mode_refuses_what_cannot_be_rendered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "policy.yaml"
    tolerations = [{"key": f"k{i}", "operator": "Exists", "effect": "NoSchedule"} for i in range(3000)]
    profile = {"name": "p", "template": {"spec": {"tolerations": tolerations}}}
    path.write_text(yaml.safe_dump({**yaml.safe_load(HEAD), "profiles": [profile]}))
    assert main(["policy", "check", str(path)]) == 0  # the webhook has no such limit
    assert main(["policy", "check", "--admission", "policy", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: cannot be applied as a MutatingAdmissionPolicy:" in err
    assert "PerCallLimit" in err


def test_check_in_policy_mode_reports_size_and_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(HEAD + "profiles:\n  - name: p\n    labels: {tier: batch}\n")
    assert main(["policy", "check", "--admission", "policy", str(path)]) == 0
    rendered = render(load_policy(path.read_text()))
    assert (
        f"  as a MutatingAdmissionPolicy: {rendered.size:,} bytes; CEL cost up to {rendered.total_cost:,} per "
        "executor pod (limit 10,000,000)"
    ) in capsys.readouterr().out
