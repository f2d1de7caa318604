"""The allocator's Prometheus metrics (one process, its own registry, served on its /metrics).

The gauges of what the allocator tracks (per app, per namespace, limits, histories) are not here: they are
computed at each scrape from the loop's state (status.py `AppsCollector`, registered by the Controller), so
an app that is over has no series. The per-namespace counters and histograms here are removed when their
namespace has no app left (the loop's tick), so a long-running cluster does not accumulate dead series.
Written by the loop thread (pruning) and the actor threads (counters of releases and deletions);
prometheus_client locks each metric.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client import metrics as _metrics
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from .model import DeletionReason

_Key = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, labels)
# A series' key -> (the same key, the series' text); a labelled histogram's child: (its name, its label
# values) -> (the same key, the texts of all of its series).
_Series = dict[Any, tuple[Any, str | tuple[str, ...]]]
# The text format's rules, as prometheus_client's writer applies them (exposition.py `generate_latest`): one
# definition for the registry's text (RegistryText) and the tracked gauges' (status.py AppsCollector).
LABEL_ESCAPES = str.maketrans({"\\": r"\\", "\n": r"\n", '"': r"\""})  # a label value's


def text_value(value: float) -> str:
    """A sample's value: Go's float text, as Prometheus writes it."""
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]


def text_help(name: str, documentation: str, kind: str) -> str:
    """A family's HELP and TYPE lines."""
    documentation = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {documentation}\n# TYPE {name} {kind}\n"


def text_series(name: str, labels: Mapping[str, str]) -> str:
    """A sample's name and labels, the labels by name."""
    if not labels:
        return name
    return (
        name + "{" + ",".join(f'{k}="{v.translate(LABEL_ESCAPES)}"' for k, v in sorted(labels.items())) + "}"
    )


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
# The gate's removal: the reaction's milliseconds, and the wait for room under the limits (minutes).
GATE_REMOVAL_BUCKETS = (*FAST_BUCKETS, 120, 300, 600, 1800, 3600)


# Seconds a namespace's per-namespace series outlive its last app: longer than a few scrape intervals and
# Prometheus's 5-minute lookback, so the last increments of a namespace whose apps all ended are scraped.
NAMESPACE_GRACE_SECONDS = 600.0


