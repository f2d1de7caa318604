"""Adaptive pacing: how many of an app's pods may be released at once, judged by the scheduler's answers.

`pacing: fixed` is the rule of docs/architecture.md: at most `batchSize` per app, only once the previous batch
is bound and `batchDelaySeconds` after the last release. That rule is what made sparkgate slower than the
scheduler alone on a cluster with room (docs/performance.md). `pacing: adaptive` uses the scheduler's own
verdict as the signal, as TCP uses acknowledgements:

- slow start: the app's *window* starts at `batchSize`. Released pods that the scheduler has not answered
  for yet (not bound, no `PodScheduled=False` reason `Unschedulable`) are *waiting*; the app may release
  `window - waiting` more at once, with no batch delay. The released pods not bound yet make the *round*;
  each that is bound leaves it and grows the window by one (a window's worth bound doubles it, as each
  acknowledgement grows TCP's window in slow start), up to the ceiling, `min(maxPendingPerApp,
  maxBatchSize)`, while none has waited `slowBindSeconds`;
- fall back: as soon as one released pod of the app is unschedulable (kube-scheduler's verdict,
  pkg/scheduler/schedule_one.go `handleSchedulingFailure`), or one stays unanswered past `slowBindSeconds`,
  the window is `batchSize` and the fixed rule applies to the app again (batch size, batch delay, previous
  batch bound), except that a pod the scheduler called unschedulable has had its answer: it no longer holds
  the app's next batch, so the app takes its turn at the namespace and cluster budgets when they free up
  (under `fixed`, one unschedulable pod held its app for good: docs/real-cluster-facts.md), within the
  refused-pod bound;
- idle: a growing window that released nothing for `slowBindSeconds` and has nothing outstanding starts
  slow again at the app's next release (its evidence of room is stale), as TCP does after an idle period;
- recover: once no pod of the app is unschedulable any more and none waits for the scheduler's answer (the
  refused pods bound at last, or a round released under the fixed rule bound in time), slow start begins
  again from `batchSize`. (Waiting for a fixed-rule round first cost a batch delay at each refill of a full
  cluster: when an app ended, the others' pods beyond the cap were released `batchSize` per delay.)

The refused-pod bound, in both modes (`refused_room`): a refused pod stays in flight, holding a slot of its
namespace's and the cluster's budgets, until it is bound or goes; so while an app has refused pods in flight it
releases only as many as keep its unplaced pods (refused, or released and unanswered) within one batch, and
nothing at all once its oldest refusal is `unschedulableSeconds` old, until a refused pod is bound or goes (a
hold said as the app's waiting reason, `unschedulable`). An app whose executors can never be scheduled holds
`batchSize` slots at most, instead of `maxPendingPerApp` (adaptive released until then: with a namespace
budget of 60 and 20 per app, three such apps blocked the namespace). Kueue's `waitForPodsReady` bounds in time
how long a workload's unready pods hold quota the same way; Kueue then evicts the workload, sparkgate only
holds the app back: a refused pod may be waiting for a node the cluster autoscaler is adding. A pod refused for
the bound is no sign of life for a client-mode app either (registry.py): a killed notebook's executors that
stay Pending do not keep it, and its slots, for good.

The namespace and cluster limits on pods in flight, and `maxPendingPerApp`, hold in both modes (decision.py
applies them after the window), so unschedulable pods never exceed the caps. There is no capacity model:
only the scheduler's answers.

State: one `Window` per app and the times its refused pods were first seen refused, in the app's memory
(model.AppMemory.pacing and .refused), owned by the loop thread like the rest of the memory (a decision works
on a copy; both are immutable and replaced whole), ended with the app. Neither is persisted (a new leader
gives each refused pod a whole bound again, from when it first sees it): after a restart or a fail-over (or a switch from `fixed`) the app starts slow again, and the pods
sparkgate released that still wait for the scheduler join the new window's round as first seen (`observe`),
so they count against it, fall it back if never answered, and hold the fixed rule's batch after a fall back
(decision.py folds every round's unanswered pods into the batch the fixed rule waits for). Pure: the clock is
the decision's `now`, on the monotonic clock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparkgate.policy import Allocation

    from .model import PodRecord


class Reason(StrEnum):
    """Why an app's window is what it is (the `reason` label of the pacing metric, /apps' `pacing.reason`)."""

    FIXED = "fixed"  # pacing: fixed, the window is batchSize
    SLOW_START = "slow-start"  # every pod released was bound in time: the window grows by each bound
    CEILING = "ceiling"  # grown to min(maxPendingPerApp, maxBatchSize)
    UNSCHEDULABLE = "unschedulable"  # a released pod of the app is unschedulable: fixed rule
    SLOW_BIND = "slow-bind"  # a released pod was not answered within slowBindSeconds: fixed rule


GROWING = (Reason.SLOW_START, Reason.CEILING)


@dataclass(frozen=True, slots=True)
class Window:
    size: int
    reason: Reason
    # The pods released and not bound yet, and when (the decision's clock). While growing, also those whose
    # release the snapshot does not show yet; after a fall back, only the pods still waiting.
    round: Mapping[str, float] = field(default_factory=dict)
    waiting: int = 0  # pods of the round the scheduler has not answered for yet
    released_at: float | None = None  # the window's last release (the decision's clock)

    @property
    def growing(self) -> bool:
        """Releases are paced by the window, not by the fixed rule."""
        return self.reason in GROWING


def ceiling(allocation: Allocation) -> int:
    """The largest window: never more than the app may have in flight, nor than maxBatchSize (a user's
    batch-size annotation above maxBatchSize still gets its batch)."""
    return min(allocation.max_pending_per_app, max(allocation.batch_size, allocation.max_batch_size))


def unbound(pod: PodRecord) -> bool:
    """In flight (released, not being deleted, Pending; a release that failed, 409/422, left it gated) with
    no node: waiting for the scheduler, or refused by it."""
    return pod.in_flight and pod.node is None


def unanswered(pod: PodRecord) -> bool:
    """Unbound, and no verdict from the scheduler yet."""
    return unbound(pod) and not pod.unschedulable


def refused(pod: PodRecord) -> bool:
    """Unbound, and the scheduler said it cannot place it. (The rare condition first:
    the decision asks this of every pod of the app.)"""
    return pod.unschedulable and unbound(pod)


def slow_bind_at(at: float, allocation: Allocation) -> float:
    """When a pod of the round released (or first seen waiting) at `at` will have waited `slowBindSeconds`:
    from then on it makes its app fall back (`observe`), and the app is decided again then (`next_check`)."""
    return at + allocation.slow_bind_seconds


def observe(window: Window | None, allocation: Allocation, pods: Iterable[PodRecord], now: float) -> Window:
    """The app's window after the scheduler's answers about its pods (all of them: the cache's view)."""
    if allocation.pacing != "adaptive":
        return Window(allocation.batch_size, Reason.FIXED)
    top = ceiling(allocation)
    start = min(allocation.batch_size, top)
    if window is None or window.reason is Reason.FIXED:
        window = Window(start, Reason.SLOW_START)
    # One pass over the app's pods: the round's pods bound since the last observation (they leave the round),
    # those waiting for the scheduler's answer, those whose release the snapshot does not show yet (they
    # stay in a growing round), and any refusal. A pod sparkgate released that waits for the scheduler and
    # that the round does not know (released before a restart, by the previous leader, or under `fixed`)
    # joins it as first seen now: it counts against the window and falls the app back if never answered.
    round_, kept, waiting, bound, refusal = window.round, {}, {}, 0, False
    for p in pods:
        refusal = refusal or refused(p)
        at = round_.get(p.name)
        if at is None:
            if p.profile is not None and unanswered(p):
                kept[p.name] = waiting[p.name] = now
            continue
        if p.node is not None:
            bound += 1
        elif unanswered(p):
            kept[p.name] = waiting[p.name] = at
        elif p.gated:
            kept[p.name] = at
    if refusal:
        return Window(allocation.batch_size, Reason.UNSCHEDULABLE, waiting, len(waiting))
    if any(now >= slow_bind_at(at, allocation) for at in waiting.values()):
        return Window(allocation.batch_size, Reason.SLOW_BIND, waiting, len(waiting))
    if (
        window.growing
        and not kept
        and window.released_at is not None
        and now >= slow_bind_at(window.released_at, allocation)
    ):
        # Idle: nothing released for slowBindSeconds and nothing outstanding. What the scheduler answered
        # then says little about the room now (other apps came and went), so the app's next burst starts
        # slow again, as TCP restarts from its initial window after an idle period (RFC 2861/RFC 7661, where
        # the bound is the retransmission timeout; here the time within which the scheduler's answer is due).
        return Window(start, Reason.SLOW_START)
    if window.growing:
        # Grown by each pod bound in time, as TCP's congestion window grows by each acknowledgement: a
        # window's worth bound doubles it, whether or not the app went on releasing meanwhile. (Growing only
        # once a whole round was bound kept an app that always had pods to release, such as a Deployment's,
        # at its first window: its round never emptied.)
        size = max(start, min(window.size + bound, top))
        reason = Reason.CEILING if size >= top else Reason.SLOW_START
        return Window(size, reason, kept, len(waiting), window.released_at)
    if not waiting:
        # recovered: slow start again, as soon as nothing of the app is refused or unanswered (the pods
        # refused leave the round: when they are bound at last, the scheduler has placed all it was given,
        # and room has come)
        return Window(start, Reason.SLOW_START)
    return Window(allocation.batch_size, window.reason, waiting, len(waiting))


def released(window: Window, names: Collection[str], now: float) -> Window:
    """The window after `names` (gated until now) were released at `now`: they join the round from now, a pod
    whose earlier release failed too (fixed pacing keeps none)."""
    if window.reason is Reason.FIXED or not names:
        return window
    return Window(
        window.size,
        window.reason,
        {**window.round, **dict.fromkeys(names, now)},
        window.waiting + len(names),
        now,
    )


def refusals(known: Mapping[str, float], pods: Iterable[PodRecord], now: float) -> dict[str, float]:
    """The app's released pods the scheduler refused (`refused`), each with when it was first seen so: its
    time in `known`, now for one refused since (or before this allocator looked: a new leader gives it a
    whole bound, as it gives a pod waiting for the scheduler a whole slowBindSeconds). One bound or gone
    leaves. (The real kube-scheduler keeps the PodScheduled condition's lastTransitionTime from the pod's
    creation through the gate and the refusal, pkg/api/v1/pod/util.go `UpdatePodCondition`: status False
    throughout; so the pod does not say when it was refused.)"""
    return {p.name: known.get(p.name, now) for p in pods if refused(p)}


def overdue(refused_at: Mapping[str, float], allocation: Allocation, now: float) -> int:
    """How many of the refused pods (`refusals`) were refused `unschedulableSeconds` or longer ago: they hold
    their app back, and are no sign of life (registry.py)."""
    bound = allocation.unschedulable_seconds
    return sum(1 for at in refused_at.values() if now - at >= bound)


def overdue_at(refused_at: Mapping[str, float], allocation: Allocation, now: float) -> float | None:
    """When the next refused pod not yet overdue will be (None: none): the app is decided again then."""
    bound = allocation.unschedulable_seconds
    return min((at + bound for at in refused_at.values() if at + bound > now), default=None)


def refused_room(
    refused_at: Mapping[str, float], pods: Iterable[PodRecord], allocation: Allocation, now: float
) -> int | None:
    """The refused-pod bound (module docstring): how many more pods an app with refused pods in flight may
    release; None when it has none (no bound). None more once a refusal is overdue; else as many as keep its
    unplaced pods, refused or unanswered, within one batch."""
    if not refused_at:
        return None
    if overdue(refused_at, allocation, now):
        return 0
    return max(0, allocation.batch_size - len(refused_at) - sum(map(unanswered, pods)))


def next_check(window: Window, allocation: Allocation, pods: Iterable[PodRecord], now: float) -> float | None:
    """While growing, when the first pod of the round still waiting will have waited `slowBindSeconds` (the
    decision's clock): the app is decided again then, so a pod that is never bound makes it fall back on
    time. A bind wakes the app through its watch event anyway. Pods released by the decision being made
    are still gated in its snapshot; only times after `now` are given, so nothing is ever due at once."""
    if not window.growing or not window.waiting:
        return None
    ends = [
        end
        for p in pods
        if (at := window.round.get(p.name)) is not None
        and (p.gated or unanswered(p))
        and (end := slow_bind_at(at, allocation)) > now
    ]
    return min(ends, default=None)
