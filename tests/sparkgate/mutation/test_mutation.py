"""The mutation of an executor pod: what each policy feature does, on real Spark pods and generated ones."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkgate import contract
from sparkgate.mutation import Outcome, mutate, validate_update
from sparkgate.policy import Policy, load_policy


def request_for(
    pod: dict[str, Any], namespace: str = "spark-jobs", operation: str = "CREATE"
) -> dict[str, Any]:
    return {
        "uid": "u1",
        "operation": operation,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": namespace,
        "object": pod,
    }


def executor(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "app-exec-1",
            "labels": {
                "spark-role": "executor",
                "spark-app-selector": "spark-abc",
                "spark-exec-id": "1",
                **(labels or {}),
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "spark-kubernetes-executor",
                    "image": "spark:4",
                    "env": [{"name": "SPARK_EXECUTOR_ID", "value": "1"}],
                }
            ],
            **spec,
        },
    }


def policy(profile: str = "", extra: str = "") -> Policy:
    text = f"""
apiVersion: sparkgate.io/v1alpha1
kind: Policy
{extra}
profiles:
  - name: p
{profile}
"""
    return load_policy(text)


def admitted(pod: dict[str, Any], pol: Policy, namespace: str = "spark-jobs") -> dict[str, Any]:
    result = mutate(request_for(pod, namespace), pol)
    out = jsonpatch.apply_patch(pod, result.ops)
    assert mutate(request_for(out, namespace), pol).ops == [], "re-mutating the admitted pod must be a no-op"
    return out


def test_every_captured_spark_pod_gets_the_gate_profile_template_and_config_maps(
    reviews, example_policy
) -> None:
    for name, review in reviews.items():
        request = review["request"]
        pod = request["object"]
        before = copy.deepcopy(pod)
        result = mutate(request, example_policy)
        assert result.outcome is Outcome.MUTATED, name
        assert pod == before, "the input must not be mutated"
        out = jsonpatch.apply_patch(pod, result.ops)
        meta, spec = out["metadata"], out["spec"]
        assert spec["schedulingGates"][-1] == {"name": contract.GATE}
        for key in contract.SPARK_LABELS & pod["metadata"]["labels"].keys():
            assert meta["labels"][key] == pod["metadata"]["labels"][key]
        spark = contract.spark_container_index(pod["spec"]["containers"])
        assert contract.spark_container_index(spec["containers"]) == spark
        old_c, new_c = pod["spec"]["containers"][spark], spec["containers"][spark]
        for field in ("name", "image", "args", "command", "resources", "ports"):
            assert new_c.get(field) == old_c.get(field), (name, field)
        app_id = pod["metadata"]["labels"][contract.LABEL_APP_ID]
        if name.startswith("etl-nightly"):
            assert result.profile == "analytics"
            assert meta["labels"]["cost-center"] == "analytics"
            assert meta["labels"]["sparkgate.io/tier"] == "batch"
            assert meta["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
            assert meta["annotations"]["sparkgate.io/batch-size"] == "4", "user annotations are kept"
            assert spec["priorityClassName"] == "spark-batch"
            volume = contract.configmap_volume_name("spark-log4j")
            assert {
                "name": volume,
                "configMap": {"name": contract.app_configmap_name(app_id, "spark-log4j")},
            } in spec["volumes"]
            assert {"name": volume, "mountPath": "/opt/spark/conf-extra", "readOnly": True} in new_c[
                "volumeMounts"
            ]
            sidecar = spec["containers"][0]
            assert all(m.get("name") != volume for m in sidecar.get("volumeMounts", [])), (
                "only Spark's container"
            )
            assert new_c["securityContext"]["allowPrivilegeEscalation"] is False or "securityContext" in old_c
            assert {"name": "SPARK_LOCAL_DIRS", "value": "/tmp/spark-local"} in new_c["env"] or any(
                e["name"] == "SPARK_LOCAL_DIRS" for e in old_c["env"]
            )
        else:
            assert result.profile == "default"
            assert {"key": "spark", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        assert meta["annotations"][contract.ANNOTATION_PROFILE] == result.profile
        assert mutate({**request, "object": out}, example_policy).ops == []


@pytest.mark.parametrize(
    ("request_change", "reason"),
    [
        ({"operation": "UPDATE"}, "operation UPDATE"),
        ({"kind": {"group": "", "version": "v1", "kind": "ConfigMap"}}, "not a pod"),
        ({"subResource": "status"}, "not a pod"),
        ({"namespace": "kube-system"}, "excluded"),
        ({"namespace": "legacy-etl"}, "excluded"),
        ({"namespace": "sparkgate-system"}, "excluded"),
    ],
)
def test_only_executor_pod_creations_outside_excluded_namespaces_are_changed(
    request_change, reason, example_policy
) -> None:
    result = mutate({**request_for(executor()), **request_change}, example_policy)
    assert result.outcome is Outcome.SKIPPED and result.ops == [] and reason in result.reason


@pytest.mark.parametrize(
    "labels",
    [{}, {"spark-role": "driver", "spark-app-selector": "x"}, {"spark-role": "executor"}],
)
def test_pods_that_are_not_executors_are_left_alone(labels, example_policy) -> None:
    pod = {"metadata": {"name": "x", "labels": labels}, "spec": {"containers": []}}
    assert mutate(request_for(pod), example_policy).outcome is Outcome.SKIPPED


def test_gate_is_appended_after_existing_gates_and_only_once(example_policy) -> None:
    out = admitted(executor(schedulingGates=[{"name": "example.com/quota"}]), example_policy)
    assert out["spec"]["schedulingGates"] == [{"name": "example.com/quota"}, {"name": contract.GATE}]


def test_unmatched_pod_still_gets_the_gate_and_the_none_profile() -> None:
    pol = policy("    match:\n      namespaces: [only-here]\n")
    out = admitted(executor(), pol, namespace="elsewhere")
    assert out["metadata"]["annotations"][contract.ANNOTATION_PROFILE] == contract.NO_PROFILE
    assert out["spec"]["schedulingGates"] == [{"name": contract.GATE}]


def test_template_fills_gaps_pod_wins_elsewhere_and_overrides_win() -> None:
    pol = policy(
        """    template:
      spec:
        priorityClassName: admin-class
        nodeSelector: {disk: ssd, zone: a}
        containers:
          - name: spark-kubernetes-executor
            image: admin-image
            securityContext: {runAsNonRoot: true}
            env:
              - {name: SPARK_EXECUTOR_ID, value: "999"}
              - {name: EXTRA, value: "1"}
    overrides:
      - spec.priorityClassName
      - spec.containers[spark-kubernetes-executor].securityContext
