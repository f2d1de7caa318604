"""The real webhook as a local process: throwaway TLS, gunicorn on a free loopback port.

The try-out, the demo, the benchmarks and the tests all need the production server exactly as a container
runs it (`sparkgate webhook`), reachable over verified HTTPS. This starts it in its own process group and
stops the whole group, so nothing is left behind.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from certs.pki import KeyPair, make_ca, make_serving_cert


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_serving_cert(cert_dir: Path, ca: KeyPair, now: dt.datetime, lifetime: dt.timedelta) -> KeyPair:
    """A serving certificate for loopback signed by `ca`, written atomically as tls.crt / tls.key."""
    pair = make_serving_cert(ca, ["localhost"], now, lifetime, ip_addresses=("127.0.0.1",))
    cert_dir.mkdir(parents=True, exist_ok=True)
    for name, data in (("tls.key", pair.key_pem), ("tls.crt", pair.cert_pem)):
        tmp = cert_dir / f".{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, cert_dir / name)
    return pair


class LocalWebhook:
    """`with LocalWebhook(policy, workdir) as w:` — w.url, w.ca_pem, w.ssl_context() while it runs."""

    def __init__(
        self,
        policy: Path,
        workdir: Path,
        *,
        workers: int = 1,
        threads: int = 4,
        allocator_users: tuple[str, ...] = (),
        log_file: Path | None = None,
        startup_timeout: float = 30.0,
    ) -> None:
        self.policy = policy
        self.workdir = workdir
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.cert_dir = workdir / "tls"
        now = dt.datetime.now(dt.UTC)
        self.ca = make_ca("sparkgate-local-ca", now, dt.timedelta(days=1))
        write_serving_cert(self.cert_dir, self.ca, now, dt.timedelta(days=1))
        self.ca_pem = self.ca.cert_pem
        self._workers = workers
        self._threads = threads
        self._allocator_users = allocator_users
        self._log_file = log_file or workdir / "webhook.log"
        self._startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem.decode())

    def start(self) -> None:
        args = [
            sys.executable,
            "-m",
            "sparkgate.cli",
            "webhook",
            "--bind",
            f"127.0.0.1:{self.port}",
            "--cert-dir",
            str(self.cert_dir),
            "--policy",
            str(self.policy),
            "--workers",
            str(self._workers),
            "--threads",
            str(self._threads),
            "--log-level",
            "warning",
        ]
        for user in self._allocator_users:
            args += ["--allocator-user", user]
        env = dict(os.environ)
        env["PROMETHEUS_MULTIPROC_DIR"] = str(self.workdir / "metrics")
        (self.workdir / "metrics").mkdir(exist_ok=True)
        with open(self._log_file, "ab") as log:
            self._process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        # Startup has no event to wait on: ask /readyz until it answers or the process dies.
        deadline = time.monotonic() + self._startup_timeout
        context = self.ssl_context()
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"the webhook exited with {self._process.returncode}: see {self._log_file}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", context=context, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the webhook did not become ready: see {self._log_file}")
            time.sleep(0.05)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def __enter__(self) -> LocalWebhook:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