class AllocatorMetrics:
    def __init__(self, *, namespace_grace: float = NAMESPACE_GRACE_SECONDS) -> None:
        r = self.registry = CollectorRegistry()
        # The process's own health, as every Prometheus client library exports it (client-go's controllers
        # too): resident memory, CPU, open files and their limit, start time (`process_*`, from /proc), the
        # Python version (`python_info`) and the garbage collector's work (`python_gc_*`). A run of months is
        # watched for exactly these (the dashboard's "Allocator memory", "CPU" and "open files", docs/metrics.md).
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
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
            buckets=GATE_REMOVAL_BUCKETS,
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
        self.demand_marks = Counter(
            "sparkgate_allocator_demand_marks",
            "Held executor pods marked PodScheduled=False/Unschedulable for the cluster autoscaler, by outcome "
            "(written, stale, refused, unclear, skipped).",
            ["outcome"],
            registry=r,
        )
        self.history_corrupt = Counter(
            "sparkgate_allocator_history_corrupt",
            "Deletion history ConfigMaps that did not parse (set aside and replaced).",
            registry=r,
        )
        self.history_write_failures = Counter(
            "sparkgate_allocator_history_write_failures",
            "Failed writes of a deletion history ConfigMap (retried after a backoff), and flushes that raised.",
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
            for outcome in ("ok", "not_executor", "no_policy", "not_synced", "bad_request", "error"):
                self.extender_requests.labels(verb, outcome)
        self.extender_requests.labels("filter", "fallback")
        for scope in ("app", "node"):
            for reason in ("oom_killed", "evicted", "exit_code", "rejected"):
                self.extender_excluded.labels(scope, reason)
        # Namespaces that may have per-namespace series (added where a series is written; pruned by the loop
        # once they have had no app for `namespace_grace` seconds: `_absent` says since when).
        self.namespaces: set[str] = set()
        self.namespace_grace = namespace_grace
        self._absent: dict[str, float] = {}
        # Held while a per-namespace series is written (`in_namespace`) and while they are forgotten, so that
        # a series is never written between its removal and its namespace's: it would stay for good.
        self._namespaces_lock = threading.Lock()
        # The gauges of what is tracked, written at each scrape (status.py `AppsCollector.exposition`, set
        # by the Controller): after the registry's metrics in /metrics.
        self.tracked: Callable[[], bytes] | None = None
        self._text = RegistryText(r)
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

    def exposition(self) -> bytes:
        """The body of /metrics (text format 0.0.4)."""
        body = self._text.exposition()
        return body if self.tracked is None else body + self.tracked()

    def families(self) -> Iterator[Metric]:
        """Every metric of /metrics, read back from its text: what Prometheus sees."""
        yield from text_string_to_metric_families(self.exposition().decode())

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """One sample's value as Prometheus would read it (None: no such series)."""
        for family in self.families():
            for s in family.samples:
                if s.name == name and s.labels == (labels or {}):
                    return s.value
        return None

    @contextlib.contextmanager
    def in_namespace(self, namespace: str) -> Iterator[None]:
        """Write a per-namespace series inside this (any thread): the namespace is known, and not forgotten
        meanwhile."""
        with self._namespaces_lock:
            if namespace not in self.namespaces:
                self.namespaces.add(namespace)
                # The write-failures counter from 0, so that increase() sees a namespace's first failure
                # (the releases' 0 is made here too, but its first increment follows under this lock before
                # any scrape: the alerts' `unless ... offset` covers that step).
                self.releases.labels(namespace)
                self.write_failures.labels(namespace)
            self._absent.pop(namespace, None)
            yield

    def forget_namespaces(self, live: set[str], now: float) -> None:
        """Remove every per-namespace series of the namespaces that have had no app for the grace period
        (their counters start again from zero if an app comes back: Prometheus's rate() and increase() take
        that as a reset). `live`: the namespaces with an app now, ended or not; `now`: the loop's clock."""
        with self._namespaces_lock:
            for namespace in live:
                self._absent.pop(namespace, None)
            gone = set()
            for namespace in self.namespaces - live:
                since = self._absent.setdefault(namespace, now)
                if now - since >= self.namespace_grace:
                    gone.add(namespace)
            self._forget_namespaces(gone)

    def _forget_namespaces(self, gone: set[str]) -> None:
        for namespace in gone:
            for metric in (
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
            self._absent.pop(namespace, None)
        self.namespaces -= gone

    def on_reload(self, result: str, error: str | None) -> None:
        self.policy_reloads.labels(result).inc()


def _labels(names: tuple[str, ...], values: tuple[str, ...], le: str | None = None) -> dict[str, str]:
    """A child's labels, and a bucket's bound: what `collect()` gives its sample."""
    labels = dict(zip(names, values, strict=True))
    if le is not None:
        labels["le"] = le
    return labels


def _histogram_series(
    name: str, names: tuple[str, ...], values: tuple[str, ...], bounds: tuple[str, ...], with_sum: bool
) -> tuple[str, ...]:
    """A histogram child's series texts, as `text_series` makes them: each bucket's (its bound `le` among
    the child's labels, by name), then _count's and, when the histogram has one, _sum's."""
    pairs = sorted((k, f'{k}="{v.translate(LABEL_ESCAPES)}"') for k, v in zip(names, values, strict=True))
    texts = [text for _, text in pairs]
    own = "{" + ",".join(texts) + "}"
    # `le` takes its place among the labels by name: the labels before it and after it are the same text
    # in every bucket (a sort per bucket made the first scrape's 200 namespaces ~10 ms dearer).
    at = sum(1 for k, _ in pairs if k < "le")
    head = name + "_bucket{" + "".join(text + "," for text in texts[:at])
    tail = "".join("," + text for text in texts[at:]) + "}"
    buckets = [f'{head}le="{le}"{tail}' for le in bounds]
    return (*buckets, name + "_count" + own, *((name + "_sum" + own,) if with_sum else ()))


class RegistryText:
    """A registry's metrics in the text format 0.0.4, the bytes prometheus_client's `generate_latest` writes
    (its default escaping), with each series' name and labels formatted once and kept while the series
    exists: a scrape formats only the values.

    Why: at 100,000 pods in 200 namespaces the registry has ~7,300 samples (two histograms per namespace),
    and `generate_latest` formatted each one's labels again at every scrape (validating and escaping every
    label name and value): half of its time, ~40 % of a /metrics scrape (bench/scale.py). Each scrape keeps
    only the series it wrote, so the kept text ends with its series; what it keeps of a series is what was
    made when the series first came (its key and text), never a fresh copy: a scrape's kept copies outlived
    it into the GC's oldest generation, and at 100,000 pods their number set off a full collection of the
    whole heap every other scrape (bench/scale.py). The labelled counters and histograms, nearly all of the
    samples, are written from their children's values (`_children`), not from the samples `collect()`
    builds for them, which was all that was left of the registry's scrape. Thread-safe: one scrape at a time
    writes (HTTP threads). Metric and label names are sparkgate's own, in the legacy character set that needs
    no escaping; the test compares the whole text with `generate_latest`'s."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._lock = threading.Lock()
        self._series: _Series = {}

    def exposition(self) -> bytes:
        with self._lock:
            known, kept = self._series, _Series()
            out: list[str] = []
            for collector in self._collectors():
                if isinstance(collector, Counter | Histogram) and cast(Any, collector)._is_parent():
                    self._children(collector, known, kept, out)
                else:
                    for metric in collector.collect():
                        self._family(metric, known, kept, out)
            self._series = kept
            return "".join(out).encode()

    def _collectors(self) -> list[Any]:
        """The registry's collectors in the order `CollectorRegistry.collect` calls them."""
        registry: Any = self._registry
        with registry._lock:
            return list(registry._collector_to_names)

    def _family(self, metric: Metric, known: _Series, kept: _Series, out: list[str]) -> None:
        """One family as `collect()` made it (the samples prometheus_client builds)."""
        name, kind = metric.name, metric.type
        if kind == "counter":
            name += "_total"
        elif kind == "info":
            name, kind = name + "_info", "gauge"
        elif kind == "stateset":
            kind = "gauge"
        elif kind == "gaugehistogram":
            kind = "histogram"
        elif kind == "unknown":
            kind = "untyped"
        out.append(text_help(name, metric.documentation, kind))
        # OpenMetrics' samples (a counter's or histogram's _created), each suffix a gauge after it
        extra: dict[str, list[str]] = {}
        for sample in metric.samples:
            key = (sample.name, tuple(sample.labels.items()))
            line = self._line(key, sample.name, sample.labels, sample.value, sample.timestamp, known, kept)
            suffix = sample.name[len(metric.name) :] if sample.name.startswith(metric.name) else ""
            if suffix in ("_created", "_gsum", "_gcount"):
                extra.setdefault(suffix, []).append(line)
            else:
                out.append(line)
        for suffix, lines in sorted(extra.items()):
            out.append(text_help(metric.name + suffix, metric.documentation, "gauge"))
            out.extend(lines)

    def _children(self, metric: Any, known: _Series, kept: _Series, out: list[str]) -> None:
        """A labelled counter or histogram written from its children's values, the samples its `collect()`
        would build (prometheus_client metrics.py `_multi_samples` and the `_child_samples` of Counter and
        Histogram) without building them: at 200 namespaces `collect()` was all of the registry's scrape,
        90 ms on a slow machine (bench/scale.py). The test compares the text with `generate_latest`'s."""
        name, names = metric._name, metric._labelnames
        with metric._lock:
            children = list(metric._metrics.items())
        created: list[str] = []  # the children's _created gauges, a family after this one (as `_family`)
        with_created = _metrics._use_created

        def when_created(values: tuple[str, ...], labels: Any, child: Any) -> None:
            if with_created:
                key = (name + "_created", values)
                created.append(self._line(key, key[0], labels, child._created, None, known, kept))

        if isinstance(metric, Counter):
            out.append(text_help(name + "_total", metric._documentation, "counter"))
            total = name + "_total"
            for values, child in children:
                labels = functools.partial(_labels, names, values)
                out.append(self._line((total, values), total, labels, child._value.get(), None, known, kept))
                when_created(values, labels, child)
        else:
            out.append(text_help(name, metric._documentation, "histogram"))
            bounds = tuple(text_value(b) for b in metric._upper_bounds)
            with_sum = metric._upper_bounds[0] >= 0
            for values, child in children:
                # One entry per child, all of its series (a dozen buckets, _count, _sum): a scrape looks it
                # up once, not once per bucket, and a new child's labels are escaped and sorted once.
                entry = known.get((name, values))
                if entry is None:
                    key = (name, values)
                    entry = (key, _histogram_series(name, names, values, bounds, with_sum))
                kept[entry[0]] = entry
                texts, count = cast("tuple[str, ...]", entry[1]), 0.0
                for text, value in zip(texts[: len(bounds)], child._buckets, strict=True):
                    count += value.get()
                    out.append(f"{text} {text_value(count)}\n")
                out.append(f"{texts[len(bounds)]} {text_value(count)}\n")
                if with_sum:
                    out.append(f"{texts[-1]} {text_value(child._sum.get())}\n")
                when_created(values, functools.partial(_labels, names, values), child)
        if created:
            out.append(text_help(name + "_created", metric._documentation, "gauge"))
            out.extend(created)

    @staticmethod
    def _line(
        key: Any,
        name: str,
        labels: Any,
        value: float,
        timestamp: Any,
        known: _Series,
        kept: _Series,
    ) -> str:
        """One sample's line; `labels` a mapping, or a function that makes it (called for a new series only)."""
        entry = known.get(key)
        if entry is None:
            entry = (key, text_series(name, labels() if callable(labels) else labels))
        kept[entry[0]] = entry  # the key made when the series first came: this scrape's dies young
        stamp = "" if timestamp is None else f" {int(float(timestamp) * 1000):d}"
        return f"{entry[1]} {text_value(value)}{stamp}\n"