"""
    )
    pod = executor(priorityClassName="user-class", nodeSelector={"zone": "b"})
    pod["spec"]["containers"][0]["securityContext"] = {"runAsUser": 0}
    out = admitted(pod, pol)
    spec = out["spec"]
    assert spec["priorityClassName"] == "admin-class"  # overridden
    assert spec["nodeSelector"] == {"zone": "b", "disk": "ssd"}  # filled, pod wins on zone
    spark = spec["containers"][0]
    assert spark["image"] == "spark:4"  # pod wins
    assert spark["securityContext"] == {"runAsNonRoot": True}  # overridden whole
    assert {"name": "SPARK_EXECUTOR_ID", "value": "1"} in spark["env"]  # merged by name, pod wins
    assert {"name": "EXTRA", "value": "1"} in spark["env"]


def test_template_container_stands_for_spark_container_whatever_its_name() -> None:
    pol = policy(
        """    template:
      spec:
        containers:
          - name: spark-kubernetes-executor
            env: [{name: FROM_TEMPLATE, value: "yes"}]
          - name: sidecar
            image: busybox
"""
    )
    pod = executor()
    pod["spec"]["containers"] = [
        {"name": "log-shipper", "image": "fluent"},
        {"name": "custom-exec", "image": "spark:4", "env": [{"name": "SPARK_EXECUTOR_ID", "value": "1"}]},
    ]
    out = admitted(pod, pol)
    names = [c["name"] for c in out["spec"]["containers"]]
    assert names == ["log-shipper", "custom-exec", "sidecar"]
    assert {"name": "FROM_TEMPLATE", "value": "yes"} in out["spec"]["containers"][1]["env"]
    assert "env" not in out["spec"]["containers"][0]


def test_tolerations_merge_by_value_and_volume_mounts_by_path() -> None:
    pol = policy(
        """    template:
      spec:
        tolerations:
          - {key: a, operator: Exists}
          - {key: b, operator: Exists}
        containers:
          - name: spark-kubernetes-executor
            volumeMounts:
              - {name: scratch, mountPath: /scratch}
              - {name: other, mountPath: /data}
        volumes:
          - {name: scratch, emptyDir: {}}
