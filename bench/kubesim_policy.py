"""kubesim's MutatingAdmissionPolicy: what one simple policy adds to a pod creation through kubesim's chain.

A kubesim cluster (one node) and an executor pod (Spark's labels, one container with requests). Each round
creates `--pods` pods one after the other with the official client over HTTP, without a policy and then
with one bound to executor pods (a `matchConditions` on `spark-role`, two JSONPatch mutations: the sparkgate
gate and a label through `jsonpatch.escapeKey`, `reinvocationPolicy: IfNeeded`, so the policy and the
in-tree plugins run twice), and times the admission chain alone in-process (`AdmissionChain.mutate`) for
the same pod. Every pod carries a scheduling gate of its own, so the scheduler and kubelets stay idle in
both cases. The figures are the medians of the rounds' p50 and p99 (CPython's cel-python is the cost).

This is kubesim's cost, for whoever sizes a test that creates many pods through a policy; it says nothing
of a real API server (cel-go is much faster).

    python -m bench.kubesim_policy [--pods 200] [--rounds 5] [--smoke]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from kubernetes import client, config

from kubesim.apiserver import ADMIN
from kubesim.cluster import Cluster
from kubesim.jsondata import clone
from kubesim.store import AdmissionRequest

from . import common
from .common import Row, fmt, median, percentile

NAME = "kubesim_policy"
POLICY = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "MutatingAdmissionPolicy",
    "metadata": {"name": "gate"},
    "spec": {
        "matchConstraints": {
            "resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
            ]
        },
        "matchConditions": [
            {"name": "executors", "expression": "object.metadata.labels['spark-role'] == 'executor'"}
        ],
        "failurePolicy": "Fail",
        "reinvocationPolicy": "IfNeeded",
        "mutations": [
            {
                "patchType": "JSONPatch",
                "jsonPatch": {
                    "expression": "object.spec.schedulingGates.exists(g, g.name == 'sparkgate.io/allocator') ? [] : "
                    "[JSONPatch{op: 'add', path: '/spec/schedulingGates/-', value: {'name': 'sparkgate.io/allocator'}}]"
                },
            },
            {
                "patchType": "JSONPatch",
                "jsonPatch": {
                    "expression": "[JSONPatch{op: 'add', path: '/metadata/labels/' + "
                    "jsonpatch.escapeKey('sparkgate.io/tier'), value: 'batch'}]"
                },
            },
        ],
    },
}
BINDING = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "MutatingAdmissionPolicyBinding",
    "metadata": {"name": "gate"},
    "spec": {"policyName": "gate"},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pods", type=int, default=200, help="pods created per case and round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the figures are their medians")


def executor(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"spark-role": "executor", "spark-app-selector": "spark-1", "spark-exec-id": "1"},
        },
        "spec": {
            "schedulingGates": [{"name": "bench/hold"}],
            "containers": [
                {
                    "name": "spark-kubernetes-executor",
                    "image": "spark:4.3",
                    "resources": {"requests": {"cpu": "1"}},
                }
            ],
        },
    }


def _stats(samples: list[float]) -> dict[str, float]:
    return {
        "count": len(samples),
        "p50": round(percentile(samples, 0.5), 3),
        "p99": round(percentile(samples, 0.99), 3),
    }


def _round(cluster: Cluster, core: client.CoreV1Api, pods: int, tag: str) -> dict[str, dict[str, float]]:
    http_ms, chain_ms = [], []
    for i in range(pods):
        body = executor(f"{tag}-{i}")
        started = time.perf_counter()
        core.create_namespaced_pod("spark", body)
        http_ms.append((time.perf_counter() - started) * 1000)
        # The chain changes the request's object in place (the store hands it its own copy).
        request = AdmissionRequest(
            "CREATE", "pods", "", "spark", body["metadata"]["name"], clone(body), None, ADMIN, False
        )
        started = time.perf_counter()
        cluster.chain.mutate(request)
        chain_ms.append((time.perf_counter() - started) * 1000)
    for name in [f"{tag}-{i}" for i in range(pods)]:
        cluster.store.delete("pods", "spark", name, grace_period_seconds=0)
    return {"http_ms": _stats(http_ms), "chain_ms": _stats(chain_ms)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    pods, rounds = (10, 1) if args.smoke else (args.pods, args.rounds)
    out: dict[str, Any] = {"config": {"pods": pods, "rounds": rounds}, "rounds": []}
    with Cluster(nodes=1) as cluster:
        cluster.add_namespace("spark")
        api = config.new_client_from_config(str(cluster.kubeconfig()))
        try:
            core = client.CoreV1Api(api)
            for r in range(rounds):
                without = _round(cluster, core, pods, f"plain-{r}")
                cluster.store.create("mutatingadmissionpolicies", POLICY)
                cluster.store.create("mutatingadmissionpolicybindings", BINDING)
                with_policy = _round(cluster, core, pods, f"policy-{r}")
                cluster.store.delete("mutatingadmissionpolicybindings", None, "gate")
                cluster.store.delete("mutatingadmissionpolicies", None, "gate")
                out["rounds"].append({"without": without, "with_policy": with_policy})
        finally:
            api.close()
    summary: dict[str, Any] = {}
    for case in ("without", "with_policy"):
        for where in ("http_ms", "chain_ms"):
            summary.setdefault(case, {})[where] = {
                q: round(median([r[case][where][q] for r in out["rounds"]]), 3) for q in ("p50", "p99")
            }
    summary["added_p50_ms"] = {
        where: round(summary["with_policy"][where]["p50"] - summary["without"][where]["p50"], 3)
        for where in ("http_ms", "chain_ms")
    }
    out["summary"] = summary
    return out


def rows(result: dict[str, Any]) -> list[Row]:
    s = result["summary"]
    out = []
    for where, label in (("http_ms", "pod create over HTTP"), ("chain_ms", "admission chain in-process")):
        out.append(
            Row(
                f"{label}, p50 / p99, without / with the policy",
                f"{fmt(s['without'][where]['p50'], 2)} / {fmt(s['without'][where]['p99'], 2)} ms, "
                f"{fmt(s['with_policy'][where]['p50'], 2)} / {fmt(s['with_policy'][where]['p99'], 2)} ms",
            )
        )
    return out


if __name__ == "__main__":
    import sys

    sys.exit(common.main(sys.modules[__name__]))
