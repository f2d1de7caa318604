"""`sparkgate status`: the allocator's `/apps` document, printed as kubectl prints objects.

`-o` as kubectl has it: a table by default (one line per application, columns padded to the widest cell and
never cut, whatever the terminal: the runbook's `kubectl exec ... sparkgate status` has none), `wide` for
more columns, `json` and `yaml` for the document as the allocator served it. Rendering is a pure function
of the document (`render`); `run_status` only fetches it. Every value comes from the allocator (a
follower's limits are whatever it reports, "-" when it has none).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from typing import Any

import yaml

OUTPUTS = ("table", "wide", "json", "yaml")
GAP = "   "  # between columns, as kubectl's printer


def _limits(app: dict[str, Any]) -> str:
    limits = app.get("limits") or {}
    batch, most = limits.get("batchSize"), limits.get("maxPendingPerApp")
    if batch is None and most is None:
        return "-"
    text = f"batch {'-' if batch is None else batch}, max {'-' if most is None else most}"
    refused = limits.get("unschedulableSeconds")
    return text if refused is None else f"{text}, unschedulable {refused:g}s"


def _in_flight(app: dict[str, Any]) -> str:
    """Its pods in flight, and how many of them the scheduler refused: `20 (10 unschedulable)`."""
    refused = app.get("unschedulable")
    return f"{app['inFlight']} ({refused['inFlight']} unschedulable)" if refused else str(app["inFlight"])


def _window(app: dict[str, Any]) -> str:
    """The pacing window and why it is what it is: `20 (slow-start, 3 unanswered)` (docs/policy.md, "Pacing")."""
    pacing = app.get("pacing")
    if not pacing:
        return ""
    waiting = f", {pacing['unanswered']} unanswered" if pacing.get("unanswered") else ""
    return f"{pacing['window']} ({pacing['reason']}{waiting})"


def _refused(app: dict[str, Any]) -> str:
    return "; ".join(
        e["message"].replace("sparkgate: ", f"{e['node']}: ") for e in app.get("excludedNodes") or []
    )


def _backoff(app: dict[str, Any]) -> str:
    backoff = app.get("backoff")
    return f"{backoff['failures']} failed, retry in {backoff['retryInSeconds']}s" if backoff else ""


def _driver(app: dict[str, Any]) -> str:
    driver = app.get("driver")
    return f"{driver['name']} ({driver['phase']})" if driver else ""


COLUMNS = (
    ("NAMESPACE", lambda a: a["namespace"]),
    ("APP ID", lambda a: a["appId"]),
    ("PROFILE", lambda a: a.get("profile") or ""),
    ("GATED", lambda a: str(a["gated"])),
    ("IN FLIGHT", _in_flight),
    ("RUNNING", lambda a: str(a["running"])),
    ("FAILED", lambda a: str(a["failed"])),
    ("LIMITS", _limits),
    ("WINDOW", _window),
    ("WAITING FOR", lambda a: a.get("waitingFor") or ""),
)
WIDE_COLUMNS = (
    ("BYPASSED", lambda a: str(a.get("bypassed", 0))),
    ("DRIVER", _driver),
    ("DELETIONS", lambda a: ", ".join(f"{k}={v}" for k, v in (a.get("deletions") or {}).items())),
    ("BACKOFF", _backoff),
    ("REFUSED NODES", _refused),
)


def table(rows: list[list[str]]) -> str:
    """Left-aligned columns, each as wide as its widest cell; an empty cell shows as "-"."""
    rows = [[cell or "-" for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(GAP.join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def render(document: dict[str, Any], output: str) -> str:
    """The text `sparkgate status -o output` prints for an `/apps` document."""
    if output == "json":
        return json.dumps(document, indent=2)
    if output == "yaml":
        return yaml.safe_dump(document, sort_keys=False).rstrip()
    columns = COLUMNS + (WIDE_COLUMNS if output == "wide" else ())
    apps = document.get("apps") or []
    lines = [table([[name for name, _ in columns]] + [[cell(app) for _, cell in columns] for app in apps])]
    if not apps:
        lines = ["No applications."]
    cluster = document.get("cluster") or {}
    role = "leader" if document.get("leader") else "follower"
    lines.append(
        f"\nallocator {document.get('identity', '')} ({role}); cluster: {cluster.get('inFlight')} in flight "
        f"of {cluster.get('maxPendingCluster')}, {cluster.get('gated')} gated"
    )
    if document.get("provisioningRequests") == "not served":
        lines.append(
            "ProvisioningRequests (autoscaling.x-k8s.io/v1) are not served: a profile's `provisioning` class is "
            "not used, held executors are shown to the autoscaler by their condition alone"
        )
    return "\n".join(lines)


def run_status(args: argparse.Namespace) -> int:
    try:
        with urllib.request.urlopen(args.url.rstrip("/") + "/apps", timeout=10) as r:
            document = json.loads(r.read())
    except OSError as e:
        print(f"cannot reach the allocator at {args.url}: {e}", file=sys.stderr)
        return 1
    print(render(document, args.output))
    return 0
