"""Try the webhook in ten seconds: `python -m sandbox.tryout` (`make run`).

Starts the real webhook (gunicorn, TLS with a throwaway CA) on loopback with the example policy, sends it
the AdmissionReview of a real Spark 4.3 executor pod over verified HTTPS, shows what it did, and stops.
"""

from __future__ import annotations

import base64
import json
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.syntax import Syntax

from sparkgate.json_patch import apply_patch

from .local_webhook import LocalWebhook

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_POLICY = REPO / "manifests" / "components" / "example-policy" / "policy.yaml"
FIXTURE = REPO / "tests" / "data" / "spark-4.3" / "etl-nightly-exec-1.admissionreview.json"

FALLBACK_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "etl-nightly-exec-1",
        "namespace": "spark-jobs",
        "labels": {
            "spark-app-selector": "spark-d26cd641513a48f2bd6c307f1a3bcf30",
            "spark-role": "executor",
            "spark-exec-id": "1",
            "spark-exec-resourceprofile-id": "0",
            "spark-app-name": "etl-nightly",
            "spark-version": "4.3.0",
            "team": "analytics",
        },
    },
    "spec": {
        "containers": [
            {
                "name": "spark-kubernetes-executor",
                "image": "apache/spark:4.3.0",
                "env": [{"name": "SPARK_EXECUTOR_ID", "value": "1"}],
            }
        ]
    },
}


def sample_review() -> dict[str, Any]:
    if FIXTURE.exists():
        review: dict[str, Any] = json.loads(FIXTURE.read_text())
        return review
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "tryout",
            "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "spark-jobs",
            "object": FALLBACK_POD,
        },
    }


def main() -> int:
    console = Console()
    review = sample_review()
    pod = review["request"]["object"]
    with (
        tempfile.TemporaryDirectory(prefix="sparkgate-tryout-") as tmp,
        LocalWebhook(EXAMPLE_POLICY, Path(tmp)) as webhook,
    ):
        console.print(f"[bold]webhook[/] running at {webhook.url} (gunicorn, TLS) with {EXAMPLE_POLICY.name}")
        request = urllib.request.Request(
            f"{webhook.url}/mutate",
            data=json.dumps(review).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, context=webhook.ssl_context(), timeout=10) as r:
            answer = json.loads(r.read())
    response = answer["response"]
    ops = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    mutated = apply_patch(pod, ops)
    console.print(
        f"pod [bold]{pod['metadata']['namespace']}/{pod['metadata']['name']}[/]: "
        f"allowed={response['allowed']}, {len(ops)} patch operations"
    )
    console.print(Syntax(json.dumps(ops, indent=2), "json", theme="ansi_dark"))
    spec = mutated["spec"]
    console.print("[bold]after admission[/]")
    console.print(f"  profile:          {mutated['metadata']['annotations'].get('sparkgate.io/profile')}")
    console.print(f"  scheduling gates: {[g['name'] for g in spec.get('schedulingGates', [])]}")
    console.print(
        f"  labels added:     {sorted(set(mutated['metadata']['labels']) - set(pod['metadata']['labels']))}"
    )
    console.print("  the pod now waits for the sparkgate allocator to release it to the scheduler.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
