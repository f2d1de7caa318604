"""The policy probe as a leader task: a profile that the API server refuses is a page, not lost Spark jobs.

A `LeaderTask` under the allocator's Lease (wired in allocator/commands.py): while this allocator leads, it
runs sparkgate/probe.py (each profile's executor pod, created with `dryRun=All` in the namespaces the
profile matches) when the policy in force changes and every `interval` seconds, because what the API
server admits also changes without the policy changing: a PriorityClass deleted, a namespace relabelled
for PodSecurity, a quota tightened.

A namespace being deleted is not probed (the API server refuses every creation in it, whatever the pod:
NamespaceLifecycle), and one deleted between the list and its dry run is no verdict on the profile
(sparkgate/probe.py `_terminating`): on a real cluster both profiles were reported refused for five minutes
by namespaces that were going.

Bounded: one run makes at most `max_dry_runs` dry-run creations (a (profile, namespace) pair takes one or
two). A run that cannot cover every pair goes on where the last one stopped, rotating through the sorted
pairs, so every namespace is probed over a few runs; the pairs it leaves for later are counted in
`sparkgate_allocator_policy_probe_deferred`. Results are kept per pair until the policy changes (then the
new policy starts from scratch) or the pair is no longer matched; a pair the probe could not ask about
keeps its last result.

Exported per profile, not per namespace (a series per namespace grew with the cluster):
`sparkgate_allocator_policy_probe_admitted{profile}` is 1 when every namespace probed admits the profile's
pods, 0 when one refuses them. Which namespaces, and the API server's message, are in one Warning Event
`ProfileRefused` per profile on the policy's ConfigMap, recorded when the verdict changes (admitted to
refused, or the refusals change), not at every run; sparkgate/events.py keeps it one Event object whose
count grows. The alert SparkgateProfileRefused (manifests/monitoring/prometheusrule.yaml) fires on the
metric.

The per-namespace results are served on the allocator's `/apps` (`policyProbe`: each profile, whether
it is admitted, how many namespaces were probed, and each refusing namespace with its message).

State: everything here is owned by the one LeaderTask thread that calls `run_if_due` and, on losing the
lead, `forget`; the metric registry is thread-safe; `document` is a new dict at each run, replaced whole,
so the HTTP threads that read it never see one half written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from sparkgate import contract
from sparkgate.events import EventRecorder
from sparkgate.kube import Kube, KubeError
from sparkgate.policy_file import PolicySource
from sparkgate.probe import ProbeResult, Verdict, probe, targets

from .metrics import AllocatorMetrics

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 300.0
DEFAULT_MAX_DRY_RUNS = 100
REASON = "ProfileRefused"
NAMESPACES_NAMED = 10  # in one Event message; the rest are counted


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
        max_dry_runs: int = DEFAULT_MAX_DRY_RUNS,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_dry_runs < 2:
            raise ValueError("max_dry_runs must be at least 2: one probe takes up to two dry runs")
        self.kube = kube
        self.policy = policy
        self.metrics = metrics
        self.namespace = install_namespace
        self.interval = interval
        self.max_dry_runs = max_dry_runs
        self._monotonic = monotonic
        self.events = EventRecorder(kube, identity=identity, wall=clock, monotonic=monotonic)
        self._last: tuple[str, float] | None = None  # (policy digest, monotonic time) of the last run
        self._digest: str | None = None  # the policy that `_results` are about
        self._results: dict[tuple[str, str], ProbeResult] = {}  # (profile, namespace): its last answer
        self._cursor = 0  # where the next run starts in the sorted pairs
        self._reported: dict[str, str] = {}  # profile: the refusals last recorded ("" when admitted)
        self.document: dict[str, Any] = {"profiles": {}}  # for /apps

    def due(self) -> bool:
        policy = self.policy.current()
        if policy is None:
            return False
        return (
            self._last is None
            or self._last[0] != policy.digest
            or self._monotonic() - self._last[1] >= self.interval
        )

    def run_if_due(self) -> bool:
        """The leader task's work: probe when the policy changed or the interval has passed; False when it
        was not due (a poll, not a run: LeaderTask counts runs)."""
        if not self.due():
            return False
        self.run_once()
        return True

    def run_once(self) -> list[ProbeResult]:
        """Probe the policy in force within the dry-run budget; export the results per profile and record
        an Event for each profile whose refusals changed. Returns this run's results."""
        policy = self.policy.current()
        if policy is None:
            return []
        self._last = (policy.digest, self._monotonic())
        if policy.digest != self._digest:
            self._digest, self._results, self._cursor = policy.digest, {}, 0
        pairs = targets(self.kube, policy)  # KubeError: the namespaces cannot be listed, a failed run
        start = self._cursor % len(pairs) if pairs else 0
        budget, results = self.max_dry_runs, []
        for profile, namespace in pairs[start:] + pairs[:start]:
            if budget < 2:
                break
            result = probe(self.kube, policy, profile, namespace)
            budget -= result.dry_runs
            results.append(result)
        if len(results) < len(pairs):
            self.metrics.probe_deferred.inc(len(pairs) - len(results))
        self._cursor = start + len(results)
        matched = {(p.name, ns) for p, ns in pairs}
        self._results = {k: v for k, v in self._results.items() if k in matched}
        for result in results:
            if result.verdict is Verdict.ERROR:
                log.warning("policy probe: %s", result.line())
                continue
            if result.verdict is Verdict.REFUSED:
                log.error("policy probe: %s", result.line())
            # Kept without the answered pod (tens of KiB each), which only the check's live comparison reads.
            self._results[(result.profile, result.namespace)] = dataclasses.replace(result, pod=None)
        self._export()
        return results

    def forget(self) -> None:
        """Drop every exported result: a follower's would go stale while the leader probes on."""
        for profile in self._reported:
            with contextlib.suppress(KeyError):
                self.metrics.probe_admitted.remove(profile)
        self._reported, self._results, self._digest, self._cursor = {}, {}, None, 0
        self._last = None
        self.document = {"profiles": {}}

    def _export(self) -> None:
        by_profile: dict[str, list[ProbeResult]] = {}
        for (profile, _), result in sorted(self._results.items()):
            by_profile.setdefault(profile, []).append(result)
        for profile in self._reported.keys() - by_profile.keys():  # a profile that is gone
            with contextlib.suppress(KeyError):
                self.metrics.probe_admitted.remove(profile)
            del self._reported[profile]
        changed, profiles = [], {}
        for profile, results in by_profile.items():
            refused = [r for r in results if r.verdict is Verdict.REFUSED]
            profiles[profile] = {
                "admitted": not refused,
                "namespacesProbed": len(results),
                "refused": {r.namespace: r.message for r in refused},
            }
            self.metrics.probe_admitted.labels(profile).set(0 if refused else 1)
            message = refusals(profile, refused)
            if message and message != self._reported.setdefault(profile, ""):
                changed.append((profile, message))
            else:
                self._reported[profile] = message
        self.document = {"policy": self._digest, "profiles": profiles}
        for profile, message in changed:  # after every series is set: the Events take requests
            if self._event(profile, message):
                self._reported[profile] = message  # else (not written) the next run tries again

    def _event(self, profile: str, message: str) -> bool:
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
        return self.events.record(involved, type="Warning", reason=REASON, message=message, series=profile)


def refusals(profile: str, refused: Iterable[ProbeResult]) -> str:
    """The Event message for a profile's refusals ("" when none): the namespaces, grouped by the API
    server's message word for word."""
    by_message: dict[str, list[str]] = {}
    for result in refused:
        by_message.setdefault(result.message, []).append(result.namespace)
    if not by_message:
        return ""
    parts = []
    for message, namespaces in by_message.items():
        named = ", ".join(namespaces[:NAMESPACES_NAMED])
        more = f" and {len(namespaces) - NAMESPACES_NAMED} more" if len(namespaces) > NAMESPACES_NAMED else ""
        word = "namespace" if len(namespaces) == 1 else "namespaces"
        parts.append(f"in {word} {named}{more}: {message}")
    return f"profile {profile}: the API server refuses its executor pods (dry run) " + "; ".join(parts)
