"""The admission-policy mode's one writer: the rendered MutatingAdmissionPolicy follows the policy in force.

In the install without the webhook (manifests/components/admission-policy; docs/install.md) the API server
shapes and gates executor pods itself, with the MutatingAdmissionPolicy and binding that sparkgate/render.py
writes from the policy. The allocator's leader keeps those two cluster-scoped objects equal to the rendering
of the policy its PolicySource holds: when the policy ConfigMap changes (the source reloads the file; a bad
document is refused and the last good policy stays, so do its objects) and every `interval` seconds, which
also repairs a hand edit. Each object is written by server-side apply only, with the allocator's field
manager and `force` (sparkgate owns them): an apply creates the object when it is missing (the API server
authorizes `create` on its name then: handlers/patch.go), an apply that changes nothing writes nothing (the
API server's no-op detection), a field another manager added is kept, and a field a later version stops
rendering is pruned, since the allocator's Apply entry is its only manager. (Created by a POST, the object
had an `Update` entry of the allocator's owning every field, and a field dropped from the rendering stayed.)
A policy that cannot be rendered within the API server's limits (sparkgate/render.py: RenderError) leaves
the objects in force as they are; the run is an error
(`sparkgate_allocator_task_runs_total{task="admission-policy",result="error"}`) with the reason in the log,
and is tried again at the next change or interval. API faults are retried by Kube.request with backoff (an
apply is safe to repeat).

Threading: one LeaderTask thread (allocator/commands.py) calls `run_if_due`; `_applied` is its own.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from sparkgate import contract
from sparkgate.kube import Kube
from sparkgate.policy_file import PolicySource
from sparkgate.render import POLICY_NAME, render

log = logging.getLogger(__name__)

TASK = "admission-policy"
FIELD_MANAGER = "sparkgate-allocator"
APPLY = "application/apply-patch+yaml"  # JSON is YAML
DEFAULT_INTERVAL = 60.0
POLICIES = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings"
_APPLY_QUERY = {"fieldManager": FIELD_MANAGER, "force": True}


class AdmissionPolicySync:
    def __init__(
        self,
        kube: Kube,
        policy: PolicySource,
        install_namespace: str = contract.INSTALL_NAMESPACE,
        *,
        interval: float = DEFAULT_INTERVAL,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.policy = policy
        self.namespace = install_namespace
        self.interval = interval
        self._monotonic = monotonic
        self._applied: tuple[str, float] | None = None  # (policy digest, monotonic time) of the last run

    def due(self) -> bool:
        policy = self.policy.current()
        if policy is None:
            return False
        return (
            self._applied is None
            or self._applied[0] != policy.digest
            or self._monotonic() - self._applied[1] >= self.interval
        )

    def run_if_due(self) -> bool:
        """Apply when the policy changed or the interval has passed; False when it was not due (a poll, not a
        run: LeaderTask counts runs)."""
        if not self.due():
            return False
        self.run_once()
        return True

    def run_once(self) -> list[dict[str, Any]]:
        """Apply the rendering of the policy in force; the objects as the API server returned them."""
        policy = self.policy.current()
        if policy is None:
            return []
        # Marked before rendering: a policy that cannot be rendered is tried again at the interval, not
        # at every poll.
        self._applied = (policy.digest, self._monotonic())
        policy_object, binding = render(policy, self.namespace).objects  # RenderError: the objects stay
        # The policy before the binding that names it; the paths are literal for tests/manifests/test_rbac.py.
        out = [
            self.kube.request(
                "PATCH",
                f"{POLICIES}/{POLICY_NAME}",
                query=_APPLY_QUERY,
                body=json.dumps(policy_object),
                content_type=APPLY,
            ),
            self.kube.request(
                "PATCH",
                f"{BINDINGS}/{POLICY_NAME}",
                query=_APPLY_QUERY,
                body=json.dumps(binding),
                content_type=APPLY,
            ),
        ]
        log.info("admission policy %s applied for policy %s", POLICY_NAME, policy.digest)
        return out
