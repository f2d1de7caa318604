"""The allocator's rule (docs/architecture.md), as a pure function of the cluster state, the policy, the time
and memory.

For each application that has gated pods, in order of how long it has been waiting (oldest first), at most
one batch per decision:

    n = min(batchSize, maxPendingPerApp - inFlight(app), namespace budget, cluster budget, gated(app))

released in executor-id order, only when the app's previous batch is bound to nodes (or gone) and
`batchDelaySeconds` has passed since its last release; a batch cut short is topped up within its delay.
Budgets are never negative: pods that came through without sparkgate count toward them and can only make
them zero. An app that just got a batch goes to the back of the line, so when a namespace or the cluster
budget binds, apps take turns. An app with released pods the scheduler refused releases within the
refused-pod bound (pacing.py `refused_room`), whichever its pacing, so that apps whose executors cannot be
scheduled do not take the budgets from those whose executors can.

Time: `now` is on the monotonic clock (model.py `Now`), so no wall-clock step moves a batch delay, a Waiting
Event, a bound or an app's place in line; the only wall time is in `rebuilt_memory`, where the API's
timestamps are read.

Settled details:
- "in flight" = released, not being deleted, phase Pending (PodRecord.in_flight);
- the previous batch is bound when every pod of it that was released, still exists and is not being deleted
  has a node (a pod whose release failed is gated again, not waiting for the scheduler);
- settings come from the profile named on the app's pods and the annotations of its lowest-id pod;
- a gated pod whose executor id was deleted before is deleted (id reuse refused), never released;
- an app that is over (allocator/registry.py) has its gated pods, its released pods the scheduler refused
  (they would hold their slots for good) and its config maps deleted;
- the copies an app needs are the ones its gated and in-flight pods mount (chosen at admission, whatever the
  policy says now: a policy edit in the middle of an app changes nothing for its pods); each is made from
  the source of that copy name in the sparkgate namespace, and a source that does not exist holds the app (a
  pod that mounts a missing config map cannot start); a missing copy is created at once, before any release
  in the same decision (the actor carries actions out in order and drops an app's releases when one of its
  creations fails);
- an app the allocator has no memory of (a new app, or every app after a restart or a fail-over) takes as
  its last batch its pods released by sparkgate and not bound yet, and its place in line from its pods'
  creation (`rebuilt_memory`, applied by the loop): a new leader waits for them, and orders the apps, as
  the old one would have.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.policy import Allocation, Policy, Profile

from . import demand, pacing, provisioning
from .model import (
    Action,
    AppMemory,
    AppView,
    CreateConfigMap,
    DeleteConfigMap,
    DeletePod,
    DeletionReason,
    Event,
    Now,
    PodRecord,
    Release,
    Snapshot,
    executor_order,
)

WAITING_EVENT_SECONDS = 5.0  # an app's Waiting Event: once it has had no release for this long
WAITING_EVENT_REPEAT_SECONDS = 60.0  # ... and again at most this often while it keeps waiting
# An app held by a namespace's or the cluster's budget is decided again when pods leave flight there (the
# loop's `_wake`), when its Waiting Event is due, and at the latest after this long (the loop's tick leaves
# it out: a safety net, not the way it is woken).
HELD_RECHECK_SECONDS = 10.0
# What sparkgate itself holds an app's gated pods for (`AppSettings.waiting_on`): the budgets it shares with
# other apps, its pacing, a source ConfigMap of the admin's. While one of them holds it, a client-mode app
# is not judged dead (registry.py): a notebook waiting for its turn shows no sign of life of its own. Not
# `app` (its own pods in flight fill its limit: they are its sign of life while they live) and not
# `unschedulable` (the scheduler refuses its pods: the app's own doing, and they are no sign of life once
# refused for the bound).
HOLDS = frozenset({"namespace", "cluster", "previous-batch", "delay", "window", "source", "provisioning"})


@dataclass(frozen=True)
class AppSettings:
    """What was in force for an app at the last decision (for /apps, metrics and the registry; the profile
    is the app view's, known to every replica)."""

    allocation: Allocation
    waiting_for: str | None  # why gated pods still wait, None when nothing waits
    missing_source: str | None = None  # the source ConfigMap (or, when no source matches, the copy) held for
    # What holds the gated pods: app, namespace, cluster (a limit), previous-batch, delay, window, source,
    # unschedulable (the refused-pod bound).
    waiting_on: str | None = None
    unschedulable: int = 0  # its released pods the scheduler refused, in flight
    overdue: int = 0  # of those, refused unschedulableSeconds or longer ago (no sign of life: registry.py)

    @property
    def holds(self) -> bool:
        """sparkgate holds the app's gated pods (HOLDS): its client-mode grace does not run."""
        return self.waiting_on in HOLDS


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...]
    memory: dict[AppKey, AppMemory]
    settings: dict[AppKey, AppSettings] = field(default_factory=dict)
    limit_hits: Counter[str] = field(default_factory=Counter)  # by scope: app, namespace, cluster
    # When each app must be decided again (the decision's clock), so the loop wakes for it then instead of
    # at its next tick: held by its batch delay, when it ends; by pacing, at its next check; by a shared
    # budget, when its Waiting Event is due or HELD_RECHECK_SECONDS have passed.
    due: dict[AppKey, float] = field(default_factory=dict)
    errors: dict[AppKey, str] = field(default_factory=dict)  # apps whose decision raised, and why


