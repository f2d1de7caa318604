"""The webhook under gunicorn, over TLS, as the container runs it.

Settings (docs/architecture.md, "Decisions"): `gthread` workers, because the
API server reuses idle HTTP/1.1 connections and `sync` closes every one; keep-alive above the API server's
90 s idle timeout so the client closes first; an `ssl_context` hook that caches the context per certificate
file identity, so a rotated certificate (a Secret volume swaps a symlink) is served to the next new
connection without a restart and without re-reading the files per connection, and that keeps serving the
last good one when new files do not load (each worker loads its first as it starts); prometheus-client's
multiprocess directory wiped before the first fork and dead workers marked; no control socket (gunicorn
25.1+ opens one under $HOME for `gunicornc` by default, which the image's read-only root refuses with an
error at every start, and nothing in the pod would use it).
"""

from __future__ import annotations

import logging
import os
import shutil
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from gunicorn.app.base import BaseApplication

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerOptions:
    bind: str
    cert_dir: str
    policy: str
    install_namespace: str
    allocator_users: frozenset[str]
    workers: int = 2
    threads: int = 4
    keepalive: int = 120
    graceful_timeout: int = 20
    log_level: str = "info"

    @property
    def certfile(self) -> str:
        return os.path.join(self.cert_dir, "tls.crt")

    @property
    def keyfile(self) -> str:
        return os.path.join(self.cert_dir, "tls.key")


class CachedSSLContext:
    """gunicorn's `ssl_context` hook: one context per (cert, key) file identity, rebuilt when they change.

    A context that cannot be built (a bad file, or a Secret volume swapped between the two opens of
    load_cert_chain) is logged, and the last good one stays in service until the files change again: failing
    it would fail every new connection. The first is loaded as the worker starts (_post_worker_init); there,
    a failure is raised, as there is nothing to serve."""

    def __init__(self, on_load: Callable[[str], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._key: tuple[tuple[int, int, int] | None, ...] | None = None
        self._context: ssl.SSLContext | None = None
        self._on_load = on_load

    def __call__(self, conf: Any, default_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        key = tuple(_identity(path) for path in (conf.certfile, conf.keyfile))
        with self._lock:
            if self._context is None or key != self._key:
                self._key = key
                try:
                    self._context = default_factory()
                except OSError as e:  # ssl.SSLError included
                    if self._context is None:
                        raise
                    log.error(
                        "cannot load the serving certificate %s: %s; serving the previous one until the "
                        "files change again",
                        conf.certfile,
                        e,
                    )
                else:
                    if self._on_load is not None:
                        self._on_load(conf.certfile)
            return self._context


def _identity(path: str) -> tuple[int, int, int] | None:
    """The file's identity; None when it cannot be read (loading it then fails and says why)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def certificate_not_after(certfile: str) -> float:
    with open(certfile, "rb") as f:
        return x509.load_pem_x509_certificate(f.read()).not_valid_after_utc.timestamp()


def _record_expiry(certfile: str) -> None:
    from . import metrics

    try:
        metrics.CERT_EXPIRY.set(certificate_not_after(certfile))
    except (OSError, ValueError) as e:
        log.warning("cannot read the serving certificate %s: %s", certfile, e)


def _on_starting(server: Any) -> None:
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory, exist_ok=True)


def _post_worker_init(worker: Any) -> None:
    """Load the serving certificate as the worker starts, not at its first connection, so that every worker
    has a context to keep serving should a rotated one fail to load. At the webhook's start (the first
    `workers` workers) one that cannot fails to boot, and gunicorn stops: nothing could serve a connection.
    A worker started later (one that replaced a dead one) logs it and tries again at each connection: a boot
    error there would halt gunicorn and take the other workers, serving their last good pair, with it.
    (`gunicorn.sock.ssl_context` is gunicorn's own hook caller, which its other workers use; a gunicorn
    without it fails every worker's boot, loudly.)"""
    from gunicorn.sock import ssl_context

    try:
        ssl_context(worker.cfg)
    except OSError as e:  # ssl.SSLError included
        if worker.age <= worker.cfg.workers:
            raise
        log.error(
            "worker %s cannot load the serving certificate: %s; trying again at each connection",
            worker.pid,
            e,
        )


def _child_exit(server: Any, worker: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]


def gunicorn_settings(options: ServerOptions) -> dict[str, Any]:
    return {
        "bind": [options.bind],
        "certfile": options.certfile,
        "keyfile": options.keyfile,
        "worker_class": "gthread",
        "workers": options.workers,
        "threads": options.threads,
        "keepalive": options.keepalive,
        "timeout": 30,
        "graceful_timeout": options.graceful_timeout,
        "loglevel": options.log_level,
        "accesslog": None,
        "errorlog": "-",
        "on_starting": _on_starting,
        "post_worker_init": _post_worker_init,
        "child_exit": _child_exit,
        "ssl_context": CachedSSLContext(on_load=_record_expiry),
        "proc_name": "sparkgate-webhook",
        "control_socket_disable": True,
    }


class WebhookServer(BaseApplication):  # type: ignore[misc]
    """gunicorn run programmatically: the process a container runs is this one, no shell in between."""

    def __init__(self, options: ServerOptions, app_factory: Callable[[], Any] | None = None) -> None:
        self.options = options
        self._app_factory = app_factory
        super().__init__()

    def load_config(self) -> None:
        for key, value in gunicorn_settings(self.options).items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        if self._app_factory is not None:
            return self._app_factory()
        return build_app(self.options)


def build_app(options: ServerOptions) -> Any:
    from sparkgate.policy_file import PolicySource

    from . import metrics
    from .app import create_app

    source = PolicySource(options.policy, options.install_namespace, on_reload=metrics.on_reload)
    source.current()
    return create_app(source, options.allocator_users)
