"""The policy loader: strict, precise errors, and the allocation rules it answers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sparkgate import contract
from sparkgate.policy import (
    Allocation,
    PolicyError,
    load_policy,
    parse_field_path,
    resolve,
)

EXAMPLE = Path(__file__).parents[2] / "manifests" / "components" / "example-policy" / "policy.yaml"
HEAD = "apiVersion: sparkgate.io/v1alpha1\nkind: Policy\n"


def errors_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        load_policy(HEAD + text)
    return info.value.errors


def test_example_policy_loads() -> None:
    policy = load_policy(EXAMPLE.read_text())
    assert [p.name for p in policy.profiles] == ["analytics", "default"]
    analytics = policy.profiles[0]
    assert analytics.config_maps[0].source == "spark-log4j"
    assert analytics.overrides == (("spec", "priorityClassName"),)
    assert policy.max_pending_cluster == 150
    assert policy.is_excluded("kube-system") and policy.is_excluded("sparkgate-system")
    assert policy.is_excluded("legacy-team-a") and not policy.is_excluded("spark-jobs")


def test_empty_policy_gets_defaults() -> None:
    policy = load_policy(HEAD)
    assert policy.allocation == Allocation(batch_size=10, batch_delay_seconds=1.0, max_pending_per_app=50)
    assert policy.profiles == ()
    assert policy.profile_for("ns", {}, {}) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("allocation: {batchSize: 0}", "allocation.batchSize: must be between 1 and 10000, got 0"),
        ("allocation: {batchSize: two}", "allocation.batchSize: expected a whole number, got a string"),
        ("allocation: {batchSize: true}", "allocation.batchSize: expected a whole number, got a boolean"),
        ("allocation: {batchDelaySeconds: -1}", "allocation.batchDelaySeconds: must be between 0 and 3600"),
        ("allocation: {maxPending: 3}", "allocation.maxPending: unknown key"),
        ("colour: blue", "colour: unknown key"),
        ("profiles: {a: 1}", "profiles: expected a list of profiles, got a mapping"),
        ("profiles: [{match: {}}]", "profiles[0].name: required"),
        ("profiles: [{name: a, configMaps: [{source: x}]}]", "profiles[0].configMaps[0].mountPath: required"),
        (
            "profiles: [{name: a}, {name: b}, {name: c, configMaps: [{source: x, mountPath: etc}]}]",
            "profiles[2].configMaps[0].mountPath: must be an absolute path",
        ),
        ("profiles: [{name: a}, {name: a}]", "profiles[1].name: duplicate profile name 'a'"),
        ("profiles: [{name: none}]", "profiles[0].name: 'none' is not a valid profile name"),
        (
            "profiles: [{name: a, template: [1]}]",
            "profiles[0].template: expected a pod (a mapping), got a list",
        ),
        ("profiles: [{name: a, template: {kind: Service}}]", "profiles[0].template: expected a pod"),
        (
            "profiles: [{name: a, template: {spec: {tolerations: [{key: k, opertor: Exists}]}}}]",
            "profiles[0].template.spec.tolerations[0].opertor: unknown field",
        ),
        (
            "profiles: [{name: a, template: {spec: {containers: [{name: c, resources: {limits: {cpu: [1]}}}]}}}]",
            "profiles[0].template.spec.containers[0].resources.limits.cpu: input should be a valid string",
        ),
        (
            "profiles: [{name: a, template: {metadata: [1]}}]",
            "profiles[0].template.metadata: input should be a valid dictionary",
        ),
        (
            "profiles: [{name: a, template: {metadata: {labels: [1]}}}]",
            "profiles[0].template.metadata.labels: input should be a valid dictionary",
        ),
        (
            "profiles: [{name: a, template: {spec: {containers: [{name: c, resources: {limits: {cpu: .nan}}}]}}}]",
            "profiles[0].template.spec.containers[0].resources.limits.cpu: expected a finite number, got nan",
        ),
        (
            "profiles: [{name: a, template: {spec: {containers: [{name: c, resources: {requests: {memory: .inf}}}]}}}]",
            "profiles[0].template.spec.containers[0].resources.requests.memory: expected a finite number, got inf",
        ),
        (
            "profiles: [{name: a, template: {metadata: {managedFields: [{fieldsV1: {f: -.inf}}]}}}]",
            "profiles[0].template.metadata.managedFields[0].fieldsV1.f: expected a finite number, got -inf",
        ),
        (
            "profiles: [{name: a, labels: {spark-app-selector: x}}]",
            "profiles[0].labels.spark-app-selector: Spark's own label cannot be set by a profile",
        ),
        (
            "profiles: [{name: a, annotations: {sparkgate.io/profile: x}}]",
            "profiles[0].annotations.sparkgate.io/profile: set by sparkgate itself",
        ),
        (
            "profiles: [{name: a, overrides: [spec.tolerations]}]",
            "profiles[0].overrides[0]: spec.tolerations is not set in the template",
        ),
        (
            "profiles: [{name: a, overrides: ['status.phase']}]",
            "profiles[0].overrides[0]: 'status.phase' is not a field path",
        ),
        (
            "caps: {batchSize: 5}\nprofiles: [{name: a, allocation: {batchSize: 6}}]",
            "profiles[0].allocation.batchSize: 6 is above caps.batchSize (5)",
        ),
        ("caps: {batchSize: 5}", "allocation.batchSize: 10 is above caps.batchSize (5)"),
        ("allocation: {pacing: fast}", "allocation.pacing: expected one of adaptive, fixed, got 'fast'"),
        ("allocation: {pacing: 1}", "allocation.pacing: expected one of adaptive, fixed, got 1"),
        (
            "allocation: {autoscalerDemand: yes}",
            "allocation.autoscalerDemand: expected one of held, released (whether the cluster autoscaler sees "
            "the executor pods sparkgate holds), got True",
        ),
        (
            "profiles: [{name: a, allocation: {autoscalerDemand: all}}]",
            "profiles[0].allocation.autoscalerDemand: expected one of held, released",
        ),
        (
            "allocation: {provisioning: check}",
            "allocation.provisioning: expected one of none, check-capacity, best-effort-atomic-scale-up (the "
            "ProvisioningRequest class an app's held executors are asked for with), got 'check'",
        ),
        (
            "profiles: [{name: a, allocation: {provisioning: best-effort}}]",
            "profiles[0].allocation.provisioning: expected one of none, check-capacity, "
            "best-effort-atomic-scale-up",
        ),
        (
            "allocation: {maxBatchSize: 5}",
            "allocation.maxBatchSize: 5 is below batchSize (10); the adaptive window starts at batchSize",
        ),
        ("allocation: {maxBatchSize: 0}", "allocation.maxBatchSize: must be between 1 and 10000, got 0"),
        ("allocation: {slowBindSeconds: 0}", "allocation.slowBindSeconds: must be more than 0"),
        ("allocation: {slowBindSeconds: x}", "allocation.slowBindSeconds: expected a number of seconds"),
        (
            "allocation: {unschedulableSeconds: 3601}",
            "allocation.unschedulableSeconds: must be between 0 and 3600, got 3601",
        ),
        (
            "allocation: {unschedulableSeconds: true}",
            "allocation.unschedulableSeconds: expected a number of seconds, got a boolean",
        ),
        (
            "profiles: [{name: a, allocation: {unschedulableSeconds: -1}}]",
            "profiles[0].allocation.unschedulableSeconds: must be between 0 and 3600, got -1",
        ),
        (
            "profiles: [{name: a, allocation: {pacing: Adaptive}}]",
            "profiles[0].allocation.pacing: expected one",
        ),
        (
            "allocation: {maxBatchSize: 20}\nprofiles: [{name: a, allocation: {batchSize: 30}}]",
            "profiles[0].allocation.maxBatchSize: 20 is below batchSize (30)",
        ),
    ],
)
def test_errors_name_the_exact_place(text: str, expected: str) -> None:
    errors = errors_of(text)
    assert any(e.startswith(expected) for e in errors), errors


def test_pacing_settings_default_layer_and_override_per_profile() -> None:
    defaults = load_policy(HEAD).allocation
    assert (defaults.pacing, defaults.max_batch_size, defaults.slow_bind_seconds) == ("fixed", 500, 5.0)
    policy = load_policy(
        HEAD
        + "allocation: {pacing: adaptive, maxBatchSize: 80, slowBindSeconds: 2.5}\n"
        + "profiles: [{name: slow, allocation: {pacing: fixed}}, {name: big, allocation: {maxBatchSize: 300}}]"
    )
    assert policy.allocation.pacing == "adaptive" and policy.allocation.slow_bind_seconds == 2.5
    slow, big = policy.profiles
    assert policy.allocation_for(slow, {})[0] == replace(policy.allocation, pacing="fixed")
    assert policy.allocation_for(big, {})[0] == replace(policy.allocation, max_batch_size=300)


def test_the_autoscaler_settings_default_layer_and_override_per_profile() -> None:
    defaults = load_policy(HEAD).allocation
    assert (defaults.autoscaler_demand, defaults.provisioning) == ("held", "none")
    policy = load_policy(
        HEAD
        + "allocation: {autoscalerDemand: released}\n"
        + "profiles: [{name: batch, allocation: {provisioning: best-effort-atomic-scale-up}},"
        + " {name: adhoc, allocation: {autoscalerDemand: held, provisioning: check-capacity}}, {name: any}]"
    )
    batch, adhoc, other = policy.profiles
    assert policy.allocation_for(batch, {})[0] == replace(
        policy.allocation, provisioning="best-effort-atomic-scale-up"
    )
    assert (
        policy.allocation_for(adhoc, {})[0].autoscaler_demand,
        policy.allocation_for(adhoc, {})[0].provisioning,
    ) == (
        "held",
        "check-capacity",
    )
    assert policy.allocation_for(other, {})[0] == replace(defaults, autoscaler_demand="released")


def test_the_refused_pod_bound_defaults_layers_and_overrides_per_profile() -> None:
    assert load_policy(HEAD).allocation.unschedulable_seconds == 60.0
    policy = load_policy(
        HEAD
        + "allocation: {unschedulableSeconds: 120}\n"
        + "profiles: [{name: gpu, allocation: {unschedulableSeconds: 900}}, {name: any}]"
    )
    gpu, other = policy.profiles
    assert policy.allocation_for(gpu, {})[0].unschedulable_seconds == 900.0
    assert policy.allocation_for(other, {})[0].unschedulable_seconds == 120.0
    assert load_policy(HEAD + "allocation: {unschedulableSeconds: 0}").allocation.unschedulable_seconds == 0.0


def test_every_error_is_reported_at_once() -> None:
    errors = errors_of("allocation: {batchSize: 0, maxPendingCluster: x}\nprofiles: [{name: A}]")
    assert len(errors) == 3


def test_wrong_header_and_bad_yaml() -> None:
    with pytest.raises(PolicyError, match=r"apiVersion: expected sparkgate\.io/v1alpha1"):
        load_policy("apiVersion: v2\nkind: Policy\n")
    with pytest.raises(PolicyError, match="kind: required"):
        load_policy("apiVersion: sparkgate.io/v1alpha1\n")
    with pytest.raises(PolicyError, match=r"line 4, column 1: not valid YAML"):
        load_policy(HEAD + "profiles: [\n")
    # A control character (an escape sequence pasted from a terminal): PyYAML's reader refuses it at once.
    with pytest.raises(PolicyError, match=r"not valid YAML: .*special characters are not allowed"):
        load_policy(HEAD + "excludedNamespaces: [a\x07]\n")


def test_nesting_too_deep_to_read_is_an_error_with_its_place() -> None:
    """Not a RecursionError: that would escape the callers, which keep the last good policy on PolicyError."""
    errors = errors_of("profiles: " + "[" * 5000 + "]" * 5000 + "\n")
    assert len(errors) == 1 and errors[0].startswith("line 3, column ") and "nested too deeply" in errors[0]


def test_numeric_quantities_are_accepted_in_templates() -> None:
    policy = load_policy(
        HEAD
        + "profiles: [{name: a, template: {spec: {containers: [{name: c, resources: {limits: {cpu: 2}}}]}}}]"
    )
    assert policy.profiles[0].template["spec"]["containers"][0]["resources"]["limits"]["cpu"] == 2


POLICY = (
    HEAD
    + """
