"""The documents of the allocator's status API (`/apps`, `/apps/<namespace>/<app id>`) and the per-app and
per-namespace gauges, built purely from the cache snapshot, the last decision's settings, the allocator's
memory, the deletion histories and the apps' backoff: the same counts (model.py's rules: in flight,
bypassed, finished) whichever of them you read."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from sparkgate.contract import AppKey

from .decision import AppSettings
from .deletions import History
from .metrics import AllocatorMetrics
from .model import AppMemory, AppView, Snapshot


def executor_counts(view: AppView) -> dict[str, int]:
    counts = {"gated": 0, "in_flight": 0, "running": 0, "other": 0}
    for pod in view.pods:
        if pod.deleting:
            counts["other"] += 1
        elif pod.gated:
            counts["gated"] += 1
        elif pod.in_flight:
            counts["in_flight"] += 1
        elif pod.phase == "Running":
            counts["running"] += 1
        else:
            counts["other"] += 1
    return counts


def namespace_counts(snapshot: Snapshot) -> tuple[Counter[str], Counter[str]]:
    """Pods in flight and bypassed pods, per namespace."""
    in_flight: Counter[str] = Counter()
    bypassed: Counter[str] = Counter()
    for key, view in snapshot.apps.items():
        for pod in view.pods:
            in_flight[key.namespace] += pod.in_flight
            bypassed[key.namespace] += pod.bypassed
    return in_flight, bypassed


def observe_apps(metrics: AllocatorMetrics, snapshot: Snapshot) -> None:
    """The per-app and per-namespace gauges of one step. The pods of an app are walked only when its view
    changed since the last step (the cache hands out the same view object until then), and its series are
    written only when its counts changed: a step costs per app, not per pod (bench/months.py)."""
    last, current = metrics.observed, {}
    in_flight: Counter[str] = Counter()
    bypassed: Counter[str] = Counter()
    for key, view in snapshot.apps.items():
        known = last.get(key)
        if known is None or known[0] is not view:
            counts = executor_counts(view)
            if known is None or known[1] != counts:
                metrics.set_app(key, counts)
            known = (view, counts, sum(p.bypassed for p in view.pods))
        current[key] = known
        in_flight[key.namespace] += known[1]["in_flight"]
        bypassed[key.namespace] += known[2]
    metrics.observed = current
    if len(metrics.app_series) > len(current):
        metrics.forget_apps(set(current))
    live = {key.namespace for key in current}
    metrics.forget_namespaces(live)
    for namespace in live:
        metrics.in_flight.labels(namespace).set(in_flight[namespace])
        metrics.bypassed.labels(namespace).set(bypassed[namespace])
    metrics.namespaces |= live
    metrics.apps.set(len(current))


def observe_pacing(metrics: AllocatorMetrics, memory: Mapping[AppKey, AppMemory], live: set[AppKey]) -> None:
    """Each live app's pacing window and its reason (the leader's decisions; a follower has none)."""
    for key in live:
        window = memory[key].pacing if key in memory else None
        if window is not None:
            metrics.set_pacing(key, window)
    metrics.forget_pacing({key for key in live if key in memory and memory[key].pacing is not None})


def pacing_summary(memory: AppMemory | None) -> dict[str, Any] | None:
    """/apps' `pacing`: the app's window, why it is what it is, and how many released pods it waits for."""
    window = memory.pacing if memory else None
    if window is None:
        return None
    return {"window": window.size, "reason": window.reason.value, "unanswered": window.waiting}


def app_summary(
    view: AppView,
    settings: AppSettings | None,
    memory: AppMemory | None,
    history: History | None,
    backoff: tuple[int, float] | None = None,
) -> dict[str, Any]:
    counts = executor_counts(view)
    allocation = settings.allocation if settings else None
    return {
        "namespace": view.key.namespace,
        "appId": view.key.app_id,
        "profile": view.profile,  # from its pods: the same on every replica
        "gated": counts["gated"],
        "inFlight": counts["in_flight"],
        "running": counts["running"],
        "failed": sum(1 for p in view.pods if p.phase == "Failed"),
        "bypassed": sum(1 for p in view.pods if p.bypassed),
        "limits": (
            {
                "batchSize": allocation.batch_size,
                "batchDelaySeconds": allocation.batch_delay_seconds,
                "maxPendingPerApp": allocation.max_pending_per_app,
            }
            if allocation
            else None
        ),
        "pacing": pacing_summary(memory),
        "waitingFor": settings.waiting_for if settings else None,
        "waitingSince": memory.waiting_since if memory else None,
        "lastReleaseAt": memory.last_release_at if memory else None,
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
) -> dict[str, Any]:
    in_flight, bypassed = namespace_counts(snapshot)
    apps = [
        app_summary(
            snapshot.apps[key], settings.get(key), memory.get(key), histories.get(key), backoff.get(key)
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
) -> dict[str, Any]:
    document = app_summary(view, settings, memory, history, backoff)
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
