"""ProvisioningRequests: an app's held executors asked for from cluster-autoscaler as one batch.

cluster-autoscaler's own answer for batch work (`autoscaling.x-k8s.io/v1`, CA 1.30+ with
`--enable-provisioning-requests`; kubesim/provisioning.py follows it): a request names a PodTemplate and a
count; class `check-capacity.autoscaling.x-k8s.io` only says whether they fit, `best-effort-atomic-scale-up.
autoscaling.x-k8s.io` adds the nodes for all of them or none; `Provisioned=True` books the capacity for 10
minutes, the pods that consume it carry two annotations. With `provisioning: check-capacity` or
`best-effort-atomic-scale-up` in force for an app (docs/policy.md), and only where the API server serves the
API (discovery, at the allocator's start: otherwise the condition alone, allocator/demand.py, said once in the
log and by `sparkgate status`), the allocator:

- makes a request when the app holds executors (when demand.py would mark them: at once when its refused pods
  hold it, else after DEMAND_AFTER_SECONDS without a release): a PodTemplate made from a held executor (its
  spec as admitted, less the node, the gates and the pod's identity) and a request for all the pods it holds,
  named `sg-<app>-pr<n>` (contract.provisioning_name), labelled as the app's config-map copies are and owned
  by its driver. Under best-effort-atomic-scale-up the held pods are not marked as well: cluster-autoscaler
  would scale up twice for them (once for the request, once for the pods; YuniKorn writes reason
  SchedulingSkipped where it wants the autoscaler to stay away, sparkgate leaves them SchedulingGated, which
  it ignores);
- holds the app's gated pods while its request is not provisioned (waiting reason `provisioning`), and
  releases the pods it covers once `Provisioned=True`, each annotated to consume it in the same patch as the
  gate's removal (contract.consuming_release), within every limit (the caps still hold). A check-capacity
  request that found no capacity (`Provisioned=False`) holds nothing: that class never adds nodes, so the
  app is paced as without a request and its held pods are marked for the autoscaler's ordinary scale-up
  (demand.py), while cluster-autoscaler keeps checking the request; held until then, an app on a cluster
  that must grow would wait for good;
- one request at a time: a new one when the current one is consumed (as many pods released to it as it
  counted) and the app holds more (dynamic allocation asked for more), or its booking expired
  (`BookingExpired`) or its capacity was revoked (`CapacityRevoked`) with pods still held; after `Failed`,
  the next one waits a backoff (1 minute, doubling per failure in a row, at most 10; CA's own backoff for a
  request it could not provision), and meanwhile the app is paced as without a request. Each new request
  deletes the app's older ones and their templates;
- a request that gets no verdict for UNANSWERED_SECONDS (a cluster-autoscaler without
  `--enable-provisioning-requests`, or none at all) no longer holds the app: it is paced as without a
  request, its held pods marked (waiting reason as without a request; the requests gauge shows it pending);
- only the newest request and template of an app stand (`superseded`): an older one the watch shows is
  deleted, whenever it shows (handed to the actor once per SENT_EXPIRY: the watch shows the deletion well
  before). Deleted as a new one is made, an old request can still come back: a create whose answer was lost
  is repeated (a named create is safe to repeat, sparkgate/kube.py), and the first attempt, still queued in
  the API server, may land after the delete that followed the repeat (seen in a busy kubesim run). Left
  standing, it would book nodes for no pod and keep its refused consumers from being `stranded`;
- a pod released to consume a request that kube-scheduler refused, once the request no longer books
  capacity for it (expired, revoked, failed or deleted), is deleted (`stranded`, deletion reason
  `provisioning_stranded`): another pod took the node booked for it, and cluster-autoscaler never scales up
  for a pod annotated to consume a request; Spark makes a new executor pod in its place;
- an app's requests and templates end with it (decision.py `_finish`, as its copies do), or as soon as the
  policy no longer sets a class for it (`provisioning: none`, the runbook's way out of a request that never
  provisions: docs/operations.md): any replica's watch finds them by their labels, so a new leader deletes
  those of an app that ended before or after it took over.

Pure: the decision's clock, the app's view (its requests and templates, from the cache's watches) and memory
(`request_sent`, `request_pending`, `request_retry_at`, `request_failures`, `requests_deleted`, owned by the
loop thread like the rest).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.policy import Allocation

from . import demand
from .model import Action, AppMemory, AppView, CreateRequest, DeleteRequest, PodRecord, RequestRecord

SENT_EXPIRY = 60.0  # a request handed to the actor that the watch has not shown by then was not made
BACKOFF = 60.0  # before a new request after a failed one; doubles per failure in a row
MAX_BACKOFF = 600.0
# A request with no verdict (neither Provisioned nor Failed) this long: cluster-autoscaler most likely does not
# run with --enable-provisioning-requests (the API server serving the CRD does not say it does), or is down.
# It takes one request per loop (about 10 s), so this is some 60 apps' requests ahead of it.
UNANSWERED_SECONDS = 600.0


@dataclass(frozen=True)
class Plan:
    """What an app's requests allow: `room` gated pods may be released now (None: no bound of theirs), each
    consuming `consume` (request, class); `why` the app waits when room is 0."""

    room: int | None = None
    consume: tuple[str, str] | None = None
    why: str | None = None
    unanswered: bool = False  # its request got no verdict in UNANSWERED_SECONDS: paced and marked without it


def in_force(allocation: Allocation, served: bool) -> bool:
    """A class is set for the app and the API server serves ProvisioningRequests."""
    return served and allocation.provisioning != "none"


def scales_up(allocation: Allocation) -> bool:
    """The class adds nodes for the request (best-effort-atomic-scale-up): the held pods are then not marked
    as well, or cluster-autoscaler would scale up twice for them. check-capacity only books the capacity that
    is there: the held pods are marked as without a request, for its ordinary scale-up."""
    return allocation.provisioning == "best-effort-atomic-scale-up"


def current(app: AppView) -> RequestRecord | None:
    """The app's request that still stands for its held pods: the newest, unless it ended or was consumed.
    Consumed means as many pods released to it as it asked for, and every one of them placed: until then the
    app releases nothing else. kube-scheduler knows nothing of the booking, so a pod of the app released
    without the annotation could take a booked node, and the consumer it displaced would wait for good:
    cluster-autoscaler never scales up for a pod annotated to consume a request
    (processors/provreq/pods_filter.go `ProvisioningRequestPodsFilter.Process` drops every one of them)."""
    if not app.requests:
        return None
    latest = app.requests[-1]
    if not latest.active:
        return None
    if latest.state == "provisioned" and _consumed(app, latest) >= latest.count and _placed(app, latest):
        return None
    return latest


def _consumed(app: AppView, request: RequestRecord) -> int:
    return sum(1 for p in app.pods if p.consumes == request.name)


def _placed(app: AppView, request: RequestRecord) -> bool:
    """No pod released to consume the request waits for a node (each is bound, ended or being deleted)."""
    return all(
        p.node is not None or p.deleting or p.phase != "Pending"
        for p in app.pods
        if p.consumes == request.name
    )


def plan(app: AppView, mem: AppMemory, now: float) -> Plan:
    """How the app's requests bound its releases now (the app has a class in force)."""
    sent = mem.request_sent
    if sent is not None and (any(r.name == sent[0] for r in app.requests) or now - sent[1] > SENT_EXPIRY):
        mem.request_sent = sent = None  # shown by the watch (or never made: a new one may be)
    if sent is not None:
        return Plan(0, None, f"ProvisioningRequest {sent[0]} is being made")
    request = current(app)
    if request is None or request.state != "pending":
        mem.request_pending = None
    if request is None:
        return Plan()
    if request.state == "pending":
        if mem.request_pending is None or mem.request_pending[0] != request.name:
            mem.request_pending = (request.name, now)
        if now - mem.request_pending[1] >= UNANSWERED_SECONDS:
            return Plan(unanswered=True)
    if request.state == "provisioned":
        mem.request_failures, mem.request_retry_at = 0, None
        room = max(0, request.count - _consumed(app, request))
        waits = f"executors released to consume ProvisioningRequest {request.name} not placed yet"
        return Plan(room, (request.name, request.class_name), None if room else waits)
    if (
        request.state == "not-provisioned"
        and request.class_name == contract.PROVISIONING_CLASSES["check-capacity"]
    ):
        return Plan()  # no capacity to book: paced as without a request (its pods marked: `scales_up`)
    said = f": {request.message}" if request.message else ""
    return Plan(
        0,
        None,
        f"ProvisioningRequest {request.name} ({request.count} executors) not provisioned yet by the cluster "
        f"autoscaler ({request.state}{said})",
    )