caps: {batchSize: 20, maxPendingPerApp: 40}
allocation: {batchSize: 10, maxPendingPerApp: 30}
profiles:
  - name: gpu
    match: {namespaces: ["ml-*"], labels: {accelerator: gpu}}
    allocation: {batchSize: 2}
  - name: ml
    match: {namespaces: ["ml-*"]}
  - name: anywhere
"""
)


def test_first_matching_profile_wins() -> None:
    policy = load_policy(POLICY)
    assert policy.profile_for("ml-a", {"accelerator": "gpu"}, {}).name == "gpu"
    assert policy.profile_for("ml-a", {}, {}).name == "ml"
    assert policy.profile_for("etl", {"accelerator": "gpu"}, {}).name == "anywhere"


def test_requested_profile_must_allow_the_namespace() -> None:
    policy = load_policy(POLICY)
    ask_gpu = {contract.ANNOTATION_PROFILE: "gpu"}
    assert policy.profile_for("ml-b", {}, ask_gpu).name == "gpu"
    # A pod in another namespace cannot borrow a profile meant for ml-*: normal matching applies.
    assert policy.profile_for("etl", {}, ask_gpu).name == "anywhere"
    assert policy.profile_for("etl", {}, {contract.ANNOTATION_PROFILE: "nope"}).name == "anywhere"


def test_allocation_layers_and_clamping() -> None:
    policy = load_policy(POLICY)
    gpu = policy.profile_named("gpu")
    assert policy.allocation_for(gpu, {}) == (Allocation(2, 1.0, 30), [])
    settings, problems = policy.allocation_for(
        None, {contract.ANNOTATION_BATCH_SIZE: "500", contract.ANNOTATION_MAX_PENDING: "5"}
    )
    assert settings == Allocation(batch_size=20, batch_delay_seconds=1.0, max_pending_per_app=5)
    assert problems == []


@pytest.mark.parametrize("raw", ["0", "-3", "ten", "1.5", ""])
def test_malformed_annotation_is_ignored_and_reported(raw: str) -> None:
    policy = load_policy(POLICY)
    settings, problems = policy.allocation_for(None, {contract.ANNOTATION_BATCH_SIZE: raw})
    assert settings.batch_size == 10
    assert len(problems) == 1 and contract.ANNOTATION_BATCH_SIZE in problems[0]


def test_field_paths() -> None:
    assert parse_field_path("spec.containers[spark-kubernetes-executor].securityContext") == (
        "spec",
        "containers",
        "[spark-kubernetes-executor]",
        "securityContext",
    )
    assert parse_field_path("spec..x") is None
    assert parse_field_path("status.phase") is None
    pod = {"spec": {"containers": [{"name": "a", "image": "i"}]}}
    assert resolve(pod, ("spec", "containers", "[a]", "image")) == (True, "i")
    assert resolve(pod, ("spec", "containers", "[b]", "image")) == (False, None)


def test_digest_changes_with_the_text() -> None:
    assert load_policy(HEAD).digest != load_policy(HEAD + "# comment\n").digest


def test_the_shipped_policies_pace_adaptively() -> None:
    for path in (EXAMPLE, EXAMPLE.parents[2] / "base" / "policy.yaml"):
        allocation = load_policy(path.read_text()).allocation
        assert (allocation.pacing, allocation.max_batch_size, allocation.slow_bind_seconds) == (
            "adaptive",
            500,
            5.0,
        ), path
