"""The policy probe as a leader task: a profile that the API server refuses is a page, not lost Spark jobs.

A `LeaderTask` under the allocator's Lease (wired in allocator/commands.py): while this allocator leads, it
runs sparkgate/probe.py (each profile's executor pod, created with
`dryRun=All` in every namespace the profile matches) when the policy in force changes and every `interval`
seconds, because what the API server admits also changes without the policy changing: a PriorityClass
deleted, a namespace relabelled for PodSecurity, a quota tightened. Each result is exported as
`sparkgate_allocator_policy_probe_admitted{profile,namespace}` (1 admitted, 0 refused; a pair the probe
could not ask about keeps its last value), and each refusal is a Warning Event `ProfileRefused` on the
policy's ConfigMap naming the profile, the namespace and the API server's message. The alert
SparkgateProfileRefused (manifests/monitoring/prometheusrule.yaml) fires on the metric.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from sparkgate import contract
from sparkgate.events import EventRecorder
from sparkgate.kube import Kube, KubeError
from sparkgate.policy_file import PolicySource
from sparkgate.probe import ProbeResult, Verdict, probe_policy

from .metrics import AllocatorMetrics

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 300.0
REASON = "ProfileRefused"


class PolicyProbe:
    def __init__(
        self,
        kube: Kube,
        policy: PolicySource,
        metrics: AllocatorMetrics,
        install_namespace: str = contract.INSTALL_NAMESPACE,
        identity: str = contract.ALLOCATOR_SERVICE_ACCOUNT,
        *,
        interval: float = DEFAULT_INTERVAL,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.policy = policy
        self.metrics = metrics
        self.namespace = install_namespace
        self.identity = identity
        self.interval = interval
        self._monotonic = monotonic
        self._clock = clock
        self.events = EventRecorder(kube, identity=identity, clock=clock)
        self._last: tuple[str, float] | None = None  # (policy digest, monotonic time) of the last run
        self._series: set[tuple[str, str]] = set()

    def due(self) -> bool:
        policy = self.policy.current()
        if policy is None:
            return False
        return (
            self._last is None
            or self._last[0] != policy.digest
            or self._monotonic() - self._last[1] >= self.interval
        )

    def run_if_due(self) -> None:
        """The leader task's work: probe when the policy changed or the interval has passed."""
        if self.due():
            self.run_once()

    def run_once(self) -> list[ProbeResult]:
        """Probe the policy in force; export the results and record an Event for each refusal."""
        policy = self.policy.current()
        if policy is None:
            return []
        self._last = (policy.digest, self._monotonic())
        try:
            results = probe_policy(self.kube, policy)
        except KubeError as e:
            log.warning("policy probe not run: %s", e)
            return []
        seen = set()
        for result in results:
            key = (result.profile, result.namespace)
            seen.add(key)
            if result.verdict is Verdict.ERROR:
                log.warning("policy probe: %s", result.line())
                continue
            self.metrics.probe_admitted.labels(*key).set(1 if result.verdict is Verdict.ADMITTED else 0)
            if result.verdict is Verdict.REFUSED:
                log.error("policy probe: %s", result.line())
                self._event(result)
        for key in self._series - seen:  # a profile or namespace that is gone
            with contextlib.suppress(KeyError):
                self.metrics.probe_admitted.remove(*key)
        self._series = seen
        return results

    def forget(self) -> None:
        """Drop every exported result: a follower's would go stale while the leader probes on."""
        for key in self._series:
            with contextlib.suppress(KeyError):
                self.metrics.probe_admitted.remove(*key)
        self._series = set()
        self._last = None

    def _event(self, result: ProbeResult) -> None:
        try:
            config_map = self.kube.get(
                f"/api/v1/namespaces/{self.namespace}/configmaps/{contract.POLICY_CONFIGMAP}"
            )
        except KubeError as e:
            log.debug("policy ConfigMap not read for the event: %s", e)
            config_map = {}
        involved = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": contract.POLICY_CONFIGMAP,
            "namespace": self.namespace,
        }
        uid = (config_map.get("metadata") or {}).get("uid")
        if uid:
            involved["uid"] = uid
        message = (
            f"profile {result.profile} in namespace {result.namespace}: the API server refuses its "
            f"executor pods (dry run): {result.message}"
        )
        self.events.record(
            involved,
            type="Warning",
            reason=REASON,
            message=message,
            series=f"{result.profile}/{result.namespace}",
        )