class _Budgets:
    """The in-flight counts of one decision, taken from the snapshot when it first needs them (most decisions
    stop before the limits: nothing gated, previous batch unbound, batch delay) and kept up to date with its
    releases."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self._counts: tuple[Counter[str], int] | None = None

    def _get(self) -> tuple[Counter[str], int]:
        if self._counts is None:
            per_namespace = Counter(self._snapshot.in_flight_by_namespace())
            self._counts = per_namespace, sum(per_namespace.values())
        return self._counts

    def namespace(self, namespace: str) -> int:
        return self._get()[0][namespace]

    def cluster(self) -> int:
        return self._get()[1]

    def released(self, namespace: str) -> None:
        per_namespace, total = self._get()
        per_namespace[namespace] += 1
        self._counts = per_namespace, total + 1


def _copy_memory(memory: AppMemory) -> AppMemory:
    """A copy this decision may change without touching the caller's: every field of AppMemory is immutable
    (model.py), so a shallow copy is whole (copy.deepcopy took as long as the rest of a one-app decision)."""
    return copy.copy(memory)


def decide(
    snapshot: Snapshot,
    policy: Policy,
    now: float,
    memory: Mapping[AppKey, AppMemory],
    apps: Collection[AppKey] | None = None,
    *,
    deleted_exec_ids: Mapping[AppKey, Collection[int]] | None = None,
    ended: Collection[AppKey] = (),
    provisioning_served: bool = False,
) -> Decision:
    """The actions for `apps` (default: every app of the snapshot). `deleted_exec_ids`: each app's executor
    ids deleted before (never released again), at least for `apps`; `ended`: the apps that are over
    (registry.py); `provisioning_served`: the API server serves ProvisioningRequests (provisioning.py). Its
    work is per app decided: the budgets come from the snapshot's in-flight sums."""
    keys = list(snapshot.apps) if apps is None else [k for k in apps if k in snapshot.apps]
    budgets = _Budgets(snapshot)
    deleted = deleted_exec_ids or {}
    new_memory = {k: _copy_memory(memory[k]) if k in memory else AppMemory() for k in keys}
    keys.sort(
        key=lambda k: (new_memory[k].waiting_since if new_memory[k].waiting_since is not None else now, k)
    )
    actions: list[Action] = []
    settings: dict[AppKey, AppSettings] = {}
    hits: Counter[str] = Counter()
    due: dict[AppKey, float] = {}
    errors: dict[AppKey, str] = {}
    for key in keys:
        # One app's failure (a bug, a record no rule expected) must not stop the others: it is reported,
        # its memory left as it was, and it is decided again after its backoff.
        try:
            app_hits: Counter[str] = Counter()
            app_due: dict[AppKey, float] = {}
            if key in ended or snapshot.apps[key].finished:
                out, app_settings = _finish(snapshot.apps[key], new_memory[key]), None
            else:
                out, app_settings = _decide_app(
                    key,
                    snapshot,
                    policy,
                    new_memory[key],
                    now,
                    budgets,
                    app_hits,
                    deleted.get(key, ()),
                    app_due,
                    provisioning_served,
                )
        except Exception as e:
            errors[key] = f"{type(e).__name__}: {e}"
            new_memory[key] = _copy_memory(memory[key]) if key in memory else AppMemory()
            continue
        actions.extend(out)
        hits.update(app_hits)
        due.update(app_due)
        for action in out:
            if isinstance(action, Release):
                budgets.released(key.namespace)
        if app_settings is not None:
            settings[key] = app_settings
    return Decision(tuple(actions), new_memory, settings, hits, due, errors)


