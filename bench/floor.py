"""The admission floor: the webhook's server with sparkgate taken out.

The same gunicorn/TLS configuration as `sparkgate webhook` (webhook/server.py's settings: gthread workers,
keep-alive, the cached ssl_context hook, the prometheus multiprocess directory), serving a Flask handler that
reads the AdmissionReview as strictly as the webhook does and answers "allowed" with no patch. What the real
webhook costs beyond this is sparkgate's own work: the policy, the mutation, the patch and the metrics.

    python -m bench.floor --bind 127.0.0.1:8443 --cert-dir DIR    (what FloorServer starts)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from flask import Flask, Response, request

from sandbox.local_webhook import LocalWebhook
from webhook.review import BadReview, parse_review, review_response

REPO = Path(__file__).resolve().parents[1]


def create_floor_app() -> Flask:
    app = Flask("sparkgate-floor")

    @app.post("/mutate")
    def mutate() -> Response:
        try:
            req = parse_review(request.get_data(cache=False))
        except BadReview as e:
            return Response(f"{e}\n", 400, mimetype="text/plain")
        document = review_response(req["uid"], {"allowed": True})
        return Response(json.dumps(document, separators=(",", ":")), mimetype="application/json")

    @app.get("/readyz")
    def readyz() -> Response:
        return Response("ok\n", mimetype="text/plain")

    return app


class FloorServer(LocalWebhook):
    """LocalWebhook's process, TLS and readiness wait, running `python -m bench.floor` instead."""

    def start(self) -> None:
        args = [
            sys.executable,
            "-m",
            "bench.floor",
            "--bind",
            f"127.0.0.1:{self.port}",
            "--cert-dir",
            str(self.cert_dir),
            "--workers",
            str(self._workers),
            "--threads",
            str(self._threads),
        ]
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(self.workdir / "metrics")}
        (self.workdir / "metrics").mkdir(parents=True, exist_ok=True)
        with open(self._log_file, "ab") as log:
            self._process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
            )
        self._wait_ready()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bind", required=True)
    parser.add_argument("--cert-dir", required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="sparkgate-floor-metrics-"))
    from webhook.server import ServerOptions, WebhookServer

    options = ServerOptions(
        bind=args.bind,
        cert_dir=args.cert_dir,
        policy="",
        install_namespace="",
        allocator_users=frozenset(),
        workers=args.workers,
        threads=args.threads,
        log_level=args.log_level,
    )
    WebhookServer(options, app_factory=create_floor_app).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
