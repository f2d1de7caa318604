"""The webhook as production runs it: `sparkgate webhook` under gunicorn, over verified TLS."""

from __future__ import annotations

import base64
import datetime as dt
import http.client
import json
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from cryptography import x509

from sandbox.local_webhook import LocalWebhook, write_serving_cert
from sparkgate import contract

from ..sparkgate.mutation.test_mutation import executor, request_for

POLICY = Path(__file__).parents[2] / "manifests" / "components" / "example-policy" / "policy.yaml"


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalWebhook]:
    with LocalWebhook(POLICY, tmp_path_factory.mktemp("webhook"), workers=2) as w:
        yield w


def post(conn: http.client.HTTPSConnection, path: str, body: Any) -> tuple[int, Any]:
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    data = answer.read()
    return answer.status, json.loads(data) if answer.getheader("Content-Type", "").startswith(
        "application/json"
    ) else data.decode()


def connect(w: LocalWebhook) -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection("127.0.0.1", w.port, context=w.ssl_context(), timeout=10)


def test_every_captured_review_is_admitted_with_a_patch_over_one_keep_alive_connection(
    webhook: LocalWebhook, reviews: dict[str, Any]
) -> None:
    conn = connect(webhook)
    for name, review in reviews.items():
        status, body = post(conn, "/mutate", review)
        assert status == 200, name
        response = body["response"]
        assert response["uid"] == review["request"]["uid"] and response["allowed"] is True
        pod = jsonpatch.apply_patch(
            review["request"]["object"], json.loads(base64.b64decode(response["patch"]))
        )
        assert {"name": contract.GATE} in pod["spec"]["schedulingGates"]
        assert pod["metadata"]["annotations"][contract.ANNOTATION_PROFILE] in ("analytics", "default")
        for key in contract.SPARK_LABELS & review["request"]["object"]["metadata"]["labels"].keys():
            assert pod["metadata"]["labels"][key] == review["request"]["object"]["metadata"]["labels"][key]
    conn.close()


def test_malformed_bodies_get_400_over_tls(webhook: LocalWebhook) -> None:
    conn = connect(webhook)
    conn.request("POST", "/mutate", body=b"nope", headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    assert answer.status == 400 and "not JSON" in answer.read().decode()


def test_gate_removal_is_refused_for_users_and_allowed_for_the_allocator(webhook: LocalWebhook) -> None:
    gated = executor(schedulingGates=[{"name": contract.GATE}])
    base = {**request_for(executor(), operation="UPDATE"), "oldObject": gated}
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
    conn = connect(webhook)
    _, body = post(conn, "/validate", {**review, "request": {**base, "userInfo": {"username": "mallory"}}})
    assert body["response"]["allowed"] is False
    allocator = "system:serviceaccount:sparkgate-system:sparkgate-allocator"
    _, body = post(conn, "/validate", {**review, "request": {**base, "userInfo": {"username": allocator}}})
    assert body["response"]["allowed"] is True


def test_metrics_are_aggregated_across_workers(webhook: LocalWebhook, reviews: dict[str, Any]) -> None:
    conn = connect(webhook)
    for _ in range(6):
        post(conn, "/mutate", reviews["adhoc-query-exec-1"])
        conn.close()  # a new connection each time, so both workers get some
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    mutated = [
        line
        for line in text.splitlines()
        if line.startswith('sparkgate_webhook_requests_total{endpoint="mutate",outcome="mutated"}')
    ]
    assert mutated and float(mutated[0].split()[-1]) >= 6
    assert "sparkgate_webhook_request_duration_seconds_bucket" in text
    assert "sparkgate_webhook_certificate_expiry_timestamp_seconds" in text


def served_certificate(w: LocalWebhook) -> x509.Certificate:
    context = w.ssl_context()
    with (
        socket.create_connection(("127.0.0.1", w.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def test_a_rotated_certificate_is_served_to_the_next_connection_without_a_restart(
    webhook: LocalWebhook,
) -> None:
    pid = webhook.pid
    before = served_certificate(webhook)
    kept_alive = connect(webhook)
    kept_alive.request("GET", "/healthz")
    assert kept_alive.getresponse().read() == b"ok\n"
    rotated = write_serving_cert(webhook.cert_dir, webhook.ca, dt.datetime.now(dt.UTC), dt.timedelta(hours=2))
    after = served_certificate(webhook)
    assert after.serial_number == rotated.certificate.serial_number != before.serial_number
    kept_alive.request("GET", "/healthz")  # the open connection keeps working
    assert kept_alive.getresponse().read() == b"ok\n"
    assert webhook.pid == pid


def test_plain_http_is_refused(webhook: LocalWebhook) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", webhook.port, timeout=10)
    with pytest.raises((ConnectionError, http.client.HTTPException, ssl.SSLError, OSError)):
        conn.request("GET", "/healthz")
        conn.getresponse().read()
