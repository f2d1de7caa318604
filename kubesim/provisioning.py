"""cluster-autoscaler's handling of ProvisioningRequests (`--enable-provisioning-requests`), for the simulated
autoscaler (autoscaler.py), which calls these steps in the order of CA's loop:

1. `refresh`, at the start of each loop (processors/provreq/processor.go `refresh`): a request Provisioned
   for longer than the booking time (10 minutes, `defaultReservationTime`) gets BookingExpired=True
   (CapacityReservationTimeExpired); one neither Provisioned nor Failed for 7 days gets Failed=True (Expired).
2. `next_request`, a pod-list processor after the scheduling simulation (processors/provreq/injector.go
   `GetPodsFromNextRequest`): the first request of a supported class that is not Provisioned or Failed, or
   whose Provisioned=False is older than its backoff (1 minute, doubling up to 10: the flags
   `--provisioning-request-initial-backoff-time` / `-max-backoff-time`), is marked Accepted and its pods
   are injected into the pods to help. A request whose PodTemplate is missing gets Failed=True
   (FailedToCreatePods). Only one request a loop.
3. `book` (processor.go `bookCapacity`): for each Provisioned request not expired, its pods are put into
   the loop's snapshot, so the booked capacity is neither given to other pods nor scaled down; once as many
   pods annotated to consume it are bound to nodes as it asked for, it gets BookingExpired=True
   (CapacityBookingConsumed).
4. `check_capacity` / `best_effort_atomic`, the two classes' Provision (provisioningrequest/checkcapacity,
   besteffortatomic): check-capacity only packs the pods onto the snapshot (Provisioned=True
   CapacityIsFound, or Provisioned=False CapacityIsNotFound, or Failed=True when `parameters.noRetry` is
   "true"); best-effort-atomic drops the pods that fit, and asks for all the rest or nothing
   (Provisioned=True CapacityIsFound when nothing was needed, CapacityIsProvisioned after a scale-up,
   Provisioned=False CapacityIsNotFound when no node group can take them all).

Real pods annotated `autoscaling.x-k8s.io/consume-provisioning-request` are never helped by an ordinary
scale-up (processors/provreq/pods_filter.go): they are left to land on the capacity booked for them. The
booking exists only in CA's simulation; kube-scheduler (kubesim's scheduler) may place any pod there.

CA writes these conditions with an update of `provisioningrequests/status` (the atomic class with a
server-side apply of the status, field manager `cluster-autoscaler`: the same condition by type here).
CA never writes CapacityRevoked. Times compare the conditions' lastTransitionTime (whole seconds) with the
store's clock, as CA compares them with its own.

State: the backoff per request and `last_processed` belong to the autoscaler's thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import provreq
from .errors import ApiError
from .simulation import Snapshot
from .store import Obj, Store, now_rfc3339, rfc3339_seconds

WEEK = 7 * 24 * 3600.0


def timestamp(text: str | None) -> float:
    """An API timestamp (whole seconds) as unix seconds; 0 for none."""
    return rfc3339_seconds(text) if text else 0.0


@dataclass
class Injected:
    request: Obj
    pods: Sequence[Obj]


class Provisioning:
    def __init__(
        self,
        store: Store,
        *,
        booking_time: float = 600.0,
        initial_backoff: float = 60.0,
        max_backoff: float = 600.0,
        expiration: float = WEEK,
    ) -> None:
        self.store = store
        self.booking_time = booking_time
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.expiration = expiration
        self._backoff: dict[str, float] = {}  # request uid -> its next retry time (injector.go's LRU cache)
        self.last_processed = float("-inf")  # store clock: `LastProvisioningRequestProcessTime`

    # --- reading ---------------------------------------------------------------------------------------

    def _requests(self) -> list[Obj]:
        """Every request of a class CA supports (supported_classes.go), in namespace/name order."""
        try:
            requests, _, _ = self.store.list_objects("provisioningrequests")
        except ApiError:  # the CRD is not served
            return []
        supported = (provreq.CHECK_CAPACITY, provreq.BEST_EFFORT_ATOMIC)
        return sorted(
            (r for r in requests if (r.get("spec") or {}).get("provisioningClassName") in supported
             and not (r["spec"]["provisioningClassName"] == provreq.CHECK_CAPACITY
                      and (r["spec"].get("parameters") or {}).get("processorInstance"))),
            key=lambda r: (r["metadata"].get("namespace", ""), r["metadata"]["name"]),
        )  # fmt: skip

    def _templates(self, request: Obj) -> dict[str, Obj]:
        namespace = request["metadata"].get("namespace", "")
        found = {}
        for pod_set in request["spec"].get("podSets") or []:
            name = pod_set["podTemplateRef"]["name"]
            try:
                found[name] = self.store.get("podtemplates", namespace, name)
            except ApiError:
                continue
        return found

    def _write(self, request: Obj, *conditions: tuple[str, str, str, str]) -> Obj:
        """One update of the status with these (type, status, reason, message) conditions."""
        new = request
        for kind, status, reason, message in conditions:
            new = provreq.add_or_update_condition(
                new, kind, status, reason, message, now_rfc3339(self.store.clock)
            )
        meta = request["metadata"]
        try:
            return self.store.replace(
                "provisioningrequests", meta.get("namespace"), meta["name"], new, subresource="status"
            )
        except ApiError:  # deleted or changed meanwhile: CA logs the error and goes on
            return request

    # --- the loop's steps ------------------------------------------------------------------------------

    def refresh(self) -> None:
        now = self.store.clock()
        for request in self._requests():
            if provreq.is_true(request, provreq.BOOKING_EXPIRED) or provreq.is_true(request, provreq.FAILED):
                continue
            provisioned = provreq.condition(request, provreq.PROVISIONED)
            if provisioned is not None and provisioned.get("status") == "True":
                if timestamp(provisioned.get("lastTransitionTime")) + self.booking_time < now:
                    self._write(request, RESERVATION_EXPIRED)
            elif timestamp(request["metadata"].get("creationTimestamp")) + self.expiration < now:
                self._write(request, EXPIRED)

    def _available(self, request: Obj, now: float) -> bool:
        """injector.go `IsAvailableForProvisioning`."""
        uid = request["metadata"].get("uid", "")
        if provreq.is_true(request, provreq.FAILED) or provreq.is_true(request, provreq.PROVISIONED):
            self._backoff.pop(uid, None)
            return False
        provisioned = provreq.condition(request, provreq.PROVISIONED)
        if provisioned is None:
            return True
        if provisioned.get("status") != "False":
            return False
        retry = self._backoff.get(uid, self.initial_backoff)
        if timestamp(provisioned.get("lastTransitionTime")) + retry < now:
            self._backoff[uid] = min(2 * retry, self.max_backoff)
            return True
        return False

    def next_request(self) -> Injected | None:
        now = self.store.clock()
        for request in self._requests():
            if not self._available(request, now):
                continue
            templates = self._templates(request)
            missing = provreq.missing_templates(request, templates)
            self.last_processed = now
            if missing is not None:
                self._write(request, (provreq.FAILED, "True", provreq.FAILED_TO_CREATE_PODS, missing))
                continue
            return Injected(self._write(request, ACCEPTED), provreq.pods_for(request, templates))
        return None

    def book(self, snapshot: Snapshot, bound: Sequence[Obj]) -> None:
        consumed: dict[tuple[str, str], int] = {}
        for pod in bound:
            name = (pod["metadata"].get("annotations") or {}).get(provreq.CONSUME_ANNOTATION)
            if name:
                key = (pod["metadata"].get("namespace", ""), name)
                consumed[key] = consumed.get(key, 0) + 1
        for request in self._requests():
            if not provreq.is_true(request, provreq.PROVISIONED) or any(
                provreq.is_true(request, kind) for kind in (provreq.FAILED, provreq.BOOKING_EXPIRED)
            ):
                continue  # conditions.go `ShouldCapacityBeBooked`
            meta = request["metadata"]
            if consumed.get((meta.get("namespace", ""), meta["name"]), 0) >= provreq.pod_count(request):
                self._write(request, BOOKING_CONSUMED)
                continue
            templates = self._templates(request)
            if provreq.missing_templates(request, templates) is None:
                snapshot.place_all(provreq.pods_for(request, templates))

    def check_capacity(self, injected: Injected, snapshot: Snapshot) -> bool:
        """checkcapacity `checkCapacity`: True when the pods fit (then they stay in the snapshot). Accepted
        is written again with the outcome, in one update (`Provision`, then `updateRequests`)."""
        self.last_processed = self.store.clock()
        trial = snapshot.fork()
        if not trial.place_all(injected.pods):
            snapshot.nodes = trial.nodes
            self._write(injected.request, ACCEPTED, FOUND)
            return True
        if (injected.request["spec"].get("parameters") or {}).get("noRetry") == "true":
            failed = (
                provreq.FAILED,
                "True",
                provreq.CAPACITY_IS_NOT_FOUND,
                provreq.CAPACITY_NOT_FOUND_NO_RETRY_MSG,
            )
            self._write(injected.request, ACCEPTED, failed)
        else:
            self._write(injected.request, ACCEPTED, NOT_FOUND)
        return False

    def best_effort_atomic(
        self, injected: Injected, snapshot: Snapshot, scale_up: Callable[[Sequence[Obj]], bool]
    ) -> bool:
        """besteffortatomic `Provision`: `scale_up(pods)` asks for nodes for all the pods or none."""
        rest = snapshot.fork().place_all(injected.pods)
        if not rest:
            self._write(injected.request, FOUND)
            return False
        if scale_up(rest):
            self._write(injected.request, PROVISIONED)
            return True
        self._write(injected.request, NOT_FOUND)
        return False


# The conditions CA writes: (type, status, reason, message).
ACCEPTED = (provreq.ACCEPTED, "True", provreq.ACCEPTED, provreq.ACCEPTED_MSG)
FOUND = (provreq.PROVISIONED, "True", provreq.CAPACITY_IS_FOUND, provreq.CAPACITY_IS_FOUND_MSG)
PROVISIONED = (
    provreq.PROVISIONED,
    "True",
    provreq.CAPACITY_IS_PROVISIONED,
    provreq.CAPACITY_IS_PROVISIONED_MSG,
)
NOT_FOUND = (provreq.PROVISIONED, "False", provreq.CAPACITY_IS_NOT_FOUND, provreq.CAPACITY_IS_NOT_FOUND_MSG)
RESERVATION_EXPIRED = (
    provreq.BOOKING_EXPIRED,
    "True",
    provreq.RESERVATION_EXPIRED,
    provreq.RESERVATION_EXPIRED_MSG,
)
BOOKING_CONSUMED = (provreq.BOOKING_EXPIRED, "True", provreq.BOOKING_CONSUMED, provreq.BOOKING_CONSUMED_MSG)
EXPIRED = (provreq.FAILED, "True", provreq.EXPIRED, provreq.EXPIRED_MSG)
