"""`sparkgate policy check` refuses template fields that the API server's admission chain refuses or that
would take executor pods out of sparkgate's hands, naming the key and why (docs/policy.md, "Admission
plugins"). A refused policy keeps the last good one in force (tests/sparkgate/test_policy_file.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkgate.policy import REFUSED_LABELS, REFUSED_TEMPLATE_FIELDS, PolicyError, load_policy

HEAD = "apiVersion: sparkgate.io/v1alpha1\nkind: Policy\nprofiles:\n  - name: p\n"


def errors_of(profile: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        load_policy(HEAD + profile)
    return info.value.errors


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("nodeName", "node-1", "bypassing the scheduler and sparkgate's gate"),
        ("priority", "1000", "Priority admission plugin computes it"),
        ("preemptionPolicy", "Never", "takes it from the PriorityClass"),
        ("overhead", "{cpu: 100m}", "RuntimeClass admission plugin"),
        ("serviceAccount", "spark", "deprecated alias"),
        ("schedulingGates", "[{name: other.io/gate}]", "the only one on executor pods"),
        ("ephemeralContainers", "[{name: debug, image: busybox}]", "refuses ephemeral containers"),
        ("activeDeadlineSeconds", "600", "Terminating scope"),
    ],
)
def test_a_template_field_the_chain_refuses_is_named_with_its_reason(
    field: str, value: str, why: str
) -> None:
    errors = errors_of(f"    template:\n      spec:\n        {field}: {value}\n")
    assert len(errors) == 1 and errors[0].startswith(f"profiles[0].template.spec.{field}: a template may not")
    assert why in errors[0]


def test_every_refused_field_is_covered_above() -> None:
    assert {path[1] for path in REFUSED_TEMPLATE_FIELDS} == {
        "nodeName",
        "priority",
        "preemptionPolicy",
        "overhead",
        "serviceAccount",
        "schedulingGates",
        "ephemeralContainers",
        "activeDeadlineSeconds",
    }


@pytest.mark.parametrize("key", sorted(REFUSED_LABELS))
def test_topology_labels_are_refused_in_the_template_and_the_profile(key: str) -> None:
    errors = errors_of(
        f"    template:\n      metadata:\n        labels: {{{key}: a}}\n    labels: {{{key}: a}}\n"
    )
    assert errors == [
        f"profiles[0].template.metadata.labels.{key}: a template may not set this label: "
        "the PodTopologyLabels admission plugin copies the node's value onto the pod when it is bound",
        f"profiles[0].labels.{key}: a profile may not set this label: "
        "the PodTopologyLabels admission plugin copies the node's value onto the pod when it is bound",
    ]


def test_fields_the_plugins_derive_from_are_allowed() -> None:
    policy = load_policy(
        HEAD
        + """    template:
      spec:
        priorityClassName: spark-batch
        runtimeClassName: gvisor
        serviceAccountName: spark-exec
        automountServiceAccountToken: false
        tolerations: [{key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute}]
    overrides: [spec.priorityClassName, spec.serviceAccountName]
"""
    )
    assert policy.profiles[0].template["spec"]["priorityClassName"] == "spark-batch"


def test_docs_policy_lists_every_refused_field_and_every_derived_rule() -> None:
    from sparkgate.mutation.derived import RULES

    doc = (Path(__file__).parents[2] / "docs" / "policy.md").read_text()
    section = doc[doc.index("## Admission plugins") :]
    for path in REFUSED_TEMPLATE_FIELDS:
        assert f"| `{'.'.join(path)}` |" in section, path
    for key in REFUSED_LABELS:
        assert f"`{key}`" in section, key
    for rule in RULES:
        assert f"\n| {rule.plugin} |" in section, rule.plugin
        for source in rule.sources:
            assert f"`spec.{source}`" in section, source


def test_a_running_container_refuses_such_a_policy_and_keeps_the_last_good_one(tmp_path: Path) -> None:
    from sparkgate.policy_file import PolicySource

    path = tmp_path / "policy.yaml"
    path.write_text(HEAD + "    template: {spec: {priorityClassName: spark-batch}}\n")
    now = [0.0]
    source = PolicySource(str(path), "sparkgate-system", clock=lambda: now[0], check_interval=1)
    good = source.current()
    assert good is not None
    path.write_text(HEAD + "    template: {spec: {priorityClassName: spark-batch, priority: 1000}}\n")
    now[0] += 2
    assert source.current() is good
    assert source.last_error is not None
    assert source.last_error.startswith("profiles[0].template.spec.priority: a template may not set this")
