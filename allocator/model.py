"""The allocator's vocabulary: what it knows about the cluster, what it remembers, what it decides.

The cache turns watch events into these small frozen records; the pure decision function reads a
`Snapshot` plus the allocator's `Memory` and returns `Action`s; the actor carries them out. Keeping the
records compact (no whole pod objects) is what lets one allocator track tens of thousands of pods.

Two clocks (`Now`): every duration the allocator measures (batch delay, slow bind, the refused-pod bound,
Waiting Events, the client grace, what is kept of ended apps) is on the monotonic clock, which no NTP step or
VM resume moves; the wall clock only where a time meets the API's timestamps (a pod's creationTimestamp, a
container's finishedAt, the deletion histories, what /apps shows users).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import msgspec

from sparkgate.contract import NO_PROFILE, AppKey

from .pacing import Window


@dataclass(frozen=True, slots=True)
class Now:
    """One reading of both clocks (seconds): `monotonic` for every duration, `wall` (unix seconds) only to
    meet the API's timestamps, which come from the API server's clock."""

    monotonic: float
    wall: float

    def since(self, timestamp: float) -> float:
        """An API timestamp (unix seconds) as a time on the monotonic clock: now minus its age. An age is
        never negative: a timestamp ahead of this host's clock (skew with the API server) counts as now."""
        return self.monotonic - max(0.0, self.wall - timestamp)

    def wall_of(self, at: float) -> float:
        """A time on the monotonic clock as unix seconds, for people (/apps): now minus its age."""
        return self.wall - (self.monotonic - at)


class PodRecord(msgspec.Struct, frozen=True, gc=False):
    """One executor pod, as much of it as the allocator needs. Immutable: a changed pod is a new record
    (`msgspec.structs.replace`).

    A msgspec Struct, not a dataclass: the reflector makes one per watch event and the cache compares it
    with the one it holds. Made, compared and replaced in C, it took 1.2 / 0.2 / 0.3 us where the frozen
    dataclass took 4.3 / 0.8 / 14 (`dataclasses.replace`) (docs/performance.md). `gc=False`: it holds only
    strings, numbers, None and a tuple of strings, so it can never be part of a reference cycle, and the
    cyclic GC does not walk the cache's records at each full collection (at 100,000 pods they were half of
    what a collection walked: 100 ms with them, 33 without; bench/scale.py)."""

    namespace: str
    name: str
    uid: str
    app_id: str
    exec_id: int | None  # None when the label is missing or not a decimal
    resource_profile: str
    gated: bool  # carries the sparkgate gate: not released yet
    profile: str | None  # the sparkgate.io/profile annotation; None: admitted without sparkgate
    node: str | None  # spec.nodeName once bound
    phase: str  # status.phase ("Pending" when absent)
    deleting: bool  # has a deletionTimestamp
    created: float  # creationTimestamp, unix seconds
    batch_size: str | None = None  # raw sparkgate.io/batch-size annotation
    max_pending: str | None = None  # raw sparkgate.io/max-pending annotation
    owner_uid: str | None = None  # uid of the controlling owner (the driver pod), if any
    reason: str | None = None  # termination / status reason: OOMKilled, Evicted, Error, Completed...
    exit_code: int | None = None
    gate_index: int | None = None  # position of the sparkgate gate in spec.schedulingGates (for the patch)
    finished: float | None = None  # when its container terminated (finishedAt), unix seconds, if known
    copies: tuple[str, ...] = ()  # the sparkgate config-map copies its volumes mount (chosen at admission)
    # PodScheduled=False, reason Unschedulable, from kube-scheduler: its verdict. Not sparkgate's own mark
    # (`held_mark`), which a pod just released still carries until the scheduler has tried it.
    unschedulable: bool = False
    held_mark: bool = False  # PodScheduled=False/Unschedulable written by sparkgate (contract.HELD_MARK)
    # Index in status.conditions of its PodScheduled condition while that says SchedulingGated (the API
    # server's, on a gated pod): the condition sparkgate's mark replaces (contract.demand_mark).
    gated_condition: int | None = None
    consumes: str | None = None  # the ProvisioningRequest it was released to consume (its annotation)

    @property
    def app(self) -> AppKey:
        return AppKey(self.namespace, self.app_id)

    @property
    def in_flight(self) -> bool:
        """Released, not being deleted, and Pending: Spark's own meaning of pending."""
        return not self.gated and not self.deleting and self.phase == "Pending"

    @property
    def bypassed(self) -> bool:
        """Live (Pending or Running, not being deleted), never gated and without sparkgate's profile
        annotation: admitted while the webhook was down or unreachable. It counts toward the limits."""
        return (
            not self.gated
            and self.profile is None
            and not self.deleting
            and self.phase in ("Pending", "Running")
        )


