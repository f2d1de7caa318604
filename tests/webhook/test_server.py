"""The webhook as production runs it: `sparkgate webhook` under gunicorn, over verified TLS."""

from __future__ import annotations

import base64
import datetime as dt
import http.client
import json
import logging
import os
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonpatch
import pytest
from cryptography import x509

from certs.pki import make_ca
from sandbox.local_webhook import LocalWebhook, write_serving_cert
from sparkgate import contract
from webhook.review import BODY_TIMEOUT
from webhook.server import CachedSSLContext, ServerOptions, _post_worker_init, build_app

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


def replace_file(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def test_a_certificate_that_does_not_load_leaves_the_last_good_one_served(webhook: LocalWebhook) -> None:
    """A bad file, or the kubelet's swap seen between the two opens of load_cert_chain, must not fail every
    new connection: the last good certificate is served until the files change again."""
    replace_file(
        webhook.cert_dir / "tls.crt", b"-----BEGIN CERTIFICATE-----\nnot one\n-----END CERTIFICATE-----\n"
    )
    for _ in range(3):  # new connections, to either worker: each serves the last certificate it loaded
        served_certificate(webhook)  # a handshake verified against the CA
    rotated = write_serving_cert(webhook.cert_dir, webhook.ca, dt.datetime.now(dt.UTC), dt.timedelta(hours=2))
    assert served_certificate(webhook).serial_number == rotated.certificate.serial_number


def test_a_failed_certificate_load_is_logged_and_retried_only_when_the_files_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca = make_ca("test-ca", dt.datetime.now(dt.UTC), dt.timedelta(days=1))
    write_serving_cert(tmp_path, ca, dt.datetime.now(dt.UTC), dt.timedelta(days=1))
    conf = SimpleNamespace(certfile=str(tmp_path / "tls.crt"), keyfile=str(tmp_path / "tls.key"))
    attempts: list[str] = []

    def load() -> ssl.SSLContext:
        attempts.append(conf.certfile)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(conf.certfile, conf.keyfile)
        return context

    loaded: list[str] = []
    cached = CachedSSLContext(on_load=loaded.append)
    good = cached(conf, load)
    replace_file(tmp_path / "tls.crt", b"garbage")
    with caplog.at_level(logging.ERROR, logger="webhook.server"):
        assert cached(conf, load) is good and cached(conf, load) is good
    assert len(attempts) == 2 and len(loaded) == 1
    assert caplog.text.count("cannot load the serving certificate") == 1
    write_serving_cert(tmp_path, ca, dt.datetime.now(dt.UTC), dt.timedelta(days=1))
    assert cached(conf, load) is not good and len(attempts) == 3 and len(loaded) == 2


def test_a_webhook_whose_certificate_does_not_load_at_the_start_exits(tmp_path: Path) -> None:
    """Each worker loads the certificate as it starts (so that it has one to fall back on): one that cannot
    stops gunicorn, rather than answering every TLS connection with a plain-text error."""
    w = LocalWebhook(POLICY, tmp_path, startup_timeout=20)
    replace_file(w.cert_dir / "tls.crt", b"not a certificate")
    with pytest.raises(RuntimeError, match="the webhook exited"):
        w.start()
    assert "Worker failed to boot" in (tmp_path / "webhook.log").read_text()


def test_a_replacement_worker_that_cannot_load_the_certificate_logs_it_and_does_not_halt_the_webhook(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker gunicorn starts to replace a dead one (its age past the first `workers`) while the files are
    bad: a boot error would halt the master and the workers still serving their last good pair; it logs and
    goes on. A first worker raises, as the test above shows through a real gunicorn."""
    replace_file(tmp_path / "tls.crt", b"not a certificate")
    (tmp_path / "tls.key").write_bytes(b"")
    cfg = SimpleNamespace(
        workers=2,
        certfile=str(tmp_path / "tls.crt"),
        keyfile=str(tmp_path / "tls.key"),
        ssl_context=CachedSSLContext(),
        ca_certs=None,
        cert_reqs=ssl.CERT_NONE,
        ciphers=None,
        ssl_version=ssl.PROTOCOL_TLS_SERVER,
        do_handshake_on_connect=False,
        suppress_ragged_eofs=True,
    )
    with pytest.raises(OSError):
        _post_worker_init(SimpleNamespace(age=2, pid=11, cfg=cfg))
    with caplog.at_level(logging.ERROR, logger="webhook.server"):
        _post_worker_init(SimpleNamespace(age=3, pid=12, cfg=cfg))
    assert "worker 12 cannot load the serving certificate" in caplog.text


def test_a_worker_boots_on_a_policy_that_breaks_the_loader_and_is_not_ready(tmp_path: Path) -> None:
    """It used to raise while booting: gunicorn's workers crash-looped instead of waiting for a good file."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "apiVersion: sparkgate.io/v1alpha1\nkind: Policy\nprofiles:\n- name: a\n  template: {metadata: [1]}\n"
    )
    options = ServerOptions("127.0.0.1:0", str(tmp_path), str(policy), "sparkgate-system", frozenset())
    answer = build_app(options).test_client().get("/readyz")
    assert answer.status_code == 503 and "profiles[0].template.metadata" in answer.get_data(as_text=True)


def sample(text: str, name: str) -> float:
    """The value of the series `name` (with its labels, if any) in a metrics document."""
    return next(float(line.split()[-1]) for line in text.splitlines() if line.split()[0] == name)


def test_every_scrape_reads_the_policy_loaded_from_every_worker(tmp_path: Path) -> None:
    """Each worker sets its gauges when it loads the policy; set at a scrape, they read 0 from the workers that
    had not answered one (the lowest over the workers is exported)."""
    with LocalWebhook(POLICY, tmp_path, workers=2) as w:
        read, deadline = 0, time.monotonic() + 30
        while read < 8:
            assert time.monotonic() < deadline, "the second worker did not load the policy"
            conn = connect(w)  # a new connection each time, so both workers answer some
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
            conn.close()
            if sample(text, 'sparkgate_webhook_policy_reloads_total{result="success"}') < 2:
                continue  # a worker still booting; it is counted once it has loaded (after its gauges)
            assert sample(text, "sparkgate_webhook_policy_loaded") == 1
            assert sample(text, "sparkgate_webhook_policy_generation") == 1
            read += 1


def test_clients_that_stop_mid_body_do_not_hold_the_threads(tmp_path: Path) -> None:
    """A gthread worker gives a connection a thread while it reads the request; a client that stopped sending
    its body held that thread for ever (gunicorn's `timeout` does not cover it). With every thread and one
    more connection stalled, /healthz still answers, and each stalled client gets a 408 and is closed."""
    threads, bound = 2, 4 * BODY_TIMEOUT
    with LocalWebhook(POLICY, tmp_path, workers=1, threads=threads) as w:
        context = w.ssl_context()
        stalled = []
        for _ in range(threads + 1):  # the last one's TLS handshake waits for a thread
            raw = socket.create_connection(("127.0.0.1", w.port), timeout=bound)
            tls = context.wrap_socket(raw, server_hostname="127.0.0.1")
            tls.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
            tls.sendall(b"Content-Length: 1000\r\n\r\n{")
            stalled.append(tls)
        conn = http.client.HTTPSConnection("127.0.0.1", w.port, context=context, timeout=bound)
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() == b"ok\n"
        for tls in stalled:
            answer = b""
            while chunk := tls.recv(4096):  # to the end: the server closes the connection after its answer
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408 ") and b"the body did not arrive" in answer
            tls.close()
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        assert sample(text, 'sparkgate_webhook_requests_total{endpoint="mutate",outcome="bad_request"}') == 3


def test_plain_http_is_refused(webhook: LocalWebhook) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", webhook.port, timeout=10)
    with pytest.raises((ConnectionError, http.client.HTTPException, ssl.SSLError, OSError)):
        conn.request("GET", "/healthz")
        conn.getresponse().read()
