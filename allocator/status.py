"""The documents of the allocator's status API (`/apps`, `/apps/<namespace>/<app id>`) and the gauges of
what it tracks (per app, per namespace, the limits, the histories), built purely from one `Status`: the
cache snapshot, the last decision's settings, the allocator's memory, the deletion histories and the apps'
backoff: the same counts (model.py's `Counts`) whichever of them you read."""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from sparkgate.contract import AppKey

from .decision import AppSettings
from .deletions import History
from .metrics import LABEL_ESCAPES, text_help, text_series, text_value
from .model import AppMemory, AppView, Now, Snapshot
from .pacing import Window


@dataclass(frozen=True)
class Status:
    """What the allocator shows of itself at one moment (Controller.status): taken at once by an HTTP
    thread, for /apps or a scrape."""

    snapshot: Snapshot  # the apps that are not over
    settings: Mapping[AppKey, AppSettings]
    memory: Mapping[AppKey, AppMemory]
    limits: Mapping[str, int]  # "cluster", "namespace": the budgets in force (empty without a policy)
    backoff: Mapping[AppKey, tuple[int, float]]  # apps with failed writes: (failures, seconds left)
    history_unsaved: int
    histories: int
    # The policy's excludedNamespaces (Policy.is_excluded): their executors are admitted unchanged on
    # purpose, so none of them is bypassed. Without a policy, none is excluded.
    excluded: Callable[[str], bool] = lambda namespace: False


def namespace_counts(
    snapshot: Snapshot, excluded: Callable[[str], bool]
) -> tuple[Counter[str], Counter[str]]:
    """Pods in flight and bypassed pods, per namespace (none bypassed in an excluded namespace)."""
    in_flight: Counter[str] = Counter()
    bypassed: Counter[str] = Counter()
    for key, view in snapshot.apps.items():
        in_flight[key.namespace] += view.counts.in_flight
        if view.counts.bypassed and not excluded(key.namespace):
            bypassed[key.namespace] += view.counts.bypassed
    return in_flight, bypassed


class AppsCollector:
    """The gauges of what the allocator tracks, computed when Prometheus scrapes (from `status()`), not
    kept up to date per step: the loop's cost stays per app that changed, and an app that is over or gone
    has no series without anything to remove.

    At 5,000 apps these are 50,000 samples, and prometheus_client's writer took 0.4-0.9 s to format them
    (bench/scale.py); so the collector writes its own lines in the text exposition format (version 0.0.4,
    the one allocator/http.py serves) and keeps each app's lines until its view or its pacing window
    changes: a scrape formats only the apps that changed. /metrics serves its text after the registry's
    (metrics.py `AllocatorMetrics.exposition`), and the tests read it back as Prometheus would. Thread-safe: scrapes may come from several HTTP threads; the cache is taken under a lock."""

    def __init__(self, status: Callable[[], Status]) -> None:
        self._status = status
        self._lock = threading.Lock()
        # app -> (its view, its pacing window, its lines): what the last scrape wrote for it
        self._lines: dict[AppKey, tuple[AppView, Window | None, str, str, str]] = {}

    def exposition(self) -> bytes:
        status = self._status()
        with self._lock:
            return self._write(status).encode()

    def _write(self, status: Status) -> str:
        live = status.snapshot.apps
        known, current = self._lines, {}
        executors: list[str] = []
        windows: list[str] = []
        states: list[str] = []
        requests: Counter[str] = Counter()
        for key, view in live.items():
            for request in view.requests:
                requests[request.state] += 1
            memory = status.memory.get(key)
            window = memory.pacing if memory is not None else None
            entry = known.get(key)
            if entry is None or entry[0] is not view or entry[1] is not window:
                entry = (view, window, *_app_lines(key, view, window))
            current[key] = entry
            executors.append(entry[2])
            windows.append(entry[3])
            states.append(entry[4])
        self._lines = current
        in_flight, bypassed = namespace_counts(status.snapshot, status.excluded)
        held_for: Counter[str] = Counter(
            s.missing_source for k, s in status.settings.items() if s.missing_source is not None and k in live
        )
        namespaces = sorted(in_flight.keys() | bypassed.keys())
        return "".join(
            [
                _header(EXECUTORS),
                *executors,
                _header(IN_FLIGHT),
                *(_line(IN_FLIGHT, {"namespace": ns}, in_flight[ns]) for ns in namespaces),
                _header(BYPASSED),
                *(_line(BYPASSED, {"namespace": ns}, bypassed[ns]) for ns in namespaces),
                _header(PACING_WINDOW),
                *windows,
                _header(PACING_STATE),
                *states,
                _header(MISSING),
                *(_line(MISSING, {"source": source}, n) for source, n in sorted(held_for.items())),
                _header(LIMIT),
                *(
                    _line(LIMIT, {"scope": scope}, status.limits.get(scope, 0))
                    for scope in ("namespace", "cluster")
                ),
                _header(APPS),
                _line(APPS, {}, len(live)),
                _header(BACKING_OFF),
                _line(BACKING_OFF, {}, sum(1 for _, left in status.backoff.values() if left > 0)),
                _header(UNSAVED),
                _line(UNSAVED, {}, status.history_unsaved),
                _header(HISTORIES),
                _line(HISTORIES, {}, status.histories),
                _header(REQUESTS),
                *(_line(REQUESTS, {"state": state}, requests[state]) for state in REQUEST_STATES),
            ]
        )


