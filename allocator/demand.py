"""Demand as a condition: the executor pods sparkgate holds, shown to the cluster autoscaler.

cluster-autoscaler and Karpenter count a pending pod only when its PodScheduled condition is False with reason
Unschedulable; a gated pod carries the API server's reason SchedulingGated, which both ignore
(docs/real-cluster-facts.md, "cluster-autoscaler and a gated pod"). So without this the autoscaler sees only
the executors sparkgate has released, and an app far above the cluster's cap needs a provisioning round per
cap's worth of pods. With `autoscalerDemand: held` (docs/policy.md) the allocator writes, once per held pod,
`PodScheduled=False, reason=Unschedulable` through `pods/status`, with a message that says why the pod waits
and starts with sparkgate's mark (contract.HELD_MARK): the autoscaler sees what it would see without sparkgate,
and `kubectl describe pod` tells the Spark user the truth. kube-scheduler replaces the condition with its own
verdict (or binds the pod) once the pod is released; nothing is left to clean up.

Which pods and when (`marks`): every gated pod of an app that sparkgate holds (by the app's, its namespace's or
the cluster's limit, its pacing, or its refused pods; not by a missing source ConfigMap, whose pods could not
start on a new node either), at once when the app is held by its refused pods (the scheduler's word that there
is no room: the pods it holds would not fit either), else once the app has had no release for
DEMAND_AFTER_SECONDS. On a cluster with room an app's pods wait milliseconds for its window or a free slot and
are never marked (zero writes); once all of them run, there is nothing to mark (zero in steady state); a pod
is marked at most once (the app's memory keeps the uids handed to the actor, and a pod that shows sparkgate's
condition is not marked again). A mark that never shows (refused, skipped while the app's marks are held
back, or an answer lost before the write landed) is handed out again REFUSED_RETRY_SECONDS later: a repeat
is safe, the write tests that the pod is still gated and unmarked. The delay is cluster-autoscaler's own horizon: it does not scale up for
unschedulable pods all younger than 2 s (`unschedulablePodTimeBuffer`, kubesim/autoscaler.py), so a pod marked
then is acted on no later than one the scheduler had marked at its creation. Marked at once, the held pods
of an app held by its refusals land within that horizon too: the autoscaler's first scale-up after it
plans for them with the refused ones (marked one by one, a real cluster-autoscaler scaled up in three steps
instead of one: docs/real-cluster-facts.md). With `provisioning: best-effort-atomic-scale-up` in force for
the app (allocator/provisioning.py), its held pods are asked for through the request and not marked: the
autoscaler would otherwise scale up for them twice (check-capacity adds no node: its held pods are marked).

A pod sparkgate released still carries its mark until kube-scheduler has tried it: the cache tells the mark
from the scheduler's verdict (cache.py `pod_record`: `held_mark`, not `unschedulable`), so it is neither a
refusal for adaptive pacing and the refused-pod bound nor "no sign of life" for the registry.

The write (actor.py `mark`) is a JSON Patch of `pods/status` that tests the API server's SchedulingGated
condition and the gate before replacing the condition (contract.demand_mark): a pod released or changed
meanwhile is left alone. A refusal (RBAC without `patch` on `pods/status`, an install whose admission policy
predates the mark) costs a log line, a metric and an Event per app, and the app's next marks are not sent for
REFUSED_RETRY_SECONDS; its releases go on as before (no backoff).

Pure: the decision's clock, the app's memory (`AppMemory.marked`, owned by the loop thread like the rest).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sparkgate.contract import AppKey
from sparkgate.policy import Allocation, Policy

from .model import AppMemory, MarkHeld, PodRecord

DEMAND_AFTER_SECONDS = 2.0  # an app's held pods are marked once it has had no release for this long
REFUSED_RETRY_SECONDS = 600.0  # an app whose mark was refused sends none for this long (actor.py)
# What holds an app's gated pods (decision.py `AppSettings.waiting_on`) that the autoscaler should count.
COUNTED = frozenset({"app", "namespace", "cluster", "previous-batch", "delay", "window", "unschedulable"})


def why(scope: str, key: AppKey, allocation: Allocation, policy: Policy) -> str:
    """Why the pod waits, in words a Spark user reading `kubectl describe pod` understands (after the mark)."""
    later = "this executor is released to the scheduler when one of them is placed"
    if scope == "cluster":
        return (
            f"the cluster already has {policy.max_pending_cluster} executor pods waiting to be placed, its "
            f"limit (maxPendingCluster); {later}"
        )
    if scope == "namespace":
        return (
            f"namespace {key.namespace} already has {policy.max_pending_per_namespace} executor pods waiting "
            f"to be placed, its limit (maxPendingPerNamespace); {later}"
        )
    if scope == "app":
        return (
            f"application {key.app_id} already has {allocation.max_pending_per_app} executor pods waiting to "
            f"be placed, its limit (maxPendingPerApp); {later}"
        )
    if scope == "unschedulable":
        return (
            f"executors of application {key.app_id} released before it could not be scheduled yet; this "
            "executor is released once they are placed"
        )
    return (
        f"the executors of application {key.app_id} are released a batch at a time, as the scheduler places "
        "them; this executor is in a later batch"
    )


def ready_at(scope: str | None, mem: AppMemory) -> float | None:
    """When the pods an app holds are shown to the autoscaler (marked, or asked for by a request): at once when
    its refused pods hold it, else DEMAND_AFTER_SECONDS after its last release (None: not while it waits)."""
    if mem.waiting_since is None:
        return None
    return -math.inf if scope == "unschedulable" else mem.waiting_since + DEMAND_AFTER_SECONDS


def marks(
    key: AppKey,
    held: Sequence[PodRecord],
    scope: str | None,
    allocation: Allocation,
    policy: Policy,
    mem: AppMemory,
    now: float,
    *,
    requested: bool = False,
) -> tuple[list[MarkHeld], float | None]:
    """The app's held pods to mark now (`held`: its gated pods this decision leaves gated; `scope`: what
    holds them), and when to decide it again for the rest (None: not for this). `requested`: a
    ProvisioningRequest asks for them (no mark). The memory keeps the uids handed out."""
    if not held:
        mem.marked = {}
        return [], None
    if allocation.autoscaler_demand != "held" or requested or scope not in COUNTED:
        return [], None
    unmarked = [
        p for p in held if not p.held_mark and p.gated_condition is not None and p.gate_index is not None
    ]
    handed = [mem.marked[p.uid] for p in unmarked if p.uid in mem.marked]
    again = min(handed) + REFUSED_RETRY_SECONDS if handed else None  # a mark handed out that never showed
    fresh = [
        p for p in unmarked if p.uid not in mem.marked or now >= mem.marked[p.uid] + REFUSED_RETRY_SECONDS
    ]
    if not fresh:
        return [], again
    due = ready_at(scope, mem)
    if due is None or now < due:
        return [], due
    gated = {p.uid for p in held}
    mem.marked = {u: at for u, at in mem.marked.items() if u in gated} | {p.uid: now for p in fresh}
    assert scope is not None
    text = why(scope, key, allocation, policy)
    return [MarkHeld(key, pod, text) for pod in fresh], None
