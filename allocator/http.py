"""The allocator's HTTP endpoints: /healthz, /readyz, /metrics, /apps, /apps/<ns>/<app id>.

- /healthz (the liveness probe): 503 when a watch or the loop made no progress for longer than the stall
  bound (health.py) or the lease was lost, naming what is stalled; 200 again once it moves.
- /readyz: 200 while every watch is current (listed, not failing), the deletion histories are loaded and a
  policy is in force.

A small threaded stdlib server: a handful of requests per scrape, no need for gunicorn in this process.
HTTP threads only read (see the threading model in loop.py).
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .loop import Controller


class StatusServer:
    def __init__(self, controller: Controller, host: str, port: int) -> None:
        self.controller = controller
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                server.handle(self)

        self._http = ThreadingHTTPServer((host, port), Handler)
        self._http.daemon_threads = True
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
            _send(request, 200, CONTENT_TYPE_LATEST, generate_latest(c.metrics.registry))
        elif path == "/apps":
            _send(request, 200, "application/json", json.dumps(c.apps()).encode())
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
                _send(request, 200, "application/json", json.dumps(document).encode())
        else:
            _send(request, 404, "text/plain", b"not found: try /apps, /metrics, /healthz, /readyz\n")


def _send(request: BaseHTTPRequestHandler, code: int, content_type: str, body: bytes) -> None:
    request.send_response(code)
    request.send_header("Content-Type", content_type)
    request.send_header("Content-Length", str(len(body)))
    request.end_headers()
    request.wfile.write(body)
