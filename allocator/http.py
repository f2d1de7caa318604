"""The allocator's HTTP endpoints: /healthz, /readyz, /metrics, /apps, /apps/<ns>/<app id>, and
POST /scheduler/filter and /scheduler/prioritize (the scheduler extender, allocator/extender.py).

- /healthz (the liveness probe): 503 when a watch or the loop made no progress for longer than the stall
  bound (health.py) or the lease was lost, naming what is stalled; 200 again once it moves.
- /readyz: 200 while every watch is current (listed, not failing), the deletion histories are loaded and a
  policy is in force.

A small threaded stdlib server: a handful of requests per scrape, no need for gunicorn in this process.
HTTP threads only read (see the threading model in loop.py).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST

from sparkgate.contract import AppKey

from .extender import VERBS, Extender
from .loop import Controller

if TYPE_CHECKING:
    from .probe import PolicyProbe

# An ExtenderArgs with 5,000 full Node objects (a scheduler that is not nodeCacheCapable) is a few MiB.
MAX_BODY = 16 * 1024 * 1024

log = logging.getLogger(__name__)


class _Listener(ThreadingHTTPServer):
    """socketserver's own `handle_error` prints "Exception occurred during processing of request from ..."
    and the traceback to stderr, outside the allocator's log format. A client gone away is a debug line;
    any other failure of a handler is logged with its traceback."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        # A client that went away before its answer was written (a ConnectionError: broken pipe, reset):
        # kube-scheduler giving up on the extender at its httpTimeout (500 ms in components/scheduler),
        # Prometheus at its scrape timeout.
        if isinstance(error, ConnectionError):
            log.debug("HTTP client %s went away before its answer: %s", client_address, error)
        else:
            log.exception("HTTP request from %s failed", client_address)


class StatusServer:
    def __init__(
        self,
        controller: Controller,
        extender: Extender,
        host: str,
        port: int,
        *,
        probe: PolicyProbe | None = None,
    ) -> None:
        self.controller = controller
        self.extender = extender
        self.probe = probe
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: kube-scheduler reuses its extender connections
            disable_nagle_algorithm = True  # no 40 ms delayed-ACK stall on a write after a write
            # A buffered writer: an answer's headers and body leave in one write when the handler returns
            # (handle_one_request flushes); unbuffered they were two sends, each a release of the GIL.
            wbufsize = 1 << 16

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                server.handle(self)

            def do_POST(self) -> None:
                server.handle_post(self)

        self._http = _Listener((host, port), Handler)
        self.port = self._http.server_address[1]
        self._thread = threading.Thread(target=self._http.serve_forever, name="allocator-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        path = urllib.parse.urlsplit(request.path).path.rstrip("/") or "/"
        c = self.controller
        if path == "/healthz":
            stalled = c.health.stalled()
            problems = [f"{part}: no progress for {seconds:.0f}s" for part, seconds in stalled.items()]
            if c.lost_lease.is_set():
                problems.append("lost the lease")
            body = ("\n".join(problems) or "ok") + "\n"
            _send(request, 503 if problems else 200, "text/plain", body.encode())
        elif path == "/readyz":
            ready = c.ready
            _send(
                request,
                200 if ready else 503,
                "text/plain",
                b"ok\n" if ready else b"a watch not current, histories not loaded, or no policy\n",
            )
        elif path == "/metrics":
            _send(request, 200, CONTENT_TYPE_LATEST, c.metrics.exposition())
        elif path == "/apps":
            apps = c.apps()
            for app in apps["apps"]:
                key = AppKey(app["namespace"], app["appId"])
                app["excludedNodes"] = self.extender.app_document(key, app.get("profile"))
            if self.probe is not None:  # the leader's policy probe, per namespace (allocator/probe.py)
                apps["policyProbe"] = self.probe.document
            _send(request, 200, "application/json", json.dumps(apps).encode())
        elif path.startswith("/apps/") and path.count("/") == 3:
            _, _, namespace, app_id = path.split("/")
            document = c.app(urllib.parse.unquote(namespace), urllib.parse.unquote(app_id))
            if document is None:
                _send(
                    request,
                    404,
                    "application/json",
                    json.dumps({"error": f"no app {namespace}/{app_id}"}).encode(),
                )
            else:
                key = AppKey(document["namespace"], document["appId"])
                document["excludedNodes"] = self.extender.app_document(key, document.get("profile"))
                _send(request, 200, "application/json", json.dumps(document).encode())
        else:
            _send(request, 404, "text/plain", b"not found: try /apps, /metrics, /healthz, /readyz\n")

    def handle_post(self, request: BaseHTTPRequestHandler) -> None:
        path = urllib.parse.urlsplit(request.path).path.rstrip("/")
        verb = path.removeprefix("/scheduler/")
        try:
            length = int(request.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            request.close_connection = True  # the body, if any, is not read: the connection cannot be reused
            message = f"sparkgate: Content-Length must be a number of bytes up to {MAX_BODY}"
            _send(
                request,
                400 if length < 0 else 413,
                "application/json",
                json.dumps({"Error": message}).encode(),
            )
            return
        body = request.rfile.read(length) if length > 0 else b""
        if not path.startswith("/scheduler/") or verb not in VERBS:
            _send(request, 404, "text/plain", b"not found: POST /scheduler/filter or /scheduler/prioritize\n")
            return
        code, answer = self.extender.handle(verb, body)
        _send(request, code, "application/json", answer)


def _send(request: BaseHTTPRequestHandler, code: int, content_type: str, body: bytes) -> None:
    request.send_response(code)
    request.send_header("Content-Type", content_type)
    request.send_header("Content-Length", str(len(body)))
    request.end_headers()
    request.wfile.write(body)