class RequestRecord(msgspec.Struct, frozen=True):
    """One of sparkgate's ProvisioningRequests (allocator/provisioning.py), as its conditions say:
    `state` pending (no verdict yet, or Accepted), provisioned (Provisioned=True), not-provisioned
    (Provisioned=False: cluster-autoscaler tries again), failed (Failed=True), expired (BookingExpired=True:
    the booking ran out or was consumed), revoked (CapacityRevoked=True)."""

    namespace: str
    name: str
    app_id: str
    class_name: str
    count: int
    state: str
    sequence: int  # from its name (contract.provisioning_name)
    message: str = ""  # the condition's that gives the state

    @property
    def active(self) -> bool:
        """It still stands for the app's held pods: one at a time per app."""
        return self.state in ("pending", "provisioned", "not-provisioned")


@dataclass(frozen=True, slots=True)
class DriverRecord:
    """A Spark driver pod (label spark-role=driver)."""

    namespace: str
    name: str
    uid: str
    app_id: str
    phase: str
    deleting: bool

    @property
    def finished(self) -> bool:
        return self.deleting or self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class Counts:
    """An app's executor pods by state, the one definition every reader uses (the decision's budgets, the
    registry's signs of life, /apps, the metrics): each pod is in exactly one of gated, in_flight, running
    and other (being deleted, or terminated); bypassed, failed and refused count across them (refused: in
    flight, unbound, and the scheduler said it cannot place it: pacing.py `refused`)."""

    gated: int = 0
    in_flight: int = 0
    running: int = 0
    other: int = 0
    bypassed: int = 0
    failed: int = 0
    refused: int = 0

    @staticmethod
    def of(pods: tuple[PodRecord, ...]) -> Counts:
        # PodRecord's `in_flight` and `bypassed` spelled out per branch (each view is counted once per change
        # of its app, a fifth of the loop's time at 10,000 pods with the properties called per pod; the
        # test compares this with the properties for every combination of the fields they read).
        gated = in_flight = running = other = bypassed = failed = refused = 0
        for pod in pods:
            phase = pod.phase
            if pod.deleting:
                other += 1
            elif pod.gated:
                gated += 1
            elif phase == "Pending":
                in_flight += 1
                bypassed += pod.profile is None
                refused += pod.unschedulable and pod.node is None
            elif phase == "Running":
                running += 1
                bypassed += pod.profile is None
            else:
                other += 1
            failed += phase == "Failed"
        return Counts(gated, in_flight, running, other, bypassed, failed, refused)

    @property
    def alive(self) -> bool:
        """A released pod is live (Pending or Running, not being deleted): a sign of life (registry.py)."""
        return self.in_flight + self.running > 0

    def by_state(self) -> dict[str, int]:
        """The states of the executors metric and of /apps."""
        return {
            "gated": self.gated,
            "in_flight": self.in_flight,
            "running": self.running,
            "other": self.other,
        }


