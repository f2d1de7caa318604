"""The admission-policy mode's costs: the CEL cost of the rendered MutatingAdmissionPolicy against the API
server's limits, and the time of a pod creation through kubesim's admission chain in both modes.

    python -m bench.admission_policy [--pods 200] [--profiles 50] [--smoke]

CEL cost, for the example policy and a policy of `--profiles` profiles (each with a template, labels and a
config map; the pod matches only the last, the dearest choice), on a captured Spark 4.3 executor pod:
the cost of each expression by cel-go's runtime cost model (the one kube-apiserver enforces), as kubesim
meters it (kubesim/celeval.py), the dearest expression and the total of one policy evaluation; and
sparkgate's worst-case bound (sparkgate/render.py, what `policy check --admission policy` compares with the
limits); against PerCallLimit (1,000,000) and RuntimeCELCostBudget (10,000,000). Latency: `--pods` executor
pods created one after another with the official client against kubesim, once with the rendered policy
installed and no webhook, once with sparkgate's webhook (gunicorn, TLS) and no policy; p50 and p95 of each
creation, and their ratio (target: the policy at most 5 times the webhook path). kubesim's CEL is Python:
its latencies are kubesim's, not kube-apiserver's (cel-go), so the ratio says more than the figures.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from . import common
from .common import Row

NAME = "admission_policy"
MODEL = "cel-go runtime cost (interpreter/runtimecost.go, Kubernetes library/cost.go)"
FIXTURE = "etl-nightly-exec-1.admissionreview.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pods", type=int, default=200, help="pod creations timed per mode")
    parser.add_argument("--profiles", type=int, default=50, help="profiles of the large policy")


def large_policy(profiles: int) -> str:
    """`profiles` profiles, each matched by a label only the last one's value meets on the fixture pod."""
    items = []
    for i in range(profiles):
        last = i == profiles - 1
        items.append(
            {
                "name": f"team-{i}",
                "match": {
                    "namespaces": ["spark-*"],
                    "labels": {"team": "analytics" if last else f"team-{i}"},
                },
                "template": {
                    "metadata": {"labels": {"cost-center": f"cc-{i}"}},
                    "spec": {
                        "priorityClassName": "spark-batch",
                        "tolerations": [
                            {
                                "key": "dedicated",
                                "operator": "Equal",
                                "value": f"t{i}",
                                "effect": "NoSchedule",
                            }
                        ],
                        "containers": [
                            {
                                "name": "spark-kubernetes-executor",
                                "env": [{"name": "TEAM", "value": f"team-{i}"}],
                                "securityContext": {"allowPrivilegeEscalation": False},
                            }
                        ],
                    },
                },
                "overrides": ["spec.priorityClassName"],
                "labels": {"sparkgate.io/tier": "batch"},
                "configMaps": [{"source": "spark-log4j", "mountPath": "/opt/spark/conf-extra"}],
            }
        )
    return yaml.safe_dump({"apiVersion": "sparkgate.io/v1alpha1", "kind": "Policy", "profiles": items})


