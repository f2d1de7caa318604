"""The webhook's HTTP surface: a Flask app doing JSON in and out around the pure mutation.

`POST /mutate` and `POST /validate` take and return AdmissionReview `admission.k8s.io/v1`, echoing the
request uid. A body that is not an AdmissionReview gets a 400 (413 when over 8 MiB, 408 when the client
stops sending it for BODY_TIMEOUT) whose text says what is wrong; an unexpected error while mutating gives
"allowed, no patch", a log line naming the pod, and a metric, because a denied executor pod is an executor
failure to Spark (docs/architecture.md).
"""

from __future__ import annotations

import binascii
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import ClientDisconnected

from sparkgate import contract
from sparkgate.mutation import mutate, validate_update
from sparkgate.mutation.patch import Operation
from sparkgate.policy_file import PolicySource

from . import metrics
from .review import BODY_TIMEOUT, MAX_BODY, BadReview, parse_review, review_response

log = logging.getLogger(__name__)


def create_app(
    policy: PolicySource,
    allocator_users: frozenset[str] = frozenset({contract.ALLOCATOR_USER}),
    clock: Callable[[], float] = time.perf_counter,
) -> Flask:
    app = Flask("sparkgate-webhook")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY

    def admission(endpoint: str, handle: Callable[[dict[str, Any]], tuple[str, dict[str, Any]]]) -> Response:
        started = clock()
        try:
            if request.content_length is not None and request.content_length > MAX_BODY:
                return _refuse(endpoint, 413, f"the body is larger than {MAX_BODY} bytes")
            try:
                body = _read_body()
            except ClientDisconnected:
                return _refuse(
                    endpoint,
                    408,
                    f"the body did not arrive: nothing came for {BODY_TIMEOUT:g} s, or the client left",
                )
            if len(body) > MAX_BODY:
                return _refuse(endpoint, 413, f"the body is larger than {MAX_BODY} bytes")
            try:
                req = parse_review(body)
            except BadReview as e:
                return _refuse(endpoint, 400, str(e))
            outcome, response = handle(req)
            metrics.requests(endpoint, outcome).inc()
            return _answer(req["uid"], response)
        finally:
            metrics.latency(endpoint).observe(clock() - started)

    def handle_mutate(req: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        current = policy.current()
        if current is None:
            log.error("no valid policy loaded; admitting %s unchanged", _pod_ref(req))
            return "error", {"allowed": True}
        try:
            result = mutate(req, current)
            return result.outcome.value, _patched(result.ops)
        except Exception:
            log.exception("mutating %s failed; admitting it unchanged", _pod_ref(req))
            return "error", {"allowed": True}

    def handle_validate(req: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        allowed, message = validate_update(req, allocator_users)
        if allowed:
            return "allowed", {"allowed": True}
        log.info("refused gate removal on %s", _pod_ref(req))
        return "denied", {
            "allowed": False,
            "status": {"code": 403, "reason": "Forbidden", "message": message},
        }

    @app.post("/mutate")
    def mutate_view() -> Response:
        return admission("mutate", handle_mutate)

    @app.post("/validate")
    def validate_view() -> Response:
        return admission("validate", handle_validate)

    @app.get("/healthz")
    def healthz() -> Response:
        return Response("ok\n", mimetype="text/plain")

    @app.get("/readyz")
    def readyz() -> Response:
        if policy.current() is None:
            return Response(f"no valid policy loaded: {policy.last_error}\n", 503, mimetype="text/plain")
        return Response("ok\n", mimetype="text/plain")

    @app.get("/metrics")
    def metrics_view() -> Response:
        # The policy file checked here too (its gauges and counts are set by the reload hook): an idle
        # webhook, with no admission to check it, still counts a refused edit within a scrape interval.
        policy.current()
        body, content_type = metrics.exposition()
        return Response(body, content_type=content_type)

    @app.errorhandler(413)
    def too_large(_: Exception) -> Response:
        return _refuse(request.path.strip("/") or "unknown", 413, f"the body is larger than {MAX_BODY} bytes")

    return app


def _read_body() -> bytes:
    """The request body. Under gunicorn, each read waits at most BODY_TIMEOUT: gunicorn's own `timeout`
    does not cover a thread blocked on a client that stopped sending (its main thread still heartbeats)."""
    sock = request.environ.get("gunicorn.socket")
    if sock is not None:
        sock.settimeout(BODY_TIMEOUT)
    return request.get_data(cache=False)


def _refuse(endpoint: str, status: int, message: str) -> Response:
    metrics.requests(endpoint, "bad_request").inc()
    return Response(message + "\n", status, mimetype="text/plain")


class _Encoder:
    """json.JSONEncoder's text, from the C encoder it builds made once: JSONEncoder.encode makes that encoder
    (and a closure) again at every call, ~1 µs, as much as the encoding of a small patch. It keeps no state
    between calls; no markers: a parsed review has no cycles."""

    def __init__(self, item_separator: str, key_separator: str, allow_nan: bool) -> None:
        self._encode = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
            None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii,
            None, key_separator, item_separator, False, False, allow_nan,
        )  # fmt: skip

    def encode(self, document: Any) -> str:
        return "".join(self._encode(document, 0))


# The patch as json.dumps writes it by default; allow_nan=False: NaN and Infinity are no JSON, and the API
# server would refuse the patch. The response as compact as JSON goes.
_PATCH_JSON = _Encoder(", ", ": ", allow_nan=False)
_RESPONSE_JSON = _Encoder(",", ":", allow_nan=True)


def _patched(ops: list[Operation]) -> dict[str, Any]:
    """The response admitting a pod with `ops` applied (none: as it is); the patch as base64 bytes."""
    response: dict[str, Any] = {"allowed": True}
    if ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = binascii.b2a_base64(_PATCH_JSON.encode(ops).encode(), newline=False)
    return response


def _answer(uid: str, response: dict[str, Any]) -> Response:
    """The AdmissionReview answering `uid`. Its `patch` (base64, as bytes) is written as the response's last
    member without the encoder: base64's alphabet (letters, digits, `+`, `/`, `=`) needs no JSON escape, so
    its JSON is the text in quotes, and the encoder's escape scan of ~1.4 KB cost as much as the rest of the
    answer (~40 k instructions)."""
    patch = response.get("patch")
    if patch is not None:
        response = dict(response)
        del response["patch"]
    body = _RESPONSE_JSON.encode(review_response(uid, response)).encode()
    if patch is not None:  # the document ends with the response's `}` and its own
        body = b"".join((body[:-2], b',"patch":"', patch, b'"}}'))
    return Response(body, mimetype="application/json")


def _pod_ref(req: dict[str, Any]) -> str:
    obj = req.get("object") or req.get("oldObject") or {}
    meta = obj.get("metadata") or {} if isinstance(obj, dict) else {}
    name = req.get("name") or meta.get("name") or meta.get("generateName", "") + "*"
    return f"pod {req.get('namespace') or meta.get('namespace', '')}/{name}"