@dataclass(frozen=True, slots=True)
class AppView:
    """Everything the cache knows about one application at one moment. Immutable: the cache hands out the
    same object until the app changes, and its counts and profile are taken once, when it is made."""

    key: AppKey
    pods: tuple[PodRecord, ...]  # executor pods, in the order the cache saw them (sort by executor_order)
    driver: DriverRecord | None  # None when the app has no driver pod (client mode) or it is gone
    driver_seen: bool  # a driver pod was seen at some point (so None means "gone", not "none")
    config_maps: frozenset[str]  # names of sparkgate's config map copies that exist for this app
    requests: tuple[RequestRecord, ...] = ()  # its ProvisioningRequests, oldest first
    templates: frozenset[str] = frozenset()  # its PodTemplates (named as their requests)
    counts: Counts = field(init=False, compare=False, repr=False)
    # The sparkgate profile named on the app's pods: the lowest executor id's that names one (the webhook
    # names the same on every pod of an app unless the policy changed meanwhile). What the decision applies
    # and what /apps shows on every replica, the leader's or not.
    profile: str | None = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "counts", Counts.of(self.pods))
        named: set[str | None] = {p.profile for p in self.pods if p.profile and p.profile != NO_PROFILE}
        if len(named) > 1:  # the policy changed while the app's pods were admitted: the lowest id's
            named = {min((p for p in self.pods if p.profile in named), key=executor_order).profile}
        object.__setattr__(self, "profile", named.pop() if named else None)

    @property
    def finished(self) -> bool:
        """The app is over: its driver finished, or was seen and is gone. Its gated pods are deleted."""
        return (self.driver is not None and self.driver.finished) or (
            self.driver is None and self.driver_seen
        )


def executor_order(pod: PodRecord) -> tuple[int, int, str]:
    """Executor id order, pods without an id last."""
    return (0, pod.exec_id, pod.name) if pod.exec_id is not None else (1, 0, pod.name)


@dataclass(frozen=True, slots=True)
class Snapshot:
    apps: Mapping[AppKey, AppView]
    sources: frozenset[str]  # source ConfigMaps that exist in the install namespace
    # Pods in flight per namespace, the sum of the apps' counts: kept up to date by whoever makes the
    # snapshot (the cache, the expectations) at the cost of the apps that changed; None: summed when asked.
    in_flight: Mapping[str, int] | None = None
    # A tracked snapshot (`Cache.snapshot(track=True)`, the loop's): its number among the tracked ones, and
    # the apps whose views were rebuilt or went since the tracked one before it. None: not tracked.
    sequence: int | None = None
    changed: frozenset[AppKey] | None = None

    def in_flight_by_namespace(self) -> Mapping[str, int]:
        if self.in_flight is not None:
            return self.in_flight
        per_namespace: Counter[str] = Counter()
        for key, view in self.apps.items():
            per_namespace[key.namespace] += view.counts.in_flight
        return per_namespace


class DeletionReason(StrEnum):
    """Why an executor pod went away; the label value of the deletions metric."""

    GATED = "deleted_while_gated"
    PENDING = "deleted_while_pending"
    RUNNING = "deleted_while_running"
    FAILED = "failed"
    OOM_KILLED = "oom_killed"
    EVICTED = "evicted"
    PREEMPTED = "preempted"
    SUCCEEDED = "succeeded"
    APP_FINISHED = "app_finished"
    ID_REUSE = "id_reuse_refused"
    STRANDED = "provisioning_stranded"


@dataclass(frozen=True, slots=True)
class DeletionRecord:
    exec_id: int | None
    pod: str
    node: str | None
    at: float  # unix seconds
    reason: DeletionReason
    exit_code: int | None = None
    detail: str | None = None  # container reason, e.g. "OOMKilled", or the event message