def rebuilt_memory(
    app: AppView, now: Now, *, place: float | None = None, seen: float | None = None
) -> AppMemory:
    """What the allocator knows of an app it has no memory of, from the cluster: its last batch is its pods
    that sparkgate released (they carry its profile) and that are not bound yet; its place in line, when it
    has gated pods, is `place` (the one it had when it ended, kept: registry.py) or else rebuilt from its
    pods: when its oldest gated pod was created, or its newest released pod if later (a lower bound of its
    last release, after which the old leader put it at the back of the line), on the monotonic clock
    (`Now.since`: the age by this host's wall clock, the one comparison of wall time with the API's). An
    app this replica saw appear (`seen`, monotonic) is placed no earlier than that: its pods' age would be
    this host's clock error alone (skew with the API server, a step), not a wait."""
    waiting_since = None
    gated = [p.created for p in app.pods if p.gated and not p.deleting]
    if gated and place is not None:
        waiting_since = place
    elif gated:
        released = max((p.created for p in app.pods if not p.gated and p.profile is not None), default=0.0)
        waiting_since = now.since(max(min(gated), released))
        if seen is not None:
            waiting_since = min(now.monotonic, max(waiting_since, seen))
    return AppMemory(
        last_batch=frozenset(
            p.name for p in app.pods if p.in_flight and p.node is None and p.profile is not None
        ),
        waiting_since=waiting_since,
    )


def _finish(app: AppView, mem: AppMemory) -> list[Action]:
    """An app that is over: its gated pods, its released pods the scheduler refused (in flight, they would
    hold their slots of the budgets for as long as they stay) and its config-map copies are deleted."""
    out: list[Action] = [
        DeletePod(app.key, pod, DeletionReason.APP_FINISHED)
        for pod in sorted(app.pods, key=executor_order)
        if (pod.gated or pacing.refused(pod)) and not pod.deleting
    ]
    out.extend(DeleteConfigMap(app.key, name) for name in sorted(app.config_maps))
    out.extend(provisioning.finished(app))
    mem.finished, mem.waiting_since = True, None
    return out