class Gauge(NamedTuple):
    """A gauge AppsCollector writes."""

    name: str
    help: str
    labels: tuple[str, ...] = ()


EXECUTORS = Gauge(
    "sparkgate_allocator_executors",
    "Executor pods by app and state (gated, in_flight, running, other).",
    ("namespace", "app", "state"),
)
IN_FLIGHT = Gauge("sparkgate_allocator_in_flight", "Executor pods in flight by namespace.", ("namespace",))
BYPASSED = Gauge(
    "sparkgate_allocator_bypassed_pods", "Live executor pods admitted without sparkgate.", ("namespace",)
)
PACING_WINDOW = Gauge(
    "sparkgate_allocator_pacing_window",
    "Pods an app may have released and not yet answered by the scheduler (its pacing window).",
    ("namespace", "app"),
)
PACING_STATE = Gauge(
    "sparkgate_allocator_pacing_state",
    "Why an app's window is what it is: one series per app, 1, labelled with the reason (slow-start, ceiling, "
    "unschedulable, slow-bind, fixed).",
    ("namespace", "app", "reason"),
)
MISSING = Gauge(
    "sparkgate_allocator_source_configmap_missing",
    "Apps held because a profile's source ConfigMap is missing.",
    ("source",),
)
LIMIT = Gauge(
    "sparkgate_allocator_limit", "Limits in force by scope (namespace and cluster budgets).", ("scope",)
)
APPS = Gauge("sparkgate_allocator_apps", "Applications tracked.")
BACKING_OFF = Gauge("sparkgate_allocator_apps_backing_off", "Apps held by their backoff after failed writes.")
UNSAVED = Gauge(
    "sparkgate_allocator_history_unsaved", "Apps whose deletion history has changes not yet written."
)
HISTORIES = Gauge(
    "sparkgate_allocator_histories",
    "Deletion histories held (one ConfigMap each once written); a finished app's expires after "
    "--history-retention.",
)
REQUESTS = Gauge(
    "sparkgate_allocator_provisioning_requests",
    "sparkgate's ProvisioningRequests by state (pending, provisioned, not-provisioned, failed, expired, revoked).",
    ("state",),
)
REQUEST_STATES = ("pending", "provisioned", "not-provisioned", "failed", "expired", "revoked")
GAUGES = (
    REQUESTS,
    EXECUTORS, IN_FLIGHT, BYPASSED, PACING_WINDOW, PACING_STATE, MISSING, LIMIT, APPS, BACKING_OFF, UNSAVED, HISTORIES,
)  # fmt: skip


def _header(family: Gauge) -> str:
    return text_help(family.name, family.help, "gauge")


def _line(family: Gauge, labels: Mapping[str, str], value: float) -> str:
    """One sample, as prometheus_client's writer (exposition.py `generate_latest`) writes it."""
    return f"{text_series(family.name, labels)} {text_value(value)}\n"


@functools.lru_cache(maxsize=4096)
def _count(n: int) -> str:
    """A count's text (`text_value`), memoized: an app's counts and window are small numbers, the same for
    most apps, and every app's lines are written at the first scrape (5,000 apps at 100,000 pods)."""
    return text_value(n)


def _app_lines(key: AppKey, view: AppView, window: Window | None) -> tuple[str, str, str]:
    """An app's lines of the executors, pacing window and pacing state gauges (labels by name: app,
    namespace, then reason or state, as `_line` writes them)."""
    app = f'app="{key.app_id.translate(LABEL_ESCAPES)}",namespace="{key.namespace.translate(LABEL_ESCAPES)}"'
    name = EXECUTORS.name
    executors = "".join(
        [f'{name}{{{app},state="{state}"}} {_count(n)}\n' for state, n in view.counts.by_state().items()]
    )
    if window is None:
        return executors, "", ""
    # The current reason only, not one series per reason at 0 or 1: 5,000 apps made 20,000 series of zeros
    # (a third of /metrics at 100,000 pods, bench/scale.py). A change of reason ends one series and starts
    # another; `sum by (reason)` counts the apps in each.
    state = f'{PACING_STATE.name}{{{app},reason="{window.reason.value}"}} 1.0\n'
    return executors, f"{PACING_WINDOW.name}{{{app}}} {_count(window.size)}\n", state