@dataclass
class AppMemory:
    """What the allocator remembers about an app between decisions (rebuilt on restart: decision.py
    `rebuilt_memory`). Every field is immutable (a decision changes a shallow copy: decision.py
    `_copy_memory`; the mappings are replaced whole, never changed in place). Times are on the monotonic
    clock (`Now`)."""

    last_release_at: float | None = None  # when it last released pods
    last_batch: frozenset[str] = frozenset()  # pod names of the last batch released (rebuilt: decision.py)
    # When the app last started waiting for room: its place in the line `decide` sorts by (oldest first).
    waiting_since: float | None = None
    waiting_said_at: float | None = None  # when its Waiting Event was last reported (decision.py)
    finished: bool = False
    pacing: Window | None = None  # the app's release window (allocator/pacing.py); None until first decided
    # Its released pods the scheduler refused, in flight, each with when it was first seen refused
    # (pacing.py `refusals`): what the refused-pod bound (unschedulableSeconds) is measured from.
    refused: Mapping[str, float] = field(default_factory=dict)
    # Its gated pods whose demand mark was handed to the actor, each with when (uid -> decision clock,
    # demand.py): not handed again until REFUSED_RETRY_SECONDS later, and then only if the watch shows no
    # mark (refused, skipped, or an answer lost before it landed). Pruned to the pods still gated at each
    # decision that marks.
    marked: Mapping[str, float] = field(default_factory=dict)
    # Its ProvisioningRequests (provisioning.py): the name of the one handed to the actor and when (until
    # the watch shows it); when a new one may be made after a failed one, and how many failed in a row.
    request_sent: tuple[str, float] | None = None
    request_pending: tuple[str, float] | None = (
        None  # its current request, without a verdict since (name, when)
    )
    request_retry_at: float | None = None
    request_failures: int = 0
    # Its older requests and templates handed to the actor for deletion, each with when (provisioning.py
    # `superseded`): not handed again until SENT_EXPIRY later, by when the watch has shown them gone.
    requests_deleted: Mapping[str, float] = field(default_factory=dict)


# --- actions -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Release:
    """Remove the sparkgate gate from this pod; `consume`: (request, class) it consumes, annotated in the same
    patch (allocator/provisioning.py)."""

    app: AppKey
    pod: PodRecord
    consume: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class CreateConfigMap:
    """Copy `source` (install namespace) to `name` in the app's namespace, owned by the driver if any."""

    app: AppKey
    source: str
    name: str
    owner: DriverRecord | None


@dataclass(frozen=True, slots=True)
class DeletePod:
    app: AppKey
    pod: PodRecord
    reason: DeletionReason


@dataclass(frozen=True, slots=True)
class DeleteConfigMap:
    app: AppKey
    name: str


@dataclass(frozen=True, slots=True)
class Event:
    """A Kubernetes Event on a pod; `key` names its series: reports of one key on one pod are one Event
    object whose count is patched (sparkgate/events.py)."""

    app: AppKey
    pod: str  # pod name in app.namespace
    pod_uid: str
    type: str  # "Normal" or "Warning"
    reason: str  # CamelCase, e.g. "Released", "Waiting", "BypassedWebhook", "SourceConfigMapMissing"
    message: str
    key: str
    count: int | None = None  # occurrences counted by the decision (an app's bypassed pods); None: one more


@dataclass(frozen=True, slots=True)
class MarkHeld:
    """Write sparkgate's PodScheduled=False/Unschedulable on a pod it holds (allocator/demand.py), so that the
    cluster autoscaler counts it; `why` says what holds it."""

    app: AppKey
    pod: PodRecord
    why: str


@dataclass(frozen=True, slots=True)
class CreateRequest:
    """Make the PodTemplate `name` from `pod` (a held executor, read when the action is carried out) and the
    ProvisioningRequest `name` of class `class_name` for `count` pods of it, owned by the driver if any."""

    app: AppKey
    name: str
    class_name: str
    count: int
    pod: PodRecord
    owner: DriverRecord | None


@dataclass(frozen=True, slots=True)
class DeleteRequest:
    """Delete the app's ProvisioningRequest `name` and its PodTemplate (each when it exists)."""

    app: AppKey
    name: str


Action = (
    Release | CreateConfigMap | DeletePod | DeleteConfigMap | Event | MarkHeld | CreateRequest | DeleteRequest
)
