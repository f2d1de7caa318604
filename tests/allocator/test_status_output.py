"""`sparkgate status` prints the allocator's /apps document readably where there is no terminal (the runbook
runs it through `kubectl exec`, and a pipe once cut it to 80 columns: `nam…`, `pro…`), with `-o` as
kubectl has it. The command fetches the document over real HTTP from a loopback server serving it, as it
would from the allocator's /apps, and its output goes to pytest's capture, which is no terminal."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from allocator.status_output import render
from sparkgate.cli import main

LONG_NAMESPACE = "analytics-nightly-batch-processing-team-emea"
LONG_APP = "spark-5c447e3f0b8e4a6f9d2b1c0a7e6f5d4c-etl-nightly-aggregation"
DOCUMENT: dict[str, Any] = {
    "apps": [
        {
            "namespace": LONG_NAMESPACE,
            "appId": LONG_APP,
            "profile": "analytics-high-memory-profile",
            "gated": 165,
            "inFlight": 7,
            "running": 24,
            "failed": 2,
            "bypassed": 1,
            "limits": {
                "batchSize": 10,
                "batchDelaySeconds": 1.0,
                "maxPendingPerApp": 12,
                "unschedulableSeconds": 60.0,
            },
            "pacing": {"window": 10, "reason": "unschedulable", "unanswered": 1},
            "unschedulable": {"inFlight": 6, "overdue": 0},
            "waitingFor": "previous batch not yet bound (1 pods)",
            "driver": {"name": "etl-driver", "phase": "Running"},
            "deletions": {"failed": 2, "deleted_while_gated": 80},
            "backoff": {"failures": 3, "retryInSeconds": 0.4},
            "excludedNodes": [
                {
                    "node": "node-3",
                    "message": "sparkgate: 7 executors failed here in the last 10m (OOMKilled \u00d77)",
                }
            ],
        },
        {
            "namespace": "spark",
            "appId": "app-2",
            "profile": None,
            "gated": 0,
            "inFlight": 0,
            "running": 3,
            "failed": 0,
            "bypassed": 0,
            "limits": None,
            "waitingFor": None,
            "driver": None,
            "deletions": {},
            "backoff": None,
        },
    ],
    "cluster": {"inFlight": 7, "maxPendingCluster": 12, "gated": 165},
    "leader": True,
    "identity": "sparkgate-7d9f-abcde",
}


@pytest.fixture
def allocator_url() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(DOCUMENT).encode() if self.path == "/apps" else b"not found"
            self.send_response(200 if self.path == "/apps" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=30)


def status(url: str, capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    assert main(["status", "--url", url, *args]) == 0
    out: str = capsys.readouterr().out
    return out.splitlines()


def columns(line: str) -> list[str]:
    return [cell.strip() for cell in line.split("   ") if cell.strip()]


def test_the_table_is_never_cut_without_a_terminal(
    allocator_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = status(allocator_url, capsys)
    header, first, second = lines[:3]
    assert columns(header) == [
        "NAMESPACE",
        "APP ID",
        "PROFILE",
        "GATED",
        "IN FLIGHT",
        "RUNNING",
        "FAILED",
        "LIMITS",
        "WINDOW",
        "WAITING FOR",
    ]
    assert columns(first) == [
        LONG_NAMESPACE,
        LONG_APP,
        "analytics-high-memory-profile",
        "165",
        "7 (6 unschedulable)",
        "24",
        "2",
        "batch 10, max 12, unschedulable 60s",
        "10 (unschedulable, 1 unanswered)",
        "previous batch not yet bound (1 pods)",
    ]
    assert len(first) > 200 and "…" not in "\n".join(lines)
    assert columns(second) == ["spark", "app-2", "-", "0", "0", "3", "0", "-", "-", "-"]
    # Columns line up: each header starts where its cells do.
    assert first.index(LONG_APP) == header.index("APP ID") == second.index("app-2")
    assert lines[3:] == ["", "allocator sparkgate-7d9f-abcde (leader); cluster: 7 in flight of 12, 165 gated"]


def test_a_provisioning_class_the_api_server_does_not_serve_is_said() -> None:
    document = {
        "apps": [],
        "cluster": {},
        "leader": True,
        "identity": "a",
        "provisioningRequests": "not served",
    }
    assert (
        render(document, "table")
        .splitlines()[-1]
        .startswith(
            "ProvisioningRequests (autoscaling.x-k8s.io/v1) are not served: a profile's `provisioning` class is not "
            "used"
        )
    )
    for said in ("served", "not used"):
        assert "ProvisioningRequests" not in render({**document, "provisioningRequests": said}, "table")


def test_wide_adds_the_driver_deletions_backoff_and_refused_nodes(
    allocator_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    header, first, second = status(allocator_url, capsys, "-o", "wide")[:3]
    assert columns(header)[10:] == ["BYPASSED", "DRIVER", "DELETIONS", "BACKOFF", "REFUSED NODES"]
    assert columns(first)[10:] == [
        "1",
        "etl-driver (Running)",
        "failed=2, deleted_while_gated=80",
        "3 failed, retry in 0.4s",
        "node-3: 7 executors failed here in the last 10m (OOMKilled \u00d77)",
    ]
    assert columns(second)[10:] == ["0", "-", "-", "-", "-"]


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_json_and_yaml_are_the_document_as_served(
    allocator_url: str, capsys: pytest.CaptureFixture[str], output: str
) -> None:
    text = "\n".join(status(allocator_url, capsys, "-o", output))
    assert (json.loads(text) if output == "json" else yaml.safe_load(text)) == DOCUMENT


def test_no_applications_and_an_unknown_format(
    allocator_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from allocator.status_output import render

    empty = {**DOCUMENT, "apps": [], "leader": False, "cluster": {"inFlight": 0, "maxPendingCluster": 12}}
    assert render(empty, "table").splitlines()[0] == "No applications."
    assert "(follower)" in render(empty, "table")
    with pytest.raises(SystemExit):
        main(["status", "--url", allocator_url, "-o", "xml"])
    assert "invalid choice: 'xml'" in capsys.readouterr().err