def _decide_app(
    key: AppKey,
    snapshot: Snapshot,
    policy: Policy,
    mem: AppMemory,
    now: float,
    budgets: _Budgets,
    hits: Counter[str],
    deleted: Collection[int],
    due: dict[AppKey, float],
    provisioning_served: bool = False,
) -> tuple[list[Action], AppSettings | None]:
    """One app's actions and settings (memory and the shared budgets updated)."""
    out: list[Action] = []
    app = snapshot.apps[key]
    pods = sorted(app.pods, key=executor_order)
    profile = policy.profile_named(app.profile) if app.profile else None
    allocation, problems = policy.allocation_for(profile, _annotations(pods))
    first = pods[0] if pods else None
    for problem in problems:
        if first is not None:
            # One series per problem: two bad annotations are two Events, not one whose message flips.
            out.append(
                _event(key, first, "Warning", "InvalidAnnotation", problem, f"{key}/annotation/{problem}")
            )
    # An excluded namespace's executors are admitted as they come, on purpose: not bypassed.
    bypassed = [pod for pod in pods if pod.bypassed] if app.counts.bypassed else []
    if bypassed and not policy.is_excluded(key.namespace):
        # One Event per app, on its driver when known: 500 bypassed pods are one Event whose count is 500.
        on = app.driver or bypassed[0]
        out.append(
            Event(
                key,
                on.name,
                on.uid,
                "Warning",
                "BypassedWebhook",
                f"{len(bypassed)} executor pod(s) of app {key} were admitted without sparkgate (webhook down or "
                f"bypassed), {bypassed[0].name} first: they count toward the limits but were not shaped by "
                "the policy",
                f"{key}/bypassed",
                count=len(bypassed),
            )
        )
    out.extend(DeletePod(key, pod, DeletionReason.STRANDED) for pod in provisioning.stranded(app))
    gated: list[PodRecord] = []
    for pod in pods:
        if not pod.gated or pod.deleting:
            continue
        if pod.exec_id is not None and pod.exec_id in deleted:
            out.append(DeletePod(key, pod, DeletionReason.ID_REUSE))
            out.append(
                _event(
                    key,
                    pod,
                    "Warning",
                    "ExecutorIdReused",
                    f"executor id {pod.exec_id} of app {key} was deleted before; the pod is deleted, not released",
                    f"reuse/{pod.uid}",
                )
            )
        else:
            gated.append(pod)
    # The copies its pods need, before any release: those of pods released but not started too (a copy
    # deleted meanwhile would keep them in ContainerCreating, holding the app's budget).
    needing = [p for p in pods if p.in_flight or (p.gated and not p.deleting)]
    copies, missing = _copies(key, app, needing, profile, snapshot.sources)
    owner = app.driver if app.driver is not None and not app.driver.finished else None
    out.extend(CreateConfigMap(key, source, name, owner) for name, source in sorted(copies.items()))
    if app.counts.refused:
        mem.refused = pacing.refusals(mem.refused, app.pods, now)
    elif mem.refused:
        mem.refused = {}
    if mem.refused and (bound := pacing.overdue_at(mem.refused, allocation, now)) is not None:
        due[key] = bound  # the hold then, and the registry's sign of life
    requesting = provisioning.in_force(allocation, provisioning_served)
    plan = provisioning.plan(app, mem, now) if requesting else None
    waiting, released = _release(key, app, gated, missing, allocation, policy, mem, now, budgets, hits, plan)
    out.extend(released)
    # The pods it still holds, shown to the cluster autoscaler (demand.py): after the releases, so a pod
    # released by this decision is never marked.
    left = {a.pod.uid for a in released if isinstance(a, Release)}
    holding = [p for p in gated if p.uid not in left] if left else gated
    marks, mark_due = demand.marks(
        key,
        holding,
        waiting[0] if waiting is not None else None,
        allocation,
        policy,
        mem,
        now,
        requested=plan is not None and not plan.unanswered and provisioning.scales_up(allocation),
    )
    out.extend(marks)
    if requesting:  # the held pods asked for through a request instead (provisioning.py)
        made, mark_due = provisioning.requests(
            key, app, holding, waiting[0] if waiting is not None else None, allocation, mem, now
        )
        # a new request deletes every older one itself
        out.extend(made or provisioning.superseded(app, mem, now))
    elif app.requests or app.templates:  # the policy no longer asks for them (docs/operations.md)
        out.extend(provisioning.finished(app))
    if mark_due is not None:
        due[key] = min(mark_due, due.get(key, mark_due))
    if waiting is not None and waiting[0] == "delay" and mem.last_release_at is not None:
        end = mem.last_release_at + allocation.batch_delay_seconds
        due[key] = min(end, due.get(key, end))
    if (
        mem.pacing is not None
        and (check := pacing.next_check(mem.pacing, allocation, app.pods, now)) is not None
    ):
        due[key] = min(check, due.get(key, check))
    if waiting is not None and gated:
        scope, message = waiting
        # A missing source is a problem: said at once. Waiting is the rule at work: said only once the app
        # has had no release for WAITING_EVENT_SECONDS (the tick decides it again meanwhile), not for the
        # milliseconds most pods wait (one Event write per pod at 100,000 pods: bench/scale.py), and then
        # at most every WAITING_EVENT_REPEAT_SECONDS per app, whichever pod is first in line: the tick decides
        # every waiting app each second, and the Event was written at each of those decisions (1.3 M Event
        # writes for 100,000 releases while 5,000 apps waited for the cluster's budget, bench/scale.py; the
        # spam filter is per pod, and the first gated pod changes with every release).
        if scope == "source":
            out.append(
                _event(
                    key,
                    gated[0],
                    "Warning",
                    "SourceConfigMapMissing",
                    f"waiting: {message}",
                    f"{key}/waiting/{scope}",
                )
            )
        elif (said_at := _waiting_event_at(mem)) is not None and now >= said_at:
            mem.waiting_said_at = now
            out.append(
                _event(key, gated[0], "Normal", "Waiting", f"waiting: {message}", f"{key}/waiting/{scope}")
            )
    held = waiting if waiting and gated else None
    if held is not None and held[0] in ("namespace", "cluster"):
        event_at = _waiting_event_at(mem)
        recheck = min(
            now + HELD_RECHECK_SECONDS, event_at if event_at is not None and event_at > now else math.inf
        )
        due[key] = min(recheck, due.get(key, recheck))
    return out, AppSettings(
        allocation,
        held[1] if held else None,
        missing if held else None,
        held[0] if held else None,
        len(mem.refused),
        pacing.overdue(mem.refused, allocation, now) if mem.refused else 0,
    )