def measured_cost(objects: list[dict[str, Any]], pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    """Each expression's own cost in one admission of `pod` (the mutations on the pod as received), by
    cel-go's runtime cost model as kubesim meters it (kubesim/celeval.py); the variables counted where a
    mutation read them, as the API server charges them (composition.go), and the total of the policy's
    evaluation: its match conditions (the rendering has none since issue 38: a guard in each mutation), then
    each mutation with the variables it read."""
    from kubesim import cel

    spec = objects[0]["spec"]
    inputs = cel.Inputs(
        {"object": pod, "request": {"namespace": namespace, "operation": "CREATE", "dryRun": False}}
    )
    inputs.define(spec["variables"])
    by_expression: dict[str, int] = {}
    total = 0
    for condition in spec.get("matchConditions") or []:
        assert cel.evaluate(condition["expression"], inputs) is True
        own, _ = cel.split_cost(condition["expression"], inputs)
        by_expression[f"matchConditions[{condition['name']}]"] = own
        total += own
    for i, mutation in enumerate(spec["mutations"]):
        own, read = cel.split_cost(mutation["jsonPatch"]["expression"], inputs)
        by_expression[f"mutations[{i}]"] = own
        total += own + sum(read.values())
        for name, cost in read.items():
            key = f"variables[{name}]"
            by_expression[key] = max(cost, by_expression.get(key, 0))
    dearest = max(by_expression, key=lambda k: by_expression[k])
    return {
        "model": MODEL,
        "by_expression": by_expression,
        "dearest": dearest,
        "max_expression": by_expression[dearest],
        "total": total,
    }


def costs(policy_text: str, pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    from sparkgate.policy import load_policy
    from sparkgate.render import render

    rendered = render(load_policy(policy_text))
    return {
        "estimate": {"max_expression": max(rendered.costs.values()), "total": rendered.total_cost},
        "measured_kubesim": measured_cost(rendered.objects, pod, namespace),
        "mutations": len(rendered.objects[0]["spec"]["mutations"]),
        "policy_bytes": rendered.size,
    }


def executor(i: int) -> dict[str, Any]:
    review = json.loads((common.FIXTURES / FIXTURE).read_text())
    pod: dict[str, Any] = copy.deepcopy(review["request"]["object"])
    pod["metadata"] = {"name": f"bench-exec-{i}", "labels": pod["metadata"]["labels"]}
    pod["spec"].pop("nodeName", None)
    pod["spec"].pop("schedulingGates", None)
    return pod


def creation_ms(mode: str, pods: int, policy_path: Path, workdir: Path) -> list[float]:
    """Milliseconds of each pod creation through kubesim's chain with sparkgate in `mode`."""
    from kubernetes import client, config

    from kubesim.cluster import Cluster
    from sandbox.local_webhook import LocalWebhook
    from sandbox.localsystem import webhook_configurations
    from sparkgate.policy import load_policy
    from sparkgate.render import render

    with Cluster(nodes=1) as cluster:
        cluster.add_namespace("spark-jobs")
        cluster.add_priority_class("spark-batch", 1000)  # the example policy's class
        webhook = None
        if mode == "policy":
            policy, binding = render(load_policy(policy_path.read_text())).objects
            cluster.store.create("mutatingadmissionpolicies", policy)
            cluster.store.create("mutatingadmissionpolicybindings", binding)
        else:
            webhook = LocalWebhook(policy_path, workdir / "webhook")
            webhook.start()
            mutating, _ = webhook_configurations(webhook.url, webhook.ca_pem)
            cluster.store.create("mutatingwebhookconfigurations", mutating)
        api = config.new_client_from_config(str(cluster.add_user("admin", ["system:masters"])))
        core = client.CoreV1Api(api)
        try:
            out = []
            for i in range(pods):
                start = time.perf_counter()
                created = core.create_namespaced_pod("spark-jobs", executor(i), _preload_content=False)
                out.append((time.perf_counter() - start) * 1000)
                annotations = json.loads(created.data)["metadata"].get("annotations") or {}
                assert annotations.get("sparkgate.io/profile") == "analytics", annotations
            return out
        finally:
            api.close()
            if webhook is not None:
                webhook.stop()


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.smoke:
        args.pods, args.profiles = 10, 5
    review = json.loads((common.FIXTURES / FIXTURE).read_text())
    pod, namespace = review["request"]["object"], review["request"]["namespace"]
    example = common.EXAMPLE_POLICY.read_text()
    result: dict[str, Any] = {
        "config": {"pods": args.pods, "profiles": args.profiles, "fixture": FIXTURE},
        "limits": {"per_expression": 1_000_000, "per_policy_evaluation": 10_000_000},
        "cel_cost": {
            "example_policy": costs(example, pod, namespace),
            f"{args.profiles}_profiles": costs(large_policy(args.profiles), pod, namespace),
        },
    }
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        latency = {}
        for mode in ("policy", "webhook"):
            samples = creation_ms(mode, args.pods, common.EXAMPLE_POLICY, workdir)
            latency[mode] = {
                "p50": round(common.median(samples), 2),
                "p95": round(common.percentile(samples, 0.95), 2),
                "count": len(samples),
            }
    result["create_ms"] = latency
    return result


def rows(result: dict[str, Any]) -> list[Row]:
    out = []
    for name, entry in result["cel_cost"].items():
        label = name.replace("_", " ")
        measured, estimate = entry["measured_kubesim"], entry["estimate"]
        for kind, figures in (
            (f"{measured['model']}: dearest expression ({measured['dearest']})", measured),
            ("sparkgate's worst-case bound: dearest expression", estimate),
        ):
            out.append(
                Row(
                    f"CEL cost, {label}, {kind} / total",
                    f"{figures['max_expression']:,} / {figures['total']:,}",
                    "< 1,000,000 / < 10,000,000",
                    figures["max_expression"] < 1_000_000 and figures["total"] < 10_000_000,
                )
            )
    latency = result["create_ms"]
    for mode, figures in latency.items():
        out.append(
            Row(f"pod create through kubesim, {mode}: p50 / p95", f"{figures['p50']} / {figures['p95']} ms")
        )
    ratio = latency["policy"]["p50"] / latency["webhook"]["p50"]
    out.append(
        Row("pod create through kubesim, policy / webhook (p50)", f"{ratio:.2f} x", "<= 5 x", ratio <= 5)
    )
    return out


if __name__ == "__main__":
    import sys

    sys.exit(common.main(sys.modules[__name__]))
