"""Deletion tracking: why each executor pod went away, per application, kept across allocator restarts.

`classify` says why a pod that vanished or got a deletionTimestamp went; `History` keeps the counts by
reason and the most recent records of one app, and (de)serialises them so the runtime can persist them
in the cluster and read them back after a restart.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from .model import DeletionReason, DeletionRecord, PodRecord

RECENT = 50


def classify(pod: PodRecord, at: float, *, app_finishing: bool = False) -> DeletionRecord:
    """The deletion record of an executor pod that is going away, from its last known state."""
    reason = pod.reason or ""
    if app_finishing and pod.phase not in ("Failed", "Succeeded"):
        kind = DeletionReason.APP_FINISHED
    elif reason == "Evicted":
        kind = DeletionReason.EVICTED
    elif reason in ("Preempted", "PreemptionByScheduler"):
        kind = DeletionReason.PREEMPTED
    elif pod.phase == "Failed":
        kind = DeletionReason.OOM_KILLED if reason == "OOMKilled" else DeletionReason.FAILED
    elif pod.phase == "Succeeded":
        kind = DeletionReason.SUCCEEDED
    elif pod.gated:
        kind = DeletionReason.GATED
    elif pod.phase == "Running":
        kind = DeletionReason.RUNNING
    else:
        kind = DeletionReason.PENDING
    return DeletionRecord(pod.exec_id, pod.name, pod.node, at, kind, pod.exit_code, pod.reason)


@dataclass
class History:
    """One app's deletions: counts by reason, the most recent records, every deleted executor id."""

    counts: collections.Counter[DeletionReason] = field(default_factory=collections.Counter)
    recent: collections.deque[DeletionRecord] = field(
        default_factory=lambda: collections.deque(maxlen=RECENT)
    )
    exec_ids: set[int] = field(default_factory=set)
    finished_at: float | None = None

    def record(self, record: DeletionRecord) -> None:
        self.counts[record.reason] += 1
        self.recent.append(record)
        if record.exec_id is not None:
            self.exec_ids.add(record.exec_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "counts": {reason.value: n for reason, n in sorted(self.counts.items())},
            "recent": [
                {
                    "execId": r.exec_id,
                    "pod": r.pod,
                    "node": r.node,
                    "at": r.at,
                    "reason": r.reason.value,
                    "exitCode": r.exit_code,
                    "detail": r.detail,
                }
                for r in self.recent
            ],
            "execIds": sorted(self.exec_ids),
            "finishedAt": self.finished_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> History:
        """The inverse of to_dict; unknown reasons (from a newer version) are skipped, not fatal."""
        history = cls(finished_at=data.get("finishedAt"))
        known = {r.value: r for r in DeletionReason}
        for name, n in (data.get("counts") or {}).items():
            if name in known:
                history.counts[known[name]] = int(n)
        for r in data.get("recent") or []:
            if r.get("reason") in known:
                history.recent.append(
                    DeletionRecord(
                        r.get("execId"),
                        r.get("pod", ""),
                        r.get("node"),
                        float(r.get("at", 0)),
                        known[r["reason"]],
                        r.get("exitCode"),
                        r.get("detail"),
                    )
                )
        history.exec_ids = {int(i) for i in data.get("execIds") or []}
        return history