def pacing_summary(memory: AppMemory | None) -> dict[str, Any] | None:
    """/apps' `pacing`: the app's window, why it is what it is, and how many released pods it waits for."""
    window = memory.pacing if memory else None
    if window is None:
        return None
    return {"window": window.size, "reason": window.reason.value, "unanswered": window.waiting}


def _wall(now: Now, at: float | None) -> float | None:
    """A time of the memory (monotonic) as unix seconds, for people."""
    return None if at is None else round(now.wall_of(at), 3)


def app_summary(
    view: AppView,
    settings: AppSettings | None,
    memory: AppMemory | None,
    history: History | None,
    backoff: tuple[int, float] | None = None,
    excluded: bool = False,
    *,
    now: Now,
) -> dict[str, Any]:
    counts = view.counts
    allocation = settings.allocation if settings else None
    return {
        "namespace": view.key.namespace,
        "appId": view.key.app_id,
        "profile": view.profile,  # from its pods: the same on every replica
        "gated": counts.gated,
        "inFlight": counts.in_flight,
        "running": counts.running,
        "failed": counts.failed,
        "bypassed": 0 if excluded else counts.bypassed,
        "excludedNamespace": excluded,  # excludedNamespaces: admitted unchanged, counted in flight
        "limits": (
            {
                "batchSize": allocation.batch_size,
                "batchDelaySeconds": allocation.batch_delay_seconds,
                "maxPendingPerApp": allocation.max_pending_per_app,
                "unschedulableSeconds": allocation.unschedulable_seconds,
            }
            if allocation
            else None
        ),
        "pacing": pacing_summary(memory),
        # Released pods the scheduler refused, in flight, and how many of them for unschedulableSeconds or
        # longer (the refused-pod bound, docs/policy.md): None when none.
        "unschedulable": (
            {"inFlight": settings.unschedulable, "overdue": settings.overdue}
            if settings and settings.unschedulable
            else None
        ),
        "waitingFor": settings.waiting_for if settings else None,
        "waitingSince": _wall(now, memory.waiting_since) if memory else None,
        "lastReleaseAt": _wall(now, memory.last_release_at) if memory else None,
        "driver": None if view.driver is None else {"name": view.driver.name, "phase": view.driver.phase},
        "finished": bool(memory and memory.finished),
        "deletions": {reason.value: n for reason, n in sorted((history.counts if history else {}).items())},
        # Consecutive failed writes and the seconds until the next attempt (None: the last write went through).
        "backoff": None
        if backoff is None
        else {"failures": backoff[0], "retryInSeconds": round(backoff[1], 3)},
    }


def apps_document(
    snapshot: Snapshot,
    settings: Mapping[AppKey, AppSettings],
    memory: Mapping[AppKey, AppMemory],
    histories: Mapping[AppKey, History],
    limits: Mapping[str, int],
    backoff: Mapping[AppKey, tuple[int, float]],
    excluded: Callable[[str], bool],
    *,
    now: Now,
) -> dict[str, Any]:
    in_flight, bypassed = namespace_counts(snapshot, excluded)
    apps = [
        app_summary(
            snapshot.apps[key],
            settings.get(key),
            memory.get(key),
            histories.get(key),
            backoff.get(key),
            excluded(key.namespace),
            now=now,
        )
        for key in sorted(snapshot.apps)
    ]
    return {
        "apps": apps,
        "cluster": {
            "inFlight": sum(in_flight.values()),
            "maxPendingCluster": limits.get("cluster"),
            "maxPendingPerNamespace": limits.get("namespace"),
            "inFlightByNamespace": {ns: n for ns, n in sorted(in_flight.items()) if n},
            "bypassedByNamespace": {ns: n for ns, n in sorted(bypassed.items()) if n},
            "gated": sum(a["gated"] for a in apps),
        },
    }


def app_document(
    view: AppView,
    settings: AppSettings | None,
    memory: AppMemory | None,
    history: History | None,
    backoff: tuple[int, float] | None = None,
    excluded: bool = False,
    *,
    now: Now,
) -> dict[str, Any]:
    document = app_summary(view, settings, memory, history, backoff, excluded, now=now)
    document["pods"] = [
        {
            "name": p.name,
            "execId": p.exec_id,
            "gated": p.gated,
            "node": p.node,
            "phase": p.phase,
            "deleting": p.deleting,
            "profile": p.profile,
        }
        for p in view.pods
    ]
    document["deletionRecords"] = (history.to_dict()["recent"]) if history else []
    return document
