"""The allocator's Prometheus metrics (one process, its own registry, served on its /metrics).

Per-app series (executors by state) are removed when the app ends, and every per-namespace series when its
namespace has no app left, so a long-running cluster does not accumulate dead series. Written by the loop
thread (gauges, pruning) and the actor threads (counters of releases and deletions); prometheus_client
locks each metric.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sparkgate.contract import AppKey

from .model import AppView, DeletionReason
from .pacing import Reason, Window

WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
EXTENDER_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.00075,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.005,
    0.01,
    0.025,
    0.1,
    0.5,
)
FAST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class AllocatorMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.executors = Gauge(
            "sparkgate_allocator_executors",
            "Executor pods by app and state (gated, in_flight, running, other).",
            ["namespace", "app", "state"],
            registry=r,
        )
        self.in_flight = Gauge(
            "sparkgate_allocator_in_flight",
            "Executor pods in flight by namespace.",
            ["namespace"],
            registry=r,
        )
        self.limit = Gauge(
            "sparkgate_allocator_limit",
            "Limits in force by scope (namespace and cluster budgets).",
            ["scope"],
            registry=r,
        )
        self.releases = Counter(
            "sparkgate_allocator_releases",
            "Executor pods released to the scheduler.",
            ["namespace"],
            registry=r,
        )
        self.gate_wait = Histogram(
            "sparkgate_allocator_gate_wait_seconds",
            "Time from a pod's creation to its release.",
            ["namespace"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.release_to_bind = Histogram(
            "sparkgate_allocator_release_to_bind_seconds",
            "Time from a pod's release to its binding to a node.",
            ["namespace"],
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.gate_removal = Histogram(
            "sparkgate_allocator_gate_removal_seconds",
            "Time from the watch event that first showed a gated executor pod to the API server accepting the "
            "PATCH that removed its gate (the wait for room under the limits included).",
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.limit_hits = Counter(
            "sparkgate_allocator_limit_hits",
            "Decisions where a limit bound the release, by scope.",
            ["scope"],
            registry=r,
        )
        self.deletions = Counter(
            "sparkgate_allocator_deletions",
            "Executor pods gone, by reason.",
            ["namespace", "reason"],
            registry=r,
        )
        self.bypassed = Gauge(
            "sparkgate_allocator_bypassed_pods",
            "Live executor pods admitted without sparkgate.",
            ["namespace"],
            registry=r,
        )
        self.missing_sources = Gauge(
            "sparkgate_allocator_source_configmap_missing",
            "Apps held because a profile's source ConfigMap is missing.",
            ["source"],
            registry=r,
        )
        self.api_requests = Counter(
            "sparkgate_allocator_api_requests",
            "Kubernetes API requests by verb, resource and HTTP code (0: no answer).",
            ["verb", "resource", "code"],
            registry=r,
        )
        self.watch_restarts = Counter(
            "sparkgate_allocator_watch_restarts",
            "Watch streams restarted, by watch and cause.",
            ["watch", "cause"],
            registry=r,
        )
        self.leader = Gauge(
            "sparkgate_allocator_leader", "1 while this allocator holds the lease.", registry=r
        )
        self.leader_transitions = Counter(
            "sparkgate_allocator_leader_transitions", "Times this allocator became the leader.", registry=r
        )
        self.leader_errors = Counter(
            "sparkgate_allocator_leader_errors",
            "Unexpected exceptions of the leader thread (logged; it goes on at its next turn).",
            registry=r,
        )
        self.decision_seconds = Histogram(
            "sparkgate_allocator_decision_duration_seconds",
            "Time spent deciding (pure, no I/O) per decision.",
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.apps = Gauge("sparkgate_allocator_apps", "Applications tracked.", registry=r)
        self.policy_reloads = Counter(
            "sparkgate_allocator_policy_reloads", "Policy file loads by result.", ["result"], registry=r
        )
        self.ready = Gauge(
            "sparkgate_allocator_cache_synced",
            "1 while every watch is current (listed, not failing).",
            registry=r,
        )
        self.reflector_crashes = Counter(
            "sparkgate_allocator_reflector_crashes",
            "Reflectors restarted after an unexpected exception, by watch.",
            ["watch"],
            registry=r,
        )
        self.decision_errors = Counter(
            "sparkgate_allocator_decision_errors",
            "Exceptions in one app's decision or actions (contained: the other apps go on).",
            registry=r,
        )
        self.write_failures = Counter(
            "sparkgate_allocator_write_failures",
            "Apps whose writes failed (each puts the app in backoff), by namespace.",
            ["namespace"],
            registry=r,
        )
        self.apps_backing_off = Gauge(
            "sparkgate_allocator_apps_backing_off",
            "Apps held by their backoff after failed writes.",
            registry=r,
        )
        self.history_corrupt = Counter(
            "sparkgate_allocator_history_corrupt",
            "Deletion history ConfigMaps that did not parse (set aside and replaced).",
            registry=r,
        )
        self.history_write_failures = Counter(
            "sparkgate_allocator_history_write_failures",
            "Failed writes of a deletion history ConfigMap (retried after a backoff).",
            registry=r,
        )
        self.history_ids_dropped = Counter(
            "sparkgate_allocator_history_executor_ids_dropped",
            "Deleted executor ids dropped from a deletion history to keep it within --history-executor-ids "
            "(the reuse of a dropped id is no longer refused).",
            registry=r,
        )
        self.apps_ended = Counter(
            "sparkgate_allocator_apps_ended",
            "Applications whose life ended, by mode (cluster: driver finished or gone; client: no sign of "
            "life for --client-app-grace).",
            ["mode"],
            registry=r,
        )
        self.histories = Gauge(
            "sparkgate_allocator_histories",
            "Deletion histories held (one ConfigMap each once written); a finished app's expires after "
            "--history-retention.",
            registry=r,
        )
        self.history_unsaved = Gauge(
            "sparkgate_allocator_history_unsaved",
            "Apps whose deletion history has changes not yet written.",
            registry=r,
        )
        self.task_runs = Counter(
            "sparkgate_allocator_task_runs",
            "Runs of the leader-elected periodic tasks, by task and result.",
            ["task", "result"],
            registry=r,
        )
        # The policy probe (allocator/probe.py).
        self.probe_admitted = Gauge(
            "sparkgate_allocator_policy_probe_admitted",
            "1 when the API server admits a dry-run executor pod of the profile in every namespace probed, 0 "
            "when it refuses it in one (the ProfileRefused Event names them).",
            ["profile"],
            registry=r,
        )
        self.probe_deferred = Counter(
            "sparkgate_allocator_policy_probe_deferred",
            "(profile, namespace) pairs a probe run left for a later run: the dry-run bound bit.",
            registry=r,
        )
        # --- the scheduler extender (allocator/extender.py) ---
        self.extender_requests = Counter(
            "sparkgate_allocator_extender_requests",
            "Scheduler extender requests by verb (filter, prioritize) and outcome (ok, fallback, "
            "not_executor, no_policy, bad_request).",
            ["verb", "outcome"],
            registry=r,
        )
        self.extender_seconds = Histogram(
            "sparkgate_allocator_extender_duration_seconds",
            "Time to answer a scheduler extender request, by verb (parsing included).",
            ["verb"],
            buckets=EXTENDER_BUCKETS,
            registry=r,
        )
        self.extender_excluded = Counter(
            "sparkgate_allocator_extender_excluded_nodes",
            "Nodes refused to an executor pod by the extender's filter, by scope (app, node: a suspect "
            "node) and reason (the most frequent failure: oom_killed, evicted, exit_code, rejected).",
            ["scope", "reason"],
            registry=r,
        )
        self.extender_fallbacks = Counter(
            "sparkgate_allocator_extender_fallbacks",
            "Filter answers that kept every node because every node would have been refused.",
            registry=r,
        )
        for verb in ("filter", "prioritize"):
            for outcome in ("ok", "not_executor", "no_policy", "bad_request"):
                self.extender_requests.labels(verb, outcome)
        self.extender_requests.labels("filter", "fallback")
        for scope in ("app", "node"):
            for reason in ("oom_killed", "evicted", "exit_code", "rejected"):
                self.extender_excluded.labels(scope, reason)
        self.app_series: set[AppKey] = set()  # apps with executors series
        # Loop thread: what observe_apps (status.py) last wrote per app: (view, counts, bypassed pods).
        self.observed: dict[AppKey, tuple[AppView, dict[str, int], int]] = {}
        # Namespaces that may have per-namespace series (added where a series is written; pruned by the loop).
        self.namespaces: set[str] = set()
        # Adaptive pacing (allocator/pacing.py), per app, set by the leader from its decisions' memory.
        self.pacing_window = Gauge(
            "sparkgate_allocator_pacing_window",
            "Pods an app may have released and not yet answered by the scheduler (its pacing window).",
            ["namespace", "app"],
            registry=r,
        )
        self.pacing_state = Gauge(
            "sparkgate_allocator_pacing_state",
            "1 for the reason an app's window is what it is (slow-start, ceiling, unschedulable, slow-bind, "
            "fixed), 0 for the others.",
            ["namespace", "app", "reason"],
            registry=r,
        )
        self._pacing_series: set[AppKey] = set()
        # Series whose label values are known in advance exist from the start at 0: increase() and rate()
        # cannot see a counter's first increments when its series appears with them.
        for scope in ("app", "namespace", "cluster"):
            self.limit_hits.labels(scope)
        for result in ("success", "failure"):
            self.policy_reloads.labels(result)
        self.decision_errors.inc(0)
        self.history_ids_dropped.inc(0)
        for mode in ("cluster", "client"):
            self.apps_ended.labels(mode)

    def set_app(self, key: AppKey, counts: dict[str, int]) -> None:
        for state, n in counts.items():
            self.executors.labels(key.namespace, key.app_id, state).set(n)
        self.app_series.add(key)

    def forget_app(self, key: AppKey) -> None:
        """Remove every series of one app."""
        self.observed.pop(key, None)
        for state in ("gated", "in_flight", "running", "other"):
            with contextlib.suppress(KeyError):
                self.executors.remove(key.namespace, key.app_id, state)
        self.app_series.discard(key)

    def forget_apps(self, live: set[AppKey]) -> None:
        for key in self.app_series - live:
            self.forget_app(key)

    def forget_namespaces(self, live: set[str]) -> None:
        """Remove every per-namespace series of the namespaces with no app left (their counters start again
        from zero if an app comes back: Prometheus's rate() and increase() take that as a reset)."""
        for namespace in self.namespaces - live:
            for metric in (
                self.in_flight,
                self.bypassed,
                self.releases,
                self.gate_wait,
                self.release_to_bind,
                self.write_failures,
            ):
                with contextlib.suppress(KeyError):
                    metric.remove(namespace)
            for reason in DeletionReason:
                with contextlib.suppress(KeyError):
                    self.deletions.remove(namespace, reason.value)
        self.namespaces &= live

    def set_pacing(self, key: AppKey, window: Window) -> None:
        self.pacing_window.labels(key.namespace, key.app_id).set(window.size)
        for reason in Reason:
            self.pacing_state.labels(key.namespace, key.app_id, reason.value).set(reason is window.reason)
        self._pacing_series.add(key)

    def forget_pacing(self, live: set[AppKey]) -> None:
        for key in self._pacing_series - live:
            with contextlib.suppress(KeyError):
                self.pacing_window.remove(key.namespace, key.app_id)
            for reason in Reason:
                with contextlib.suppress(KeyError):
                    self.pacing_state.remove(key.namespace, key.app_id, reason.value)
        self._pacing_series &= live

    def on_reload(self, result: str, error: str | None) -> None:
        self.policy_reloads.labels(result).inc()