def requests(
    key: AppKey,
    app: AppView,
    held: Sequence[PodRecord],
    scope: str | None,
    allocation: Allocation,
    mem: AppMemory,
    now: float,
) -> tuple[list[Action], float | None]:
    """A new request for the pods the app holds, when one is due (the app has a class in force), with the
    deletion of its older requests and templates; and when to decide it again for one (None: not for this)."""
    if not held or mem.request_sent is not None or current(app) is not None:
        return [], None
    latest = app.requests[-1] if app.requests else None
    if latest is not None and latest.state == "failed":
        if mem.request_retry_at is None:
            mem.request_failures += 1
            mem.request_retry_at = now + min(MAX_BACKOFF, BACKOFF * 2 ** (mem.request_failures - 1))
        if now < mem.request_retry_at:
            return [], mem.request_retry_at
    ready = demand.ready_at(scope if scope in demand.COUNTED else None, mem)
    if ready is None or now < ready:
        return [], ready
    mem.request_retry_at = None
    sequence = 1 + max(
        [r.sequence for r in app.requests] + [contract.provisioning_sequence(t) for t in app.templates] + [0]
    )
    name = contract.provisioning_name(key.app_id, sequence)
    mem.request_sent = (name, now)
    old = {r.name for r in app.requests} | app.templates
    mem.requests_deleted = dict.fromkeys(old, now)
    out: list[Action] = [DeleteRequest(key, n) for n in sorted(old)]
    owner = app.driver if app.driver is not None and not app.driver.finished else None
    out.append(
        CreateRequest(
            key, name, contract.PROVISIONING_CLASSES[allocation.provisioning], len(held), held[0], owner
        )
    )
    return out, None


