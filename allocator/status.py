"""The documents of the allocator's status API (`/apps`, `/apps/<namespace>/<app id>`), built purely from
the cache snapshot, the last decision's settings, the allocator's memory and the deletion histories."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparkgate.contract import AppKey

from .decision import AppSettings, in_flight_counts
from .deletions import History
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


def app_summary(
    view: AppView, settings: AppSettings | None, memory: AppMemory | None, history: History | None
) -> dict[str, Any]:
    counts = executor_counts(view)
    allocation = settings.allocation if settings else None
    return {
        "namespace": view.key.namespace,
        "appId": view.key.app_id,
        "profile": settings.profile if settings else None,
        "gated": counts["gated"],
        "inFlight": counts["in_flight"],
        "running": counts["running"],
        "failed": sum(1 for p in view.pods if p.phase == "Failed"),
        "bypassed": sum(1 for p in view.pods if not p.gated and p.profile is None and not p.deleting),
        "limits": (
            {
                "batchSize": allocation.batch_size,
                "batchDelaySeconds": allocation.batch_delay_seconds,
                "maxPendingPerApp": allocation.max_pending_per_app,
            }
            if allocation
            else None
        ),
        "waitingFor": settings.waiting_for if settings else None,
        "waitingSince": memory.waiting_since if memory else None,
        "lastReleaseAt": memory.last_release_at if memory else None,
        "driver": None if view.driver is None else {"name": view.driver.name, "phase": view.driver.phase},
        "finished": bool(memory and memory.finished),
        "deletions": {reason.value: n for reason, n in sorted((history.counts if history else {}).items())},
    }


def apps_document(
    snapshot: Snapshot,
    settings: Mapping[AppKey, AppSettings],
    memory: Mapping[AppKey, AppMemory],
    histories: Mapping[AppKey, History],
    limits: Mapping[str, int],
) -> dict[str, Any]:
    per_namespace, total = in_flight_counts(snapshot)
    apps = [
        app_summary(snapshot.apps[key], settings.get(key), memory.get(key), histories.get(key))
        for key in sorted(snapshot.apps)
    ]
    return {
        "apps": apps,
        "cluster": {
            "inFlight": total,
            "maxPendingCluster": limits.get("cluster"),
            "maxPendingPerNamespace": limits.get("namespace"),
            "inFlightByNamespace": dict(sorted(per_namespace.items())),
            "gated": sum(a["gated"] for a in apps),
        },
    }


def app_document(
    view: AppView, settings: AppSettings | None, memory: AppMemory | None, history: History | None
) -> dict[str, Any]:
    document = app_summary(view, settings, memory, history)
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