def _waiting_event_at(mem: AppMemory) -> float | None:
    """When the app's Waiting Event may be said next: WAITING_EVENT_SECONDS after it began waiting, and
    WAITING_EVENT_REPEAT_SECONDS after it was last said (None: it is not waiting)."""
    if mem.waiting_since is None:
        return None
    at = mem.waiting_since + WAITING_EVENT_SECONDS
    if mem.waiting_said_at is not None:
        at = max(at, mem.waiting_said_at + WAITING_EVENT_REPEAT_SECONDS)
    return at


def _copies(
    key: AppKey, app: AppView, pods: list[PodRecord], profile: Profile | None, sources: frozenset[str]
) -> tuple[dict[str, str], str | None]:
    """The copies `pods` mount that do not exist yet, each with its source ({name: source}), and the first
    source that is missing (or, when no source has that copy name for this app, the copy's name); none to
    make when one is missing. A copy's source is the one whose copy name for this app it is: the profile's
    first, then any source."""
    needed = sorted({name for pod in pods for name in pod.copies} - app.config_maps)
    if not needed:
        return {}, None
    known = [cm.source for cm in profile.config_maps] if profile else []
    by_name = {contract.app_configmap_name(key.app_id, s): s for s in [*sorted(sources), *known]}
    copies: dict[str, str] = {}
    for name in needed:
        source = by_name.get(name)
        if source is None or source not in sources:
            return {}, source or name
        copies[name] = source
    return copies, None


