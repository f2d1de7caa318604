"""Carrying out the allocator's decisions: every write sparkgate makes to the cluster goes through here.

- Release: one JSON Patch that `test`s the gate's entry, then removes it (other gates left alone). A 409 or
  422 (the pod changed: the test failed) or a 404 means the cache was stale: the app is re-decided from a
  fresher cache, never blindly retried. Every failed write (stale or refused: 403, 400...) makes the app's
  result not ok, and the work queue holds the app for its backoff before deciding it again. A release whose
  outcome is unclear (no answer, a 5xx, or a refusal after an attempt whose answer was lost:
  sparkgate/kube.py `maybe_applied`; or a defect of ours while it was being sent) is reported `unclear`: it
  stays released, unconfirmed, until the watch says (allocator/expectations.py), and the app does not back
  off for it. Each release of a pipelined run has its own outcome.
- Config maps: an immutable copy of the profile's source ConfigMap in the app's namespace, labelled as
  the app's and owned by its driver pod; a copy that already exists is fine. When a copy cannot be made,
  the app's releases in the same decision are dropped (its pods would not start).
- Deletions with a uid precondition, so a pod that was replaced is never deleted by mistake; a 404 after an
  attempt whose answer was lost is that deletion done.
- Demand marks (allocator/demand.py): PodScheduled=False/Unschedulable on a held pod through `pods/status`,
  a JSON Patch that tests the API server's SchedulingGated condition and the gate (a repeat after a lost
  answer fails its test: "unclear"). Pipelined like releases; never the app's outcome (no backoff): a
  refusal is logged once, an Event once, and the app's marks are skipped for demand.REFUSED_RETRY_SECONDS.
- ProvisioningRequests (allocator/provisioning.py): the PodTemplate made from the held executor (read by
  name) then the request, each a POST of a named object (AlreadyExists is done); deleted by name (not
  repeated after an unclear answer: the app's next decision deletes what is still there). A release that
  consumes a request carries the two annotations in its gate-removal patch.
- Kubernetes Events through sparkgate/events.py: one Event object per series (the action's key) whose count
  is patched, and a token bucket per pod, so a thousand-pod app does not flood the API server.
Transient API errors are retried with backoff inside sparkgate/kube.py, where a repeat is safe: each of the
writes here is one (the gate removal's test, the copy's name, the deletion's precondition), but a copy's
deletion (by name: a repeat after an unclear answer could delete a new copy) and an Event (best effort).

Only the leader writes, and leadership can lapse while actions wait or run (a hung API server: the Lease
not renewed within its renew deadline). So the actor's client is the leader's (`LeaderElector.gate`): every
write, each retry too, first checks leadership: once it has lapsed, the write is not sent, and the app's
remaining actions and every app's queued actions are dropped without a request (`AppResult.dropped`); the
next leader decides them again from the cluster.

One app's actions are carried out in order (its config maps exist before its pods are released); different
apps' actions run side by side on a few threads, so an app whose slot was just freed is not refilled only
after another app's whole batch of PATCHes (bench/refill.py measured that wait at ~200 ms). An app's run of
consecutive gate removals is pipelined: once its first PATCH went through (an app whose writes are refused
keeps sending one per backoff), the others go out side by side on the `writers` threads, which every app
shares, and the app goes on once they are all answered (bench/gates.py). The client-side request
budget (--kube-api-qps / --kube-api-burst) is the Kube's the actor is given. The actor's own state, the
Event recorder and when each gated pod was first seen (fed by the cache's pod observers, read by the
writers for the gate-removal latency), is under two leaf locks; an exception in one app's actions ends that
app's future, never another app's.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.events import EventRecorder
from sparkgate.kube import Conflict, Invalid, Kube, KubeError, NotFound, NotLeading, Unread

from . import demand
from .model import (
    Action,
    CreateConfigMap,
    CreateRequest,
    DeleteConfigMap,
    DeletePod,
    DeleteRequest,
    Event,
    MarkHeld,
    PodRecord,
    Release,
)

log = logging.getLogger(__name__)


def _pipelined(action: Action) -> bool:
    """Actions whose consecutive runs are sent side by side: gate removals and demand marks."""
    return isinstance(action, (Release, MarkHeld))


PARALLEL_APPS = 8  # apps whose actions are carried out at once
WRITERS = 16  # gate-removal PATCHes in flight at once, all apps together


@dataclass
class AppResult:
    """How one app's actions went: ok when every write went through or may have; the pods whose gate was
    removed, and those whose removal may have been applied (`unclear`: its answer was lost); wrote when a
    write other than an Event went through or may have; dropped when leadership lapsed before all of them
    were sent (the rest were not)."""

    ok: bool = True
    released: list[str] = field(default_factory=list)
    wrote: bool = False
    dropped: bool = False
    unclear: list[str] = field(default_factory=list)

    def add(self, other: AppResult) -> None:
        self.ok &= other.ok
        self.released += other.released
        self.wrote |= other.wrote
        self.dropped |= other.dropped
        self.unclear += other.unclear

    @property
    def outcome(self) -> bool | None:
        """What the work queue's `done` is told: False when a write failed (the app backs off), True when
        writes went through (its backoff is reset), None when only Events were sent. An app refused for good
        whose next decision only says it waits for room must keep its backoff: resetting it there let the
        refused writes resume at the base delay (the soak caught 11 writes where the backoff allows 8)."""
        if not self.ok:
            return False
        return True if self.wrote else None


class Actor:
    def __init__(
        self,
        kube: Kube,
        install_namespace: str,
        *,
        identity: str = contract.ALLOCATOR_SERVICE_ACCOUNT,
        clock: Callable[[], float] = time.time,
        on_release: Callable[[Release, float], None] | None = None,
        on_sending: Callable[[Release], None] | None = None,
        on_delete: Callable[[DeletePod], None] | None = None,
        parallel_apps: int = PARALLEL_APPS,
        writers: int = WRITERS,
        monotonic: Callable[[], float] = time.monotonic,
        on_gate_removed: Callable[[float], None] | None = None,
        on_mark: Callable[[MarkHeld, str], None] | None = None,
    ) -> None:
        self.kube = kube  # the leader's client (LeaderElector.gate), limited by the write budget
        self.install_namespace = install_namespace
        self.identity = identity
        self.clock = clock
        self.on_release = on_release  # (the release, when) once the API server accepted the gate removal
        # the release, before its PATCH is sent: its watch events may come before the PATCH returns
        self.on_sending = on_sending
        self.on_delete = on_delete
        self.events = EventRecorder(self.kube, identity=identity, wall=clock, monotonic=monotonic)
        self._pool = ThreadPoolExecutor(max_workers=parallel_apps, thread_name_prefix="actor")
        self._writes = ThreadPoolExecutor(max_workers=writers, thread_name_prefix="actor-write")
        self.monotonic = monotonic
        self.on_gate_removed = on_gate_removed  # seconds from a gated pod first seen to its gate's removal
        self._seen_lock = threading.Lock()
        self._seen: dict[str, float] = {}  # uid of each gated pod -> when the cache first showed it
        self.on_mark = on_mark  # (the mark, its outcome: written, stale, refused, unclear, skipped)
        # Apps whose demand mark the API server refused, and when (monotonic): their marks are not sent
        # again for demand.REFUSED_RETRY_SECONDS (under `_seen_lock`).
        self._mark_refused: dict[AppKey, float] = {}

    def submit(self, actions: Iterable[Action]) -> dict[AppKey, Future[AppResult]]:
        """Start carrying out `actions`, each app's in order, apps side by side; each app's future says
        whether all of its actions went through (not ok: its state was stale, or a write failed)."""
        by_app: dict[AppKey, list[Action]] = {}
        for action in actions:
            by_app.setdefault(action.app, []).append(action)
        return {app: self._pool.submit(self._app, group) for app, group in by_app.items()}

    def _app(self, actions: list[Action]) -> AppResult:
        """One app's actions in order, a run of releases side by side; not ok when one was stale or failed.
        After that, the app's remaining writes are dropped (its state is re-read and re-decided after its
        backoff, never blindly retried), and so are its releases when its config map could not be created
        (its pods would not start)."""
        result = AppResult()
        for pipelined, run in itertools.groupby(actions, key=lambda a: type(a) if _pipelined(a) else None):
            if result.dropped:
                log.info("not the leader any more: %s's remaining actions dropped", actions[0].app)
                break
            group = list(run)
            if pipelined is MarkHeld:  # whatever became of the releases: the marks test what they change
                result.add(self._marks([a for a in group if isinstance(a, MarkHeld)]))
                continue
            if pipelined is not None and len(group) > 1:
                # The first alone: an app whose writes are refused sends one per backoff, not a run.
                if result.ok:
                    result.add(self._attempt(group[0]))
                if result.ok and not result.dropped:
                    for done in [self._writes.submit(self._attempt, action) for action in group[1:]]:
                        result.add(done.result())
                continue
            for action in group:
                if result.dropped:
                    break
                if result.ok or isinstance(action, Event):
                    result.add(self._attempt(action))
        return result

    def _attempt(self, action: Action) -> AppResult:
        """One action, and how it went. Never raises: an exception is this action's outcome alone."""
        result = AppResult()
        try:
            self._one(action)
            if isinstance(action, Release):
                result.released.append(action.pod.uid)
            result.wrote = not isinstance(action, (Event, MarkHeld))
        except NotLeading as e:
            result.dropped = True  # not sent: the next leader decides it again from the cluster
            if e.maybe_applied:
                self._unclear(action, result, e)
        except KubeError as e:
            if e.maybe_applied and isinstance(action, Release):
                self._unclear(action, result, e)
            elif isinstance(e, (Conflict, Invalid, NotFound)):
                log.info(
                    "%s for %s was stale (%s); re-deciding",
                    type(action).__name__,
                    action.app,
                    e.reason or e.status,
                )
                result.ok = False
            else:
                log.warning("%s for %s failed: %s", type(action).__name__, action.app, e)
                result.ok = False
        except Exception as e:  # a defect, or an answer that is not JSON: whether it went out is not known
            log.exception("%s for %s: unexpected error", type(action).__name__, action.app)
            if isinstance(action, Release):
                self._unclear(action, result, e)
            elif isinstance(action, MarkHeld):
                self._marked(action, "unclear")  # never the app's outcome (`_marks`)
            else:
                result.ok = False
        return result

    def _marks(self, marks: list[MarkHeld]) -> AppResult:
        """An app's demand marks: the first alone, then the rest side by side, unless the first was refused
        (then none: one refusal per app, not one per pod). A mark's outcome is never the app's: a refused or
        stale mark makes it back off nothing, and it is not sent again (demand.py)."""
        result = AppResult()
        first = self._attempt(marks[0])
        result.dropped = first.dropped
        if len(marks) > 1 and not first.dropped:  # after a refusal each is `skipped` unsent (`mark`)
            for done in [self._writes.submit(self._attempt, action) for action in marks[1:]]:
                result.dropped |= done.result().dropped
        return result

    def _refused_marks(self, app: AppKey) -> bool:
        with self._seen_lock:
            at = self._mark_refused.get(app)
            if at is not None and self.monotonic() - at >= demand.REFUSED_RETRY_SECONDS:
                del self._mark_refused[app]
                at = None
        return at is not None

    def mark(self, action: MarkHeld) -> None:
        """Write sparkgate's condition on a held pod (contract.demand_mark). Its outcome goes to `on_mark`;
        a refusal is said once per app (a log line, an Event) and holds the app's next marks."""
        pod = action.pod
        if self._refused_marks(action.app):
            self._marked(action, "skipped")
            return
        if pod.gate_index is None or pod.gated_condition is None:
            self._marked(action, "stale")
            return
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock()))
        try:
            self.kube.patch(
                f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status",
                contract.demand_mark(pod.gate_index, pod.gated_condition, action.why, at),
                "application/json-patch+json",
                shape=Unread,
            )
        except NotLeading:
            raise
        except KubeError as e:
            if e.maybe_applied:
                self._marked(action, "unclear")
            elif isinstance(e, (Conflict, Invalid, NotFound)):
                self._marked(action, "stale")  # released, marked or gone meanwhile: left alone
            else:
                self._mark_refusal(action, e)
            return
        self._marked(action, "written")

    def _mark_refusal(self, action: MarkHeld, error: KubeError) -> None:
        with self._seen_lock:
            if len(self._mark_refused) >= 10_000:  # apps come and go: a bounded memory
                self._mark_refused.clear()
            self._mark_refused[action.app] = self.monotonic()
        self._marked(action, "refused")
        log.warning(
            "the demand mark of %s's held executors was refused (%s); its marks are not sent for %gs: "
            "the autoscaler sees only the executors sparkgate released (docs/operations.md)",
            action.app,
            error,
            demand.REFUSED_RETRY_SECONDS,
        )
        with contextlib.suppress(Exception):  # best effort: the log line and the metric have said it
            self.event(
                Event(
                    action.app,
                    action.pod.name,
                    action.pod.uid,
                    "Warning",
                    "DemandMarkRefused",
                    f"sparkgate could not mark the executors it holds for the cluster autoscaler: {error}. "
                    "The autoscaler sees only the executors sparkgate released.",
                    f"{action.app}/demand-refused",
                )
            )

    def _marked(self, action: MarkHeld, outcome: str) -> None:
        if self.on_mark is not None:
            self.on_mark(action, outcome)

    @staticmethod
    def _unclear(action: Action, result: AppResult, error: Exception) -> None:
        """A write that may have been applied: a release stays released, unconfirmed, until the watch says."""
        if isinstance(action, Release):
            log.info("%s of %s: outcome unclear (%s); the watch will say", action.pod.name, action.app, error)
            result.unclear.append(action.pod.uid)
            result.wrote = True
        else:
            result.ok = False

    def observe(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """A pod observer of the cache: when each gated pod was first seen, until its gate is gone."""
        with self._seen_lock:
            if old is not None and (new is None or not new.gated or new.uid != old.uid):
                self._seen.pop(old.uid, None)
            if new is not None and new.gated:
                self._seen.setdefault(new.uid, self.monotonic())

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._writes.shutdown(wait=True)

    def _one(self, action: Action) -> None:
        if isinstance(action, Release):
            self.release(action)
        elif isinstance(action, CreateConfigMap):
            self.create_config_map(action)
        elif isinstance(action, DeletePod):
            try:
                self.kube.delete(
                    f"/api/v1/namespaces/{action.app.namespace}/pods/{action.pod.name}",
                    preconditions={"uid": action.pod.uid},
                )
            except NotFound as e:
                if not e.maybe_applied:
                    raise  # gone before: the cache was stale; after a lost answer: the deletion was done
            if self.on_delete is not None:
                self.on_delete(action)
        elif isinstance(action, DeleteConfigMap):
            with contextlib.suppress(NotFound):
                self.kube.delete(f"/api/v1/namespaces/{action.app.namespace}/configmaps/{action.name}")
        elif isinstance(action, Event):
            self.event(action)
        elif isinstance(action, MarkHeld):
            self.mark(action)
        elif isinstance(action, CreateRequest):
            self.create_request(action)
        elif isinstance(action, DeleteRequest):
            self.delete_request(action)

    def release(self, action: Release) -> None:
        pod = action.pod
        if pod.gate_index is None:
            raise NotFound(404, "NotGated", f"pod {pod.name} carries no sparkgate gate")
        with self._seen_lock:  # read before the PATCH: its watch event may be observed before it returns
            seen = self._seen.get(pod.uid)
        if self.on_sending is not None:
            self.on_sending(action)
        self.kube.patch(
            f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}",
            contract.gate_removal(pod.gate_index)
            if action.consume is None
            else contract.consuming_release(pod.gate_index, *action.consume),
            "application/json-patch+json",
            shape=Unread,  # the answer is the whole pod; its watch event is what the cache reads
        )
        if seen is not None and self.on_gate_removed is not None:
            self.on_gate_removed(max(0.0, self.monotonic() - seen))
        if self.on_release is not None:
            self.on_release(action, self.clock())

    def create_config_map(self, action: CreateConfigMap) -> None:
        source = self.kube.get(f"/api/v1/namespaces/{self.install_namespace}/configmaps/{action.source}")
        meta: dict[str, Any] = {
            "name": action.name,
            "namespace": action.app.namespace,
            "labels": {
                contract.LABEL_APP_ID: action.app.app_id,
                contract.LABEL_ROLE: contract.ROLE_EXECUTOR,
                contract.LABEL_MANAGED_BY: contract.MANAGED_BY,
            },
            "annotations": {"sparkgate.io/source": f"{self.install_namespace}/{action.source}"},
        }
        if action.owner is not None:
            meta["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Pod", "name": action.owner.name, "uid": action.owner.uid}
            ]
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "immutable": True}
        for key in ("data", "binaryData"):
            if source.get(key):
                body[key] = source[key]
        try:
            self.kube.create(f"/api/v1/namespaces/{action.app.namespace}/configmaps", body)
        except Conflict as e:
            if e.reason != "AlreadyExists":
                raise

    def create_request(self, action: CreateRequest) -> None:
        """The PodTemplate, made from the held executor as the API server stored it, then the
        ProvisioningRequest for `count` pods of it (allocator/provisioning.py); one that exists is fine."""
        namespace = action.app.namespace
        pod = self.kube.get(f"/api/v1/namespaces/{namespace}/pods/{action.pod.name}")
        meta: dict[str, Any] = {
            "name": action.name,
            "namespace": namespace,
            "labels": {
                contract.LABEL_APP_ID: action.app.app_id,
                contract.LABEL_ROLE: contract.ROLE_EXECUTOR,
                contract.LABEL_MANAGED_BY: contract.MANAGED_BY,
            },
        }
        if action.owner is not None:
            meta["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Pod", "name": action.owner.name, "uid": action.owner.uid}
            ]
        template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": meta,
            "template": pod_template(pod),
        }
        request = {
            "apiVersion": "autoscaling.x-k8s.io/v1",
            "kind": "ProvisioningRequest",
            "metadata": meta,
            "spec": {
                "provisioningClassName": action.class_name,
                "podSets": [{"podTemplateRef": {"name": action.name}, "count": action.count}],
            },
        }
        try:  # each a POST of a named object: one that exists (a repeat, a former leader's) is done
            self.kube.create(f"/api/v1/namespaces/{namespace}/podtemplates", template)
        except Conflict as e:
            if e.reason != "AlreadyExists":
                raise
        try:
            self.kube.create(
                f"/apis/autoscaling.x-k8s.io/v1/namespaces/{namespace}/provisioningrequests", request
            )
        except Conflict as e:
            if e.reason != "AlreadyExists":
                raise

    def delete_request(self, action: DeleteRequest) -> None:
        """An app's request and its PodTemplate, each where it still exists."""
        namespace = action.app.namespace
        with contextlib.suppress(NotFound):
            self.kube.delete(
                f"/apis/autoscaling.x-k8s.io/v1/namespaces/{namespace}/provisioningrequests/{action.name}"
            )
        with contextlib.suppress(NotFound):
            self.kube.delete(f"/api/v1/namespaces/{namespace}/podtemplates/{action.name}")

    def event(self, action: Event) -> None:
        involved = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": action.pod,
            "namespace": action.app.namespace,
            "uid": action.pod_uid,
        }
        self.events.record(
            involved,
            type=action.type,
            reason=action.reason,
            message=action.message,
            series=action.key,
            count=action.count,
        )


# What a PodTemplate made from an executor leaves out: its node and scheduling gates (a template's pods are
# never bound or gated), and the pod's own identity and state (name, uid, owners, status); its labels stay (the
# scheduling simulation matches affinities on them), with its spec as admitted (resources, tolerations,
# nodeSelector, affinity: what decides where it fits).
_NOT_COPIED = ("nodeName", "schedulingGates")


def pod_template(pod: dict[str, Any]) -> dict[str, Any]:
    """The `template` (PodTemplateSpec) of a PodTemplate made from an executor pod."""
    labels = dict((pod.get("metadata") or {}).get("labels") or {})
    labels.pop(contract.LABEL_EXEC_ID, None)
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k not in _NOT_COPIED}
    return {"metadata": {"labels": labels}, "spec": spec}
