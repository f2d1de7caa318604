"""The policy file on disk, reloaded when it changes, keeping the last good policy in force.

Both the webhook and the allocator read the policy from a ConfigMap volume. Kubernetes updates such a
volume by swapping a `..data` symlink, so the file's own path keeps its name while the resolved file
changes: the check looks at the resolved file's identity (device, inode, mtime, size). A new document that
does not load is refused with its error kept and reported once (each refused file, even one failing with
the same error as the last); the previous policy stays in force. Any exception from loading is a refusal:
an unexpected one (a defect of the loader) is logged with its traceback, never raised to the caller.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from .policy import Policy, PolicyError, load_policy

log = logging.getLogger(__name__)

ReloadHook = Callable[[str, "str | None"], None]


class PolicySource:
    def __init__(
        self,
        path: str,
        install_namespace: str,
        clock: Callable[[], float] = time.monotonic,
        check_interval: float = 1.0,
        on_reload: ReloadHook | None = None,
    ) -> None:
        self.path = path
        self.install_namespace = install_namespace
        self._clock = clock
        self._check_interval = check_interval
        self._on_reload = on_reload
        self._lock = threading.Lock()
        self._policy: Policy | None = None
        self._identity: tuple[int, int, int, int] | None = None
        self._checked_at: float | None = None
        self.generation = 0
        self.last_error: str | None = None

    def current(self) -> Policy | None:
        """The policy in force; re-checks the file at most every `check_interval` seconds."""
        now = self._clock()
        if self._checked_at is not None and now - self._checked_at < self._check_interval:
            return self._policy
        with self._lock:
            if self._checked_at is None or now - self._checked_at >= self._check_interval:
                self._checked_at = now
                self._check()
            return self._policy

    def _check(self) -> None:
        try:
            st = os.stat(self.path)  # follows the ConfigMap volume's symlinks
            identity = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            if identity == self._identity:
                return
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            self._refuse(identity=None, error=f"cannot read {self.path}: {e.strerror or e}")
            return
        try:
            policy = load_policy(text, self.install_namespace)
        except PolicyError as e:
            self._refuse(identity, "; ".join(e.errors))
            return
        except Exception as e:
            self._refuse(identity, f"{type(e).__name__}: {e}", exc=e)
            return
        self._identity = identity
        self._policy = policy
        self.generation += 1
        self.last_error = None
        log.info("policy %s loaded (generation %d, digest %s)", self.path, self.generation, policy.digest)
        if self._on_reload is not None:
            self._on_reload("success", None)

    def _refuse(
        self, identity: tuple[int, int, int, int] | None, error: str, exc: Exception | None = None
    ) -> None:
        """Refuse a file (None: one that cannot be read); reported once per file identity and error."""
        repeated = (identity, error) == (self._identity, self.last_error)
        self._identity = identity  # do not re-parse the same bad file every second
        self.last_error = error
        if repeated:
            return
        kept = "the last good policy stays in force" if self._policy else "no policy is in force yet"
        log.error("policy %s refused (%s): %s", self.path, kept, error, exc_info=exc)
        if self._on_reload is not None:
            self._on_reload("failure", error)