def _release(
    key: AppKey,
    app: AppView,
    gated: list[PodRecord],
    missing: str | None,
    allocation: Allocation,
    policy: Policy,
    mem: AppMemory,
    now: float,
    budgets: _Budgets,
    hits: Counter[str],
    bound: provisioning.Plan | None = None,
) -> tuple[tuple[str, str] | None, list[Action]]:
    """((scope, why) the remaining gated pods wait, or None; the actions that release a batch). `bound`: what
    the app's ProvisioningRequest allows (provisioning.py)."""
    previous = mem.pacing
    pace = mem.pacing = pacing.observe(previous, allocation, app.pods, now)  # the scheduler's answers
    if not pace.growing and (rounds := pace.round.keys() | (previous.round.keys() if previous else set())):
        # The fixed rule holds (a fall back, or pacing switched to fixed): the pods the window released and
        # the scheduler has not answered are part of the batch it waits for, wherever in the window's rounds
        # they were released, and a batch is topped up only to batchSize with them counted.
        mem.last_batch = mem.last_batch | rounds
    if not gated:
        mem.waiting_since = None
        return None, []
    if mem.waiting_since is None:
        mem.waiting_since = now
    if missing is not None:
        return ("source", f"source ConfigMap {missing} is missing in the sparkgate namespace"), []
    # The refused-pod bound (pacing.py): once a refusal is overdue it holds the app, whatever else would
    # (said so: the client grace runs then, registry.py); otherwise it bounds the batch the pacing allows.
    room = pacing.refused_room(mem.refused, app.pods, allocation, now)
    if room == 0 and pacing.overdue(mem.refused, allocation, now):
        return _refused_hold(key, mem.refused, app.pods, allocation, now), []
    by_name = {p.name: p for p in app.pods}
    # Pacing (allocator/pacing.py): while the window grows, it stands in for the fixed rule (previous batch
    # bound, batch delay); after a fall back the fixed rule holds, a pod called unschedulable no longer waiting.
    if pace.growing:
        window, size = False, pace.size - pace.waiting
        if size <= 0:
            return (
                "window",
                f"app {key}: {pace.waiting} released pods not yet bound (window {pace.size})",
            ), []
    else:
        # A batch is at most batchSize pods, and the next one follows batchDelaySeconds after its last
        # release, once the batch before it is bound. One cut short (Spark had not created the pods yet, or
        # a budget bound) is topped up within its delay as pods and room come, bound or not: the app never
        # has more than batchSize pods the scheduler has not answered (every earlier batch was answered
        # before this one began), and a first release of the one pod Spark created first adds no batch to
        # the ramp. Topping up only once bound let the apps whose batches bound sooner take every slot that
        # freed meanwhile: under a shared budget one app got 2 pods a turn while the others got 5, each turn.
        window = (
            mem.last_release_at is not None and now - mem.last_release_at < allocation.batch_delay_seconds
        )
        size = allocation.batch_size - len(mem.last_batch) if window else allocation.batch_size
        if size <= 0 or not window:
            # Fixed pacing waits for the batch to bind; adaptive for the scheduler's answer (a refusal is
            # one, and its window already fell back to fixed's batch and delay).
            waiting = pacing.unbound if pace.reason is pacing.Reason.FIXED else pacing.unanswered
            unbound = [n for n in mem.last_batch if n in by_name and waiting(by_name[n])]
            if unbound:
                return (
                    "previous-batch",
                    f"app {key}: previous batch not yet bound ({len(unbound)} pods)",
                ), []
        if size <= 0:
            return ("delay", f"app {key}: batch delay of {allocation.batch_delay_seconds:g}s"), []
    if room is not None and room < size:
        if room == 0:
            return _refused_hold(key, mem.refused, app.pods, allocation, now), []
        size = room
    if bound is not None and bound.room is not None:
        if bound.room == 0:
            return ("provisioning", f"app {key}: {bound.why}"), []
        size = min(size, bound.room)
    in_flight = app.counts.in_flight
    in_namespace, total = budgets.namespace(key.namespace), budgets.cluster()
    rooms = {
        "app": (
            max(0, allocation.max_pending_per_app - in_flight),
            f"app {key} has {in_flight}/{allocation.max_pending_per_app} pods in flight",
        ),
        "namespace": (
            max(0, policy.max_pending_per_namespace - in_namespace),
            f"namespace {key.namespace} has {in_namespace}/{policy.max_pending_per_namespace} pods in flight",
        ),
        "cluster": (
            max(0, policy.max_pending_cluster - total),
            f"the cluster has {total}/{policy.max_pending_cluster} pods in flight",
        ),
    }
    n = min(size, len(gated), *(room for room, _ in rooms.values()))
    # Every limit that holds with equality binds (raising it alone would not release more while another
    # binds too, so none of them is "the" one): each is counted, the narrowest names the reason.
    binding = [scope for scope, (room, _) in rooms.items() if room == n and n < min(size, len(gated))]
    hits.update(binding)
    if n == 0:
        return (binding[0], rooms[binding[0]][1]), []
    actions: list[Action] = []
    batch = gated[:n]
    consume = bound.consume if bound is not None else None
    actions.extend(Release(key, pod, consume) for pod in batch)
    names = frozenset(p.name for p in batch)
    mem.last_batch = mem.last_batch | names if window else names
    mem.last_release_at = now
    mem.pacing = pacing.released(pace, names, now)
    mem.waiting_since = now if len(gated) > n else None
    return ((binding[0], rooms[binding[0]][1]) if binding and len(gated) > n else None), actions


def _refused_hold(
    key: AppKey, refused: Mapping[str, float], pods: tuple[PodRecord, ...], allocation: Allocation, now: float
) -> tuple[str, str]:
    """Why an app is held back by the refused-pod bound (pacing.py `refused_room`)."""
    if pacing.overdue(refused, allocation, now):
        return "unschedulable", (
            f"app {key}: {len(refused)} released pods unschedulable, the first for unschedulableSeconds "
            f"({allocation.unschedulable_seconds:g}s) or more: held back until they are bound or gone"
        )
    unanswered = sum(map(pacing.unanswered, pods))
    waiting = f" and {unanswered} not yet answered" if unanswered else ""
    return "unschedulable", (
        f"app {key}: {len(refused)} released pods unschedulable{waiting} (at most batchSize "
        f"{allocation.batch_size} unplaced): held back until fewer are"
    )


def _annotations(pods: list[PodRecord]) -> dict[str, str]:
    if not pods:
        return {}
    first = pods[0]
    out = {}
    if first.batch_size is not None:
        out[contract.ANNOTATION_BATCH_SIZE] = first.batch_size
    if first.max_pending is not None:
        out[contract.ANNOTATION_MAX_PENDING] = first.max_pending
    return out


def _event(key: AppKey, pod: PodRecord, type_: str, reason: str, message: str, rate_key: str) -> Event:
    return Event(key, pod.name, pod.uid, type_, reason, message, rate_key)