"""
    )
    pod = executor(tolerations=[{"key": "a", "operator": "Exists"}])
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "mine", "mountPath": "/data"}]
    out = admitted(pod, pol)
    assert out["spec"]["tolerations"] == [
        {"key": "a", "operator": "Exists"},
        {"key": "b", "operator": "Exists"},
    ]
    mounts = out["spec"]["containers"][0]["volumeMounts"]
    assert mounts == [{"name": "mine", "mountPath": "/data"}, {"name": "scratch", "mountPath": "/scratch"}]


def test_spark_labels_are_never_changed_and_profile_labels_win_over_the_pods() -> None:
    pol = policy(
        """    template:
      metadata:
        labels: {spark-app-name: evil, team: template-team}
    labels: {owner: platform}
    annotations: {"example.com/a~b": "x"}
"""
    )
    pod = executor({"owner": "someone", "team": "pod-team", "spark-app-name": "real"})
    out = admitted(pod, pol)
    labels = out["metadata"]["labels"]
    assert labels["spark-role"] == "executor" and labels["spark-app-name"] == "real"
    assert labels["owner"] == "platform"  # profile labels win
    assert labels["team"] == "pod-team"  # template labels only fill
    assert out["metadata"]["annotations"]["example.com/a~b"] == "x"


def test_pointer_tokens_are_escaped() -> None:
    pol = policy('    labels: {"example.com/slot~1": "x"}\n')
    ops = mutate(request_for(executor()), pol).ops
    assert {"op": "add", "path": "/metadata/labels/example.com~1slot~01", "value": "x"} in ops


# --- properties over generated pods and policies ---------------------------------------------------

keys = st.from_regex(r"[a-z][a-z0-9.~/-]{0,12}", fullmatch=True)
values = st.text(alphabet="abcxyz019-", max_size=6)
env = st.lists(
    st.fixed_dictionaries({"name": st.sampled_from(["A", "B", "C", "SPARK_EXECUTOR_ID"]), "value": values}),
    max_size=4,
    unique_by=lambda e: e["name"],
)
tolerations = st.lists(
    st.fixed_dictionaries({"key": st.sampled_from(["a", "b", "c"]), "operator": st.just("Exists")}),
    max_size=3,
    unique_by=lambda t: t["key"],
)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    labels = draw(st.dictionaries(keys, values, max_size=4))
    labels.update(
        {
            "spark-role": "executor",
            "spark-app-selector": draw(st.from_regex(r"spark-[a-zA-Z0-9._]{1,40}", fullmatch=True)),
            "spark-exec-id": "3",
        }
    )
    containers = [{"name": "spark-kubernetes-executor", "image": "spark", "env": draw(env)}]
    if draw(st.booleans()):
        containers.insert(0, {"name": "sidecar", "image": "x"})
    spec: dict[str, Any] = {"containers": containers}
    if draw(st.booleans()):
        spec["tolerations"] = draw(tolerations)
    if draw(st.booleans()):
        spec["schedulingGates"] = [{"name": "other/gate"}]
    meta: dict[str, Any] = {"name": "p", "labels": labels}
    if draw(st.booleans()):
        meta["annotations"] = draw(st.dictionaries(keys, values, max_size=3))
    return {"metadata": meta, "spec": spec}


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    import yaml

    template = {
        "metadata": {"labels": draw(st.dictionaries(keys, values, max_size=3))},
        "spec": {
            "tolerations": draw(tolerations),
            "containers": [{"name": "spark-kubernetes-executor", "env": draw(env)}],
        },
    }
    profile = {
        "name": "gen",
        "template": template,
        "labels": draw(
            st.dictionaries(keys.filter(lambda k: k not in contract.SPARK_LABELS), values, max_size=3)
        ),
        "annotations": draw(st.dictionaries(keys, values, max_size=3)),
        "configMaps": [{"source": "cm-a", "mountPath": "/etc/a"}] if draw(st.booleans()) else [],
    }
    if draw(st.booleans()):
        profile["overrides"] = ["spec.tolerations"]
    return load_policy(
        yaml.safe_dump({"apiVersion": "sparkgate.io/v1alpha1", "kind": "Policy", "profiles": [profile]})
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods(), policies())
def test_patch_always_applies_never_touches_spark_labels_and_is_idempotent(
    pod: dict[str, Any], pol: Policy
) -> None:
    before = copy.deepcopy(pod)
    result = mutate(request_for(pod), pol)
    assert pod == before
    out = jsonpatch.apply_patch(pod, result.ops)
    for key in contract.SPARK_LABELS & pod["metadata"]["labels"].keys():
        assert out["metadata"]["labels"][key] == pod["metadata"]["labels"][key]
    assert out["spec"]["schedulingGates"][-1] == {"name": contract.GATE}
    assert mutate(request_for(out), pol).ops == []


# --- gate protection ---------------------------------------------------------------------------------

ALLOCATOR = "system:serviceaccount:sparkgate-system:sparkgate-allocator"


def update(
    old: dict[str, Any], new: dict[str, Any], user: str, groups: tuple[str, ...] = ()
) -> dict[str, Any]:
    user_info = {"username": user, "groups": [*groups, "system:authenticated"]}
    return {**request_for(new, operation="UPDATE"), "oldObject": old, "userInfo": user_info}


def test_only_the_allocator_and_the_break_glass_group_may_remove_the_gate() -> None:
    gated = executor(schedulingGates=[{"name": "x/other"}, {"name": contract.GATE}])
    released = executor(schedulingGates=[{"name": "x/other"}])
    users = frozenset({ALLOCATOR})
    allowed, message = validate_update(update(gated, released, "alice", ("system:masters",)), users)
    assert not allowed
    assert "sparkgate" in message and ALLOCATOR in message and "alice" in message
    assert contract.BREAK_GLASS_GROUP in message
    assert validate_update(update(gated, released, ALLOCATOR), users) == (True, "")
    assert validate_update(update(gated, released, "alice", (contract.BREAK_GLASS_GROUP,)), users) == (
        True,
        "",
    )


def test_other_updates_are_allowed_untouched() -> None:
    gated = executor(schedulingGates=[{"name": contract.GATE}])
    relabelled = copy.deepcopy(gated)
    relabelled["metadata"]["labels"]["spark-exec-inactive"] = "true"  # what Spark's driver does
    users = frozenset({ALLOCATOR})
    assert validate_update(update(gated, relabelled, "spark-driver"), users)[0]
    other_gate_removed = executor(schedulingGates=[{"name": contract.GATE}])
    with_other = executor(schedulingGates=[{"name": "x/other"}, {"name": contract.GATE}])
    assert validate_update(update(with_other, other_gate_removed, "someone"), users)[0]
    assert validate_update({**update(gated, executor(), "x"), "operation": "CREATE"}, users)[0]


def test_the_profile_sends_executors_to_its_scheduler_unless_they_chose_one() -> None:
    """`scheduling.schedulerName` replaces the API server's default-scheduler (or none), never a scheduler
    the pod asked for itself (Spark's spark.kubernetes.scheduler.name, e.g. volcano)."""
    pol = policy("    scheduling: {schedulerName: sparkgate}")
    assert admitted(executor(schedulerName="default-scheduler"), pol)["spec"]["schedulerName"] == "sparkgate"
    assert admitted(executor(), pol)["spec"]["schedulerName"] == "sparkgate"
    assert admitted(executor(schedulerName="volcano"), pol)["spec"]["schedulerName"] == "volcano"
    assert "schedulerName" not in admitted(executor(), policy())["spec"]