def superseded(app: AppView, mem: AppMemory, now: float) -> list[Action]:
    """The deletion of the app's requests and templates older than its newest (by the sequence in their
    names), each not handed to the actor in the last SENT_EXPIRY."""
    names = {r.name: r.sequence for r in app.requests} | {
        t: contract.provisioning_sequence(t) for t in app.templates
    }
    newest = max(names.values(), default=0)
    stale = sorted(n for n, s in names.items() if s < newest)
    sent = mem.requests_deleted
    due = [n for n in stale if n not in sent or now - sent[n] >= SENT_EXPIRY]
    if due or sent.keys() - set(stale):
        mem.requests_deleted = {n: sent[n] for n in stale if n in sent} | dict.fromkeys(due, now)
    return [DeleteRequest(app.key, n) for n in due]


def stranded(app: AppView) -> list[PodRecord]:
    """The app's pods released to consume a request that no longer books capacity for them (expired,
    revoked, failed or deleted) and that kube-scheduler refused: cluster-autoscaler never scales up for a pod
    annotated to consume a request (processors/provreq/pods_filter.go), so each would wait for good. This
    happens when another pod took the node booked for it (kube-scheduler knows nothing of bookings). Deleted:
    Spark makes a new executor pod in its place, which sparkgate holds and shows to the autoscaler anew."""
    booking = {r.name for r in app.requests if r.state in ("pending", "provisioned", "not-provisioned")}
    return [
        p
        for p in app.pods
        if p.consumes is not None
        and p.consumes not in booking
        and p.unschedulable
        and p.node is None
        and not p.gated
        and not p.deleting
        and p.phase == "Pending"
    ]


def finished(app: AppView) -> list[Action]:
    """An app that is over, or no longer asks for requests: its requests and templates go."""
    return [DeleteRequest(app.key, n) for n in sorted({r.name for r in app.requests} | app.templates)]
