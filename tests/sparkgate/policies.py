"""Generated policies for the parity of the rendered MutatingAdmissionPolicy with the webhook (hypothesis).

Each profile draws its template, overrides, labels, annotations, config maps and scheduler from values that
meet the captured Spark pods (tests/data/spark-4.3) in every way the merge distinguishes: a field the pod
lacks or has, a keyed list element the pod has (an env var of Spark's, a volume, a sidecar) or lacks,
a toleration that covers the API server's default ones, a template class or service account that makes
derived fields stale, a label Spark owns.
"""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import strategies as st

from sparkgate.policy import Policy, load_policy

NAMESPACES = ("spark-jobs", "spark-etl", "adhoc", "legacy-x", "monitoring")

ENV = st.sampled_from(
    [
        {"name": "SPARK_USER", "value": "admin"},  # the pod has it: the pod wins
        {"name": "SPARK_LOCAL_DIRS", "value": "/tmp/spark-local"},
        {"name": "TZ", "value": "UTC"},
    ]
)
TOLERATIONS = st.sampled_from(
    [
        {"key": "dedicated", "operator": "Equal", "value": "spark", "effect": "NoSchedule"},
        {"key": "spark", "operator": "Exists", "effect": "NoSchedule"},
        {"operator": "Exists"},  # covers every key: the defaults become stale
        # (not the API server's own default toleration itself: test_render_parity.py pins that difference)
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
        {
            "key": "node.kubernetes.io/unreachable",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 60,
        },
    ]
)
SPARK_CONTAINER = st.fixed_dictionaries(
    {"name": st.just("spark-kubernetes-executor")},
    optional={
        "env": st.lists(ENV, max_size=3, unique_by=lambda e: e["name"]),
        "securityContext": st.sampled_from(
            [{"allowPrivilegeEscalation": False}, {"runAsNonRoot": True, "runAsUser": 185}]
        ),
        "resources": st.sampled_from([{"limits": {"memory": "4Gi"}}, {"requests": {"cpu": "1"}}]),
        "volumeMounts": st.sampled_from(
            [
                [{"name": "scratch", "mountPath": "/scratch"}],
                [{"name": "spark-local-dir-1", "mountPath": "/var/data/spark-x", "readOnly": True}],
            ]
        ),
        "imagePullPolicy": st.just("Always"),
    },
)
SIDECAR = st.sampled_from(
    [
        {"name": "log-shipper", "image": "fluent-bit:3", "env": [{"name": "LEVEL", "value": "debug"}]},
        {"name": "metrics", "image": "exporter:1", "ports": [{"name": "metrics", "containerPort": 9090}]},
    ]
)
SPEC = st.fixed_dictionaries(
    {},
    optional={
        "priorityClassName": st.sampled_from(["spark-batch", "spark-low"]),
        "runtimeClassName": st.just("gvisor"),
        "serviceAccountName": st.sampled_from(["default", "spark-exec"]),
        "automountServiceAccountToken": st.booleans(),
        "schedulerName": st.sampled_from(["default-scheduler", "volcano"]),
        "nodeSelector": st.sampled_from([{"pool": "spark"}, {"kubernetes.io/os": "linux"}]),
        "tolerations": st.lists(TOLERATIONS, max_size=3),
        "containers": st.lists(
            st.one_of(SPARK_CONTAINER, SIDECAR), max_size=2, unique_by=lambda c: c["name"]
        ),
        "volumes": st.sampled_from(
            [
                [{"name": "scratch", "emptyDir": {}}],
                [{"name": "spark-local-dir-1", "emptyDir": {"medium": "Memory"}}],
            ]
        ),
        "imagePullSecrets": st.just([{"name": "registry"}]),
        "terminationGracePeriodSeconds": st.integers(min_value=0, max_value=120),
    },
)
LABEL_MAP = st.dictionaries(
    st.sampled_from(
        ["cost-center", "team", "spark-exec-resourceprofile-id", "spark-role", "sparkgate.io/tier"]
    ),
    st.sampled_from(["analytics", "etl", "0"]),
    max_size=3,
)
ANNOTATION_MAP = st.dictionaries(
    st.sampled_from(["cluster-autoscaler.kubernetes.io/safe-to-evict", "note", "sparkgate.io/profile"]),
    st.sampled_from(["false", "x"]),
    max_size=2,
)


def _override_paths(template: dict[str, Any]) -> list[str]:
    """Every field path a profile may name as an override for this template (it must be set there)."""
    paths = [f"metadata.{k}" for k in (template.get("metadata") or {})]
    paths += [
        f"metadata.{k}.{key}"
        for k, m in (template.get("metadata") or {}).items()
        for key in m
        if key.isalnum()
    ]
    spec = template.get("spec") or {}
    for key, value in spec.items():
        if key == "containers":
            for c in value:
                if c["name"] != "spark-kubernetes-executor":
                    paths.append(f"spec.containers[{c['name']}]")
                paths += [f"spec.containers[{c['name']}].{f}" for f in c if f != "name"]
        else:
            paths.append(f"spec.{key}")
    return paths


@st.composite
def profiles(draw: st.DrawFn, index: int) -> dict[str, Any]:
    template: dict[str, Any] = {}
    meta = {k: v for k, v in {"labels": draw(LABEL_MAP), "annotations": draw(ANNOTATION_MAP)}.items() if v}
    meta["labels"] = {
        k: v for k, v in meta.get("labels", {}).items() if not k.startswith("sparkgate.io")
    } or None
    meta = {k: v for k, v in meta.items() if v}
    if meta:
        template["metadata"] = meta
    spec = draw(SPEC)
    if spec:
        template["spec"] = spec
    profile: dict[str, Any] = {"name": f"p{index}"}
    match: dict[str, Any] = {}
    if draw(st.booleans()):
        match["namespaces"] = draw(
            st.lists(st.sampled_from(["spark-*", "adhoc", "spark-j?bs", "[as]*"]), min_size=1, max_size=2)
        )
    if draw(st.booleans()):
        match["labels"] = draw(
            st.sampled_from([{"team": "analytics"}, {"owner": "data-eng"}, {"team": "nobody"}])
        )
    if match:
        profile["match"] = match
    if template:
        profile["template"] = template
        candidates = _override_paths(template)
        if candidates:
            profile["overrides"] = draw(st.lists(st.sampled_from(candidates), max_size=3, unique=True))
    labels = {k: v for k, v in draw(LABEL_MAP).items() if not k.startswith("spark-")}
    if labels:
        profile["labels"] = labels
    annotations = {k: v for k, v in draw(ANNOTATION_MAP).items() if k != "sparkgate.io/profile"}
    if annotations:
        profile["annotations"] = annotations
    if draw(st.booleans()):
        profile["configMaps"] = draw(
            st.lists(
                st.sampled_from(
                    [
                        {"source": "spark-log4j", "mountPath": "/opt/spark/conf-extra"},
                        {"source": "hive-site", "mountPath": "/etc/hive"},
                    ]
                ),
                max_size=2,
                unique_by=lambda c: c["source"],
            )
        )
    if draw(st.booleans()):
        profile["scheduling"] = {"schedulerName": "sparkgate-scheduler"}
    return profile


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    count = draw(st.integers(min_value=0, max_value=3))
    document = {
        "apiVersion": "sparkgate.io/v1alpha1",
        "kind": "Policy",
        "excludedNamespaces": ["monitoring", "legacy-*"],
        "profiles": [draw(profiles(i)) for i in range(count)],
    }
    return load_policy(yaml.safe_dump(document))
