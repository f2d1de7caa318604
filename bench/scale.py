"""Allocator scale: the production loop (`sparkgate allocator`'s `Controller`) fed Spark apps arriving, scaling
and ending, at 1,000, 10,000 and 100,000 executor pods (issue 19).

What runs is the allocator as `sparkgate allocator` assembles it (allocator/commands.py `assemble`), with its
own threads: the reflectors (`Reflector.run`: the production list and watch handling, each line parsed by
`sparkgate.kube._event`, the parser `Kube.watch` uses), the loop (`Controller.run`: cache snapshots, the work
queue, expectations, the registry, the decision, the metrics), and the actor with its own thread pools. Real
clocks: this is a wall-time benchmark. Leadership is held as bench/months.py holds it (`lead`), with no
leader thread. Replica "a" leads while the apps arrive; at the peak it stops and replica "b" takes over (it
lists the cluster and reads the histories, as a new leader does) and leads the teardown.

The stand-ins, in this process, no HTTP:
- `Cluster` answers the allocator's requests as kube-apiserver does: the gate removal is a JSON Patch applied
  to the stored pod's scheduling gates (a failed `test` answered 422 as kube-apiserver answers it), a
  deletion honours its uid precondition (409) and sets the pod's deletionTimestamp (MODIFIED), then deletes
  an unbound or terminated pod at once (grace 0), a bound one once the kubelet reports it (DELETED), creations of ConfigMaps and Events answer
  AlreadyExists, an Event PATCH answers 404 when the Event is unknown. Every accepted write appends the
  resulting watch event (the stored object with its new resourceVersion, serialized in one line) to the
  streams of the watchers whose selector matches; a reflector's `watch()` yields those lines as `Kube.watch`
  does. A write's answer is decoded as `Kube.request` decodes it (the only part of the HTTP client's work
  kept). Spark's part waits while the watches lag by more than STREAM_BUFFER events (back-pressure).
- The scheduler and the kubelets: at each turn of Spark's part, every pod released since the previous turn
  is bound (nodeName), every pod bound at the previous turn starts (Running), and every pod being deleted at
  the previous turn is gone (DELETED).
- Spark: a script generated up front (`script`) of drivers arriving (interleaved over the namespaces),
  executors created in Spark's batches, every fifth app scaling down (its five newest executors deleted,
  whatever their state) and up again (five new executor ids), and, once every executor runs (the peak),
  every app ending: its driver Succeeded, its executors deleted, its driver deleted. The executor pods are
  the captured Spark 4.3 executor pod admitted by the real webhook mutation (`admitted_pod`), each with its
  own name, uid, app id and executor id; the drivers are small pods.

Measured per size: watch events processed per second (wall time from the first event of a phase to the end
of the first loop step after its last event, arrival and teardown; the peak and the hand-over are
excluded), the loop's steps (`Controller.step` wrapped: `time.thread_time()` CPU, the step's own cost, and
wall, which includes waiting for the GIL; p50 / p99 / max; keys per step; the tick's steps apart), the
allocator's `/metrics` scrape at the peak through its real HTTP endpoint (allocator/http.py) by a process of its own, as Prometheus scrapes, and the
memory replica "b" holds at the peak once it has decided every app (up to --trace-up-to pods):
tracemalloc's traced bytes, traced from before it is assembled (the stand-in's allocations in that window are transient: the listed lines).
Up to CLASSIFIED_PODS, a snapshot also splits them by owner, each trace by its innermost frame of
allocator/, sparkgate/ or prometheus_client, or of this file (the stand-in), with the part its
reflectors' lists parsed apart.

Checked, failing the run (exit 1, the result written all the same): no pod released twice, every executor
alive at the peak released exactly once and running (in the stand-in and in the allocator's cache),
nothing tracked after the teardown (cache, memory, settings, ended apps, per-app metric series), and no
release that put more pods in flight than the policy's per-app, namespace or cluster limit. Gate removals
refused by their `test` (an attempt to release a pod again) are counted (`refused`), not fatal: the API
server keeps the pod released once.

Targets (issue 19): >= 10,000 events/s; p99 step <= 5 ms; <= 1 KB per tracked pod; scrape <= 200 ms at
100,000 pods; the per-event cost does not grow with the cluster.

    python -m bench.scale [--sizes 1000 10000 100000] [--smoke] [--trace-up-to PODS] [--profile FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import ctypes
import datetime as dt
import gc
import json
import logging
import math
import os
import queue
import re
import resource
import subprocess
import sys
import threading
import time
import tracemalloc
from array import array
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from allocator.commands import assemble
from allocator.http import StatusServer
from allocator.loop import Controller, Options
from allocator.metrics import AllocatorMetrics
from kubesim.errors import STALE
from sandbox import caps
from sparkgate import contract
from sparkgate.json_patch import PatchError, apply_patch
from sparkgate.kube import Conflict, Invalid, KubeError, NotFound, NotLeading, _event, decode
from sparkgate.mutation import mutate
from sparkgate.policy import Policy, load_policy
from sparkgate.ratelimit import TokenBucket

from . import common
from .common import Row, fmt
from .months import lead

NAME = "scale"
EVENTS_TARGET = 10_000.0
STEP_P99_TARGET_MS = 5.0
BYTES_PER_POD_TARGET = 1024.0
SCRAPE_TARGET_MS = 200.0
SCRAPE_TARGET_PODS = 100_000
FIXTURE = "etl-nightly-exec-1.admissionreview.json"
STREAM_BUFFER = 1024  # watch events not yet handled before Spark's part waits (back-pressure)
WAIT = 300.0  # seconds without progress before a run is declared stuck (a failure, never a pass)
SCALED = 5  # executors every fifth app deletes (then asks for again) while it ramps up
TRACE_FRAMES = 8
CLASSIFIED_PODS = 1_000  # up to this size, the traced memory is also split by owner (a snapshot)
OWN_CODE = ("/allocator/", "/sparkgate/", "/prometheus_client/")
PER_APP, PER_NAMESPACE, CLUSTER = 20, 100, 1000

POLICY = f"""\
apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation:
  batchSize: 10
  batchDelaySeconds: 0.5
  maxPendingPerApp: {PER_APP}
  maxPendingPerNamespace: {PER_NAMESPACE}
  maxPendingCluster: {CLUSTER}
  pacing: adaptive
  maxBatchSize: 20
caps:
  batchSize: 50
  maxPendingPerApp: 100
profiles:
  - name: analytics
    match:
      labels:
        team: analytics
    template:
      spec:
        tolerations:
          - key: spark
            operator: Exists
            effect: NoSchedule
    labels:
      sparkgate.io/tier: batch
"""

log = logging.getLogger("bench.scale")
Obj = dict[str, Any]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000], help="pods")
    parser.add_argument("--executors", type=int, default=20, help="per app")
    parser.add_argument("--apps-per-namespace", type=int, default=25)
    parser.add_argument("--spark-batch", type=int, default=10, help="executors a driver creates per turn")
    parser.add_argument("--turns", type=int, default=50, help="turns over which the apps arrive (and end)")
    parser.add_argument(
        "--trace-up-to",
        type=int,
        default=10_000,
        help="pods up to which the hand-over is traced (tracemalloc): the replica that lists 100,000 pods "
        "keeps every listed object alive (docs/performance.md), which tracing takes longer than the run; 0: never",
    )
    parser.add_argument(
        "--profile", type=Path, help="cProfile the loop thread of the timed pass; write pstats here"
    )


def admitted_pod(policy: Policy) -> Obj:
    """The captured executor pod as the API server stores it after the webhook's mutation."""
    review = json.loads((common.FIXTURES / FIXTURE).read_text())
    request = review["request"]
    pod: Obj = apply_patch(request["object"], mutate(request, policy).ops)
    if contract.gate_index(pod) is None:
        raise RuntimeError("the mutation did not gate the captured pod")
    return pod


def stamp(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the stored objects and their serialization ---------------------------------------------------------


# CPython's PyObject_GC_UnTrack: takes an object out of the cyclic garbage collector's lists (it is freed by
# its reference count as before). Safe for an object that can never be part of a reference cycle.
_gc_untrack = ctypes.pythonapi.PyObject_GC_UnTrack
_gc_untrack.argtypes = [ctypes.py_object]
_gc_untrack.restype = None
_Untracked = TypeVar("_Untracked")


def untracked(obj: _Untracked) -> _Untracked:
    """`obj`, which the cyclic GC will no longer scan (a stand-in pod: strings, numbers, None and a tuple of
    flat dicts). A production allocator's process holds no stand-in pods; tracked, they made each full
    collection walk 105,000 objects more at 100,000 pods."""
    _gc_untrack(obj)
    return obj


@dataclass(slots=True)
class PodState:
    """One pod as the stand-in API server stores it (what varies from pod to pod; the rest is the template)."""

    namespace: str
    name: str
    uid: str
    app_id: str
    exec_id: int
    driver: str
    driver_uid: str
    created: str
    gates: tuple[Obj, ...]  # a tuple of flat dicts, which CPython's GC stops tracking by itself
    executor: bool = True
    phase: str = "Pending"
    node: str | None = None
    deleting: str | None = None  # deletionTimestamp
    grace: int = 30  # deletionGracePeriodSeconds, once deleting
    releases: int = 0  # gate removals accepted

    @property
    def in_flight(self) -> bool:
        return not self.gates and self.phase == "Pending" and self.deleting is None

    @property
    def live(self) -> bool:
        return self.deleting is None


def _slot(name: str) -> str:
    return f"\x00{name}\x00"


class Template:
    """The admitted executor pod serialized once, with slots for what varies: rendering a watch event line is
    a join of ~20 strings, so the stand-in costs a few microseconds per event, not a `json.dumps` of 10 KB."""

    SLOT = re.compile(r'"\\u0000(\w+)\\u0000"(?::0,)?')

    def __init__(self, pod: Obj) -> None:
        obj = copy.deepcopy(pod)
        meta = obj["metadata"]
        for key in ("resourceVersion", "creationTimestamp", "uid", "deletionTimestamp"):
            meta.pop(key, None)
        meta.update(
            name=_slot("name"),
            namespace=_slot("namespace"),
            uid=_slot("uid"),
            resourceVersion=_slot("rv"),
            creationTimestamp=_slot("created"),
        )
        meta["labels"] = {
            **meta["labels"],
            contract.LABEL_APP_ID: _slot("app_id"),
            contract.LABEL_EXEC_ID: _slot("exec_id"),
        }
        meta["ownerReferences"] = [
            {**ref, "name": _slot("driver"), "uid": _slot("driver_uid")} if ref.get("controller") else ref
            for ref in meta.get("ownerReferences") or []
        ]
        obj["metadata"] = {_slot("deletion"): 0, **meta}  # first key: the optional deletion fields
        spec = obj["spec"]
        self.gates: list[Obj] = spec.pop("schedulingGates")
        spec.pop("nodeName", None)
        for container in spec["containers"]:
            for env in container.get("env") or []:
                if env.get("name") == "SPARK_EXECUTOR_ID":
                    env["value"] = _slot("exec_id")
                elif env.get("name") == "SPARK_APPLICATION_ID":
                    env["value"] = _slot("app_id")
        obj["spec"] = {_slot("placement"): 0, **spec}  # first key: nodeName and schedulingGates
        obj["status"] = _slot("status")
        text = json.dumps({"type": _slot("type"), "object": obj}, separators=(",", ":"))
        pieces = self.SLOT.split(text)
        self.literals = pieces[0::2]
        self.slots = pieces[1::2]

    def line(self, kind: str, pod: PodState, rv: int) -> bytes:
        values = {
            "type": f'"{kind}"',
            "name": f'"{pod.name}"',
            "namespace": f'"{pod.namespace}"',
            "uid": f'"{pod.uid}"',
            "rv": f'"{rv}"',
            "created": f'"{pod.created}"',
            "app_id": f'"{pod.app_id}"',
            "exec_id": f'"{pod.exec_id}"',
            "driver": f'"{pod.driver}"',
            "driver_uid": f'"{pod.driver_uid}"',
            "deletion": (
                f'"deletionTimestamp":"{pod.deleting}","deletionGracePeriodSeconds":{pod.grace},'
                if pod.deleting
                else ""
            ),
            "placement": (f'"nodeName":"{pod.node}",' if pod.node else "")
            + (f'"schedulingGates":{orjson.dumps(pod.gates).decode()},' if pod.gates else ""),
            "status": orjson.dumps(_pod_status(pod)).decode(),
        }
        out = [self.literals[0]]
        for slot, literal in zip(self.slots, self.literals[1:], strict=True):
            out.append(values[slot])
            out.append(literal)
        return "".join(out).encode()


def _pod_status(pod: PodState) -> Obj:
    """The status as its writers leave it: kube-apiserver's PodScheduled=False SchedulingGated condition on a
    pod created gated (pkg/registry/core/pod/strategy.go `applySchedulingGatedCondition`, left as it is when
    the gate goes), PodScheduled=True on bind (as kubesim/store.py `bind`), the kubelet's phase and states."""
    status: Obj = {"phase": pod.phase, "qosClass": "Burstable"}
    if pod.node:
        status["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    elif pod.executor:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
             "message": "Scheduling is blocked due to non-empty scheduling gates"}
        ]  # fmt: skip
    if pod.phase == "Running":
        status["containerStatuses"] = [
            {
                "name": contract.SPARK_CONTAINER_NAME,
                "ready": True,
                "state": {"running": {"startedAt": pod.created}},
            }
        ]
    elif pod.phase == "Succeeded":
        status["containerStatuses"] = [
            {"name": contract.SPARK_CONTAINER_NAME, "ready": False,
             "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": pod.created}}}
        ]  # fmt: skip
    return status


def driver_line(kind: str, pod: PodState, rv: int) -> bytes:
    obj = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": pod.name,
            "namespace": pod.namespace,
            "uid": pod.uid,
            "resourceVersion": str(rv),
            "creationTimestamp": pod.created,
            "labels": {contract.LABEL_ROLE: contract.ROLE_DRIVER, contract.LABEL_APP_ID: pod.app_id},
        },
        "spec": {"nodeName": pod.node, "containers": [{"name": "spark-kubernetes-driver", "image": "spark"}]},
        "status": _pod_status(pod),
    }
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode()


# --- the watch streams ------------------------------------------------------------------------------------


def _selected(labels: dict[str, str], selector: str | None) -> bool:
    """The label selector forms sparkgate's watches use: `k=v`, `k` (exists), `!k`, comma-separated."""
    for term in (selector or "").split(","):
        if not term:
            continue
        if term.startswith("!"):
            if term[1:] in labels:
                return False
        elif "=" in term:
            key, _, value = term.partition("=")
            if labels.get(key) != value:
                return False
        elif term not in labels:
            return False
    return True


@dataclass
class Stream:
    """One watcher's stream: the lines the API server sends it, in resourceVersion order."""

    path: str
    selector: str | None
    lines: queue.SimpleQueue[bytes | None] = field(default_factory=queue.SimpleQueue)
    appended: int = 0
    claimed: bool = False  # a watch() reads it
    consumed: int = 0  # events the reflector has handled (its handler returned)


# --- the API server, scheduler and kubelets ----------------------------------------------------------------


class Cluster:
    """kube-apiserver answering the allocator in process, with the scheduler and kubelets reduced to a bind,
    a start and a deletion's end per turn (`react`). Thread-safe: one lock over the stored objects and the
    resourceVersion; a line is appended to its streams under the lock, so every stream is in
    resourceVersion order. The allocator's writes are always answered at once; Spark's thread waits, before
    it takes the lock, while the watches lag by STREAM_BUFFER events (`wait_for_room`: a watch's
    back-pressure). Written by the actor's threads (its writes), the loop thread (the histories), Spark's
    thread (Spark, the scheduler and the kubelets); the streams are read by the reflectors' threads."""

    def __init__(self, template: Template) -> None:
        self.template = template
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # notified on every release
        self.rv = 1
        self.streams: list[Stream] = []
        self.pods: dict[tuple[str, str], PodState] = {}
        self.config_maps: dict[tuple[str, str], Obj] = {}
        self.events: dict[tuple[str, str], Obj] = {}
        self.released: list[PodState] = []  # gate removed, not bound yet (the scheduler's queue)
        self.bound: list[PodState] = []  # bound at the previous turn, not started yet
        self.terminating: list[PodState] = []  # deletionTimestamp set, not gone yet
        self.caps = caps.CapChecker(caps.Caps(PER_APP, PER_NAMESPACE, CLUSTER))  # at every executor change
        self.refused: Counter[str] = Counter()  # what the API server refused, by verb and reason
        self.refused_pods: list[str] = []  # the pods of the gate removals refused by their test
        self.writes: Counter[str] = Counter()
        self.by_type: Counter[str] = Counter()  # pod watch events sent: "<role> <type>"
        self.unstarted = 0  # live executors not Running yet (gated, released or bound)
        self.room = threading.Condition()  # Spark's thread waits here while the watches lag
        self.waiting_for_room = False
        # CPU seconds the stand-in spent answering the allocator's requests, in the allocator's threads
        # (`Client`): taken out of the allocator's CPU (`AllocatorCPU`).
        self.served_cpu = 0.0
        self._served_lock = threading.Lock()

    def served(self, cpu: float) -> None:
        with self._served_lock:
            self.served_cpu += cpu

    # --- the watch -------------------------------------------------------------------------------------

    @property
    def appended(self) -> int:
        return sum(s.appended for s in self.streams)

    def delivered(self) -> int:
        return sum(s.consumed for s in self.streams)

    def wait_for_room(self) -> None:
        """Spark's thread, holding no lock: wait while the watches lag by STREAM_BUFFER events or more, until
        they are down to half of it."""
        if self.appended - self.delivered() < STREAM_BUFFER:
            return
        with self.room:
            self.waiting_for_room = True
            room = self.room.wait_for(lambda: self.appended - self.delivered() < STREAM_BUFFER // 2, WAIT)
            self.waiting_for_room = False
        if not room:
            raise RuntimeError(f"stuck: the watches consumed nothing for {WAIT:.0f} s")

    def subscribe(self, path: str, selector: str | None) -> Stream:
        """A watcher's stream of `path` and `selector`, made before its reflector lists, so that no event
        is lost between its list and its watch (the reflector's `watch()` claims it)."""
        with self.lock:
            stream = Stream(path, selector)
            self.streams.append(stream)
            return stream

    def unsubscribe(self, streams: list[Stream]) -> None:
        """The watchers are gone: their streams end and get nothing more."""
        with self.lock:
            for stream in streams:
                stream.lines.put(None)
                self.streams.remove(stream)

    def _emit(
        self, resource: str, namespace: str, labels: dict[str, str], line: Callable[[int], bytes]
    ) -> bytes | None:
        """Under the lock: a new resourceVersion and the event line to every stream that selects it."""
        self.rv += 1
        data = None
        for stream in self.streams:
            parts = stream.path.strip("/").split("/")
            if parts[-1] != resource or (len(parts) > 3 and parts[3] != namespace):
                continue
            if _selected(labels, stream.selector):
                data = data or line(self.rv)
                stream.lines.put(data)
                stream.appended += 1
        return data

    @property
    def violations(self) -> list[str]:
        return self.caps.violations

    def emit_pod(self, kind: str, pod: PodState) -> bytes:
        """Under the lock: a pod's watch event, after the cap invariant has seen the change."""
        if pod.executor:
            state = caps.PodState(
                pod.namespace,
                pod.app_id,
                any(g.get("name") == contract.GATE for g in pod.gates),
                pod.node is not None,
                pod.phase == "Pending" and pod.deleting is None,
            )
            self.caps.change(pod.uid, None if kind == "DELETED" else state)
        role = contract.ROLE_EXECUTOR if pod.executor else contract.ROLE_DRIVER
        labels = {contract.LABEL_ROLE: role, contract.LABEL_APP_ID: pod.app_id}
        data = self._emit("pods", pod.namespace, labels, lambda rv: self.render(kind, pod, rv))
        self.by_type[f"{role} {kind}"] += 1
        return data if data is not None else self.render(kind, pod, self.rv)

    def render(self, kind: str, pod: PodState, rv: int) -> bytes:
        """The watch event line of a pod as stored, at resourceVersion `rv`."""
        return self.template.line(kind, pod, rv) if pod.executor else driver_line(kind, pod, rv)

    def _emit_cm(self, kind: str, obj: Obj) -> None:
        meta = obj["metadata"]
        line = lambda rv: json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode()  # noqa: E731
        self._emit("configmaps", meta["namespace"], meta.get("labels") or {}, line)

    def list(
        self, path: str, *, label_selector: str | None = None, page_size: int = 500
    ) -> tuple[list[Obj], str]:
        items, rv = self.list_pages(path, label_selector=label_selector, page_size=page_size)
        return list(items), rv

    def list_pages(
        self, path: str, *, label_selector: str | None = None, page_size: int = 500, shape: Any = None
    ) -> tuple[Iterator[Obj], str]:
        """As `Kube.list_pages`: each page of `page_size` pods rendered and parsed (by the production
        parser) as the reflector takes it. A page shows its pods as they are when it is read, not at the
        list's version as kube-apiserver's pages do; a difference only if a pod changes during the list,
        which the benchmark's one relist (the hand-over, Spark paused) never meets."""
        with self.lock:
            parts = path.strip("/").split("/")
            if parts[-1] == "pods":
                return self._pod_pages(list(self.pods.values()), label_selector, page_size, shape), str(
                    self.rv
                )
            if parts[-1] == "configmaps":
                items = copy.deepcopy(
                    [c for (ns, _), c in self.config_maps.items() if len(parts) <= 3 or ns == parts[3]]
                )
            else:
                items = []
            items = [o for o in items if _selected(o["metadata"].get("labels") or {}, label_selector)]
            return iter(items), str(self.rv)

    def _pod_pages(
        self, pods: list[PodState], selector: str | None, page_size: int, shape: Any
    ) -> Iterator[Obj]:
        """Listed pods, a page at a time, each let go once taken (Kube.list_pages)."""
        pods.reverse()
        while pods:
            with self.lock:
                lines = [self.render("", pods.pop(), self.rv) for _ in range(min(page_size, len(pods)))]
            page = [_event(line, shape)[1] for line in reversed(lines)]
            del lines
            while page:
                obj = page.pop()
                if _selected(obj["metadata"].get("labels") or {}, selector):
                    yield obj

    def watch(
        self,
        path: str,
        *,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
        shape: Any = None,
    ) -> Iterator[tuple[str, Obj]]:
        """As `Kube.watch`: each line parsed by `_event`; ends when the stream is closed."""
        with self.lock:
            stream = next(
                (s for s in self.streams if (s.path, s.selector, s.claimed) == (path, label_selector, False)),
                None,
            )
            if stream is None:
                stream = Stream(path, label_selector)
                self.streams.append(stream)
            stream.claimed = True
        while (line := stream.lines.get()) is not None:
            yield _event(line, shape)
            stream.consumed += 1
            if self.waiting_for_room and self.appended - self.delivered() < STREAM_BUFFER // 2:
                with self.room:
                    self.room.notify_all()

    # --- writes (sparkgate.kube.Kube's methods) -----------------------------------------------------------

    @staticmethod
    def _path(path: str) -> tuple[str, str, str]:
        parts = path.strip("/").split("/")  # api v1 namespaces NS RESOURCE [NAME]
        return parts[3], parts[4], parts[5] if len(parts) > 5 else ""

    def _refuse(self, verb: str, error: KubeError) -> KubeError:
        self.refused[f"{verb} {error.reason}"] += 1
        return error

    def patch(self, path: str, body: Any, content_type: str) -> bytes:
        """A pod's scheduling gates by JSON Patch (the actor's gate removal). kube-apiserver applies the patch
        to the stored object and answers 422 with no detail when an operation fails (its `test` included:
        staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go, as kubesim/store.py answers). Only
        patches of spec.schedulingGates are accepted here (the allocator sends no other)."""
        namespace, _, name = self._path(path)
        with self.lock:
            self.writes["patch pods"] += 1
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise self._refuse("patch", NotFound(404, "NotFound", f'pods "{name}" not found'))
            if content_type != "application/json-patch+json" or any(
                not str(op.get("path", "")).startswith("/spec/schedulingGates") for op in body
            ):
                raise self._refuse(
                    "patch", Invalid(422, "Invalid", "the stand-in patches spec.schedulingGates only")
                )
            try:
                patched = apply_patch({"spec": {"schedulingGates": list(pod.gates)}}, body)
                gates = tuple(patched["spec"]["schedulingGates"])
            except PatchError:
                self.refused_pods.append(
                    f"{pod.name}: released {pod.releases}, gates {pod.gates}, node {pod.node}, "
                    f"phase {pod.phase}, deleting {pod.deleting is not None}, patch {body}"
                )
                raise self._refuse(
                    "patch",
                    Invalid(422, "Invalid", "the server rejected our request due to an error in our request"),
                ) from None
            pod.gates = gates
            if not gates and pod.deleting is None:
                pod.releases += 1
                self.released.append(pod)
                self.changed.notify_all()
            return self.emit_pod("MODIFIED", pod)  # the answer: the client decodes it (`Client.patch`)

    def delete(self, path: str, *, preconditions: Any = None, grace_period: int | None = None) -> Obj:
        """A pod: the uid precondition (409 as kube-apiserver words it, kubesim/store.py
        `_check_preconditions`); every pod gets a deletionTimestamp first (MODIFIED), then an unbound or
        terminated one (grace 0) goes at once (DELETED) and a bound one when its kubelet reports it
        (pkg/registry/core/pod/strategy.go `CheckGracefulDelete`, registry/rest/delete.go `BeforeDelete`:
        two writes, as kubesim/store.py deletes). A ConfigMap goes at once."""
        namespace, resource, name = self._path(path)
        with self.lock:
            self.writes[f"delete {resource}"] += 1
            if resource == "pods":
                pod = self.pods.get((namespace, name))
                if pod is None:
                    raise self._refuse("delete", NotFound(404, "NotFound", f'pods "{name}" not found'))
                want = (preconditions or {}).get("uid")
                if want and want != pod.uid:
                    raise self._refuse(
                        "delete",
                        Conflict(
                            409,
                            "Conflict",
                            f'Operation cannot be fulfilled on Pod "{name}": the UID in the precondition '
                            f"({want}) does not match the UID in record ({pod.uid}). The object might have been "
                            "deleted and then recreated",
                        ),
                    )
                self.delete_pod(pod)
                return {}
            obj = self.config_maps.pop((namespace, name), None)
            if obj is None:
                raise self._refuse("delete", NotFound(404, "NotFound", f'configmaps "{name}" not found'))
            self._emit_cm("DELETED", obj)
            return {}

    def delete_pod(self, pod: PodState) -> None:
        """Under the lock: the graceful deletion of kube-apiserver (see `delete`)."""
        if pod.deleting is not None:
            return
        pod.grace = 0 if pod.node is None or pod.phase in ("Succeeded", "Failed") else 30
        pod.deleting = stamp(time.time() + pod.grace)
        if pod.executor and pod.phase != "Running":
            self.unstarted -= 1
        self.emit_pod("MODIFIED", pod)
        if pod.grace == 0:
            self._remove(pod)
        else:
            self.terminating.append(pod)

    def _remove(self, pod: PodState) -> None:
        del self.pods[(pod.namespace, pod.name)]
        self.emit_pod("DELETED", pod)

    def get(self, path: str) -> Obj:
        namespace, resource, name = self._path(path)
        with self.lock:
            obj = self.config_maps.get((namespace, name)) if resource == "configmaps" else None
            if obj is None:
                raise NotFound(404, "NotFound", f'{resource} "{name}" not found')
            return copy.deepcopy(obj)

    def create(self, path: str, body: Obj) -> Obj:
        namespace, resource, _ = self._path(path + "/x")
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        key = (namespace, meta["name"])
        with self.lock:
            self.writes[f"create {resource}"] += 1
            if resource != "configmaps":
                raise NotFound(404, "NotFound", f"the stand-in creates no {resource}")
            if key in self.config_maps:
                raise self._refuse(
                    "create", Conflict(409, "AlreadyExists", f'configmaps "{key[1]}" already exists')
                )
            meta.update(namespace=namespace, uid=f"cm-{self.rv}", creationTimestamp=stamp(time.time()))
            self.config_maps[key] = obj
            meta["resourceVersion"] = str(self.rv + 1)
            self._emit_cm("ADDED", obj)
            return copy.deepcopy(obj)

    def replace(self, path: str, body: Obj) -> Obj:
        namespace, resource, name = self._path(path)
        with self.lock:
            self.writes[f"update {resource}"] += 1
            if (namespace, name) not in self.config_maps:
                raise self._refuse("update", NotFound(404, "NotFound", f'{resource} "{name}" not found'))
            wanted = body["metadata"].get("resourceVersion")
            if wanted and wanted != self.config_maps[(namespace, name)]["metadata"].get("resourceVersion"):
                raise self._refuse(
                    "update",
                    Conflict(
                        409, "Conflict", f'Operation cannot be fulfilled on configmaps "{name}": {STALE}'
                    ),
                )
            obj = copy.deepcopy(body)
            obj["metadata"].update(namespace=namespace, resourceVersion=str(self.rv + 1))
            self.config_maps[(namespace, name)] = obj
            self._emit_cm("MODIFIED", obj)
            return copy.deepcopy(obj)

    def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        """Events (sparkgate/events.py: a POST creates one, a strategic-merge PATCH updates one, 404 when
        unknown); a GET of the Lease answers 404 (no leader thread: the elector's release finds none)."""
        if not path.startswith("/api/v1/namespaces/"):
            raise NotFound(404, "NotFound", f"{method} {path}: not served by the stand-in")
        namespace, resource, name = self._path(path + ("/" if path.endswith("events") else ""))
        body = kwargs.get("body") or {}
        with self.lock:
            self.writes[f"{method.lower()} {resource}"] += 1
            if resource == "events" and method == "POST":
                key = (namespace, body["metadata"]["name"])
                if key in self.events:
                    raise Conflict(409, "AlreadyExists", f'events "{key[1]}" already exists')
                self.events[key] = copy.deepcopy(body)
                return body
            if resource == "events" and method == "PATCH":
                event = self.events.get((namespace, name))
                if event is None:
                    raise self._refuse("patch", NotFound(404, "NotFound", f'events "{name}" not found'))
                event.update(body)
                return event
        raise NotFound(404, "NotFound", f"{method} {path}: not served by the stand-in")

    def gated(self, leading: Callable[[], bool], *, timeout: float) -> Client:
        return Client(self, leading=leading)  # answered at once: no request outlives the fence

    def limited(self, wait: Callable[[], object]) -> Client:
        return Client(self, wait=wait)

    # --- the scheduler and the kubelets -------------------------------------------------------------------

    def react(self) -> None:
        """One turn of the scheduler and kubelets: the pods deleted at the previous turn are gone, those
        bound at the previous turn start, those released since are bound."""
        with self.lock:
            for pod in self.terminating:
                self._remove(pod)
            self.terminating = []
            for pod in self.bound:
                if pod.deleting is None:
                    pod.phase = "Running"
                    self.unstarted -= 1
                    self.emit_pod("MODIFIED", pod)
            self.bound = []
            for pod in self.released:
                if pod.deleting is None:
                    pod.node = f"node-{hash(pod.uid) % 500}"
                    self.emit_pod("MODIFIED", pod)
                    self.bound.append(pod)
            self.released = []

    def settled(self) -> bool:
        """Under the lock: every live executor runs and nothing is being deleted."""
        return not self.terminating and not self.unstarted


Served = TypeVar("Served")


class Client:
    """`Kube.gated` / `Kube.limited` for the stand-in: each write asks `leading()` before and after it waits
    for the budget and is not sent (NotLeading) when it is false, as sparkgate/kube.py does; reads go
    through."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        leading: Callable[[], bool] | None = None,
        wait: Callable[[], object] | None = None,
    ) -> None:
        self.cluster, self.leading, self.wait = cluster, leading, wait

    def gated(self, leading: Callable[[], bool], *, timeout: float) -> Client:
        return Client(self.cluster, leading=leading, wait=self.wait)

    def limited(self, wait: Callable[[], object]) -> Client:
        return Client(self.cluster, leading=self.leading, wait=wait)

    def may_write(self) -> bool:
        return self.leading is None or self.leading()

    def _write(self, what: str) -> None:
        for waited in (False, True):  # asked before the budget (a lapsed replica spends no token) and after
            if not self.may_write():
                raise NotLeading(0, "NotLeading", f"{what} not sent: this replica does not lead")
            if self.wait is not None and not waited:
                self.wait()

    def _served(self, call: Callable[..., Served], *args: Any, **kwargs: Any) -> Served:
        """The stand-in API server answering in the caller's (an allocator) thread: its CPU is the server's."""
        cpu = time.thread_time()
        try:
            return call(*args, **kwargs)
        finally:
            self.cluster.served(time.thread_time() - cpu)

    def patch(self, path: str, body: Any, content_type: str, *, shape: Any = None) -> Obj:
        self._write(f"PATCH {path}")
        line = self._served(self.cluster.patch, path, body, content_type)
        answer = line[line.index(b'"object":') + 9 : -1]  # kube-apiserver answers with the object alone
        result: Obj = decode(answer, shape)  # the answer decoded as Kube.request decodes it: the client's
        return result

    def delete(self, path: str, **kwargs: Any) -> Obj:
        self._write(f"DELETE {path}")
        return self._served(self.cluster.delete, path, **kwargs)

    def create(self, path: str, body: Obj) -> Obj:
        self._write(f"POST {path}")
        return self._served(self.cluster.create, path, body)

    def replace(self, path: str, body: Obj) -> Obj:
        self._write(f"PUT {path}")
        return self._served(self.cluster.replace, path, body)

    def get(self, path: str) -> Obj:
        return self.cluster.get(path)

    def list(self, path: str, **kwargs: Any) -> tuple[list[Obj], str]:
        return self.cluster.list(path, **kwargs)

    def list_pages(self, path: str, **kwargs: Any) -> tuple[Iterator[Obj], str]:
        return self.cluster.list_pages(path, **kwargs)

    def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        if method != "GET":
            self._write(f"{method} {path}")
        return self._served(self.cluster.request, method, path, **kwargs)


# --- Spark ----------------------------------------------------------------------------------------------


@dataclass
class App:
    namespace: str
    app_id: str
    driver: PodState
    executors: list[PodState] = field(default_factory=list)
    next_id: int = 0


@dataclass(frozen=True)
class Op:
    """One thing Spark does: "driver" (arrives), "create" (n executors), "scale_down" (its n newest live
    executors deleted), "end" (driver Succeeded, executors deleted), "gone" (driver deleted)."""

    what: str
    app: int
    n: int = 0


def script(apps: int, executors: int, spark_batch: int, turns: int) -> tuple[list[list[Op]], list[list[Op]]]:
    """Spark's part, generated up front: (arrival turns, teardown turns). Apps arrive over `turns` turns;
    each creates `spark_batch` executors a turn until it has `executors`; every fifth, two turns after its
    last creation, scales down by SCALED and, a turn later, up again with new executor ids."""
    per_turn = max(1, math.ceil(apps / turns))
    arrival: dict[int, list[Op]] = {}
    for app in range(apps):
        turn = app // per_turn
        arrival.setdefault(turn, []).append(Op("driver", app))
        created = 0
        while created < executors:
            n = min(spark_batch, executors - created)
            arrival.setdefault(turn, []).append(Op("create", app, n))
            created += n
            turn += 1
        if app % 5 == 4:
            arrival.setdefault(turn + 1, []).append(Op("scale_down", app, SCALED))
            arrival.setdefault(turn + 2, []).append(Op("create", app, SCALED))
    teardown: dict[int, list[Op]] = {}
    for app in range(apps):
        turn = app // per_turn
        teardown.setdefault(turn, []).append(Op("end", app))
        teardown.setdefault(turn + 2, []).append(Op("gone", app))
    return [arrival[t] for t in sorted(arrival)], [teardown[t] for t in sorted(teardown)]


class Spark:
    """Spark's drivers, playing the script against the cluster, in the feeder thread."""

    def __init__(self, cluster: Cluster, apps: int, apps_per_namespace: int, gates: list[Obj]) -> None:
        self.cluster = cluster
        self.gates = gates  # the admitted pod's scheduling gates
        self.uids = 0
        now = stamp(time.time())
        self.apps: list[App] = []
        for i in range(apps):
            namespace, app_id = f"spark-team-{i // apps_per_namespace:03d}", f"spark-{i:08x}{'0' * 24}"
            driver = PodState(
                namespace, f"app-{i}-driver", self._uid(), app_id, 0, "", "", now, (), executor=False,
                phase="Running", node=f"node-{i % 500}",
            )  # fmt: skip
            self.apps.append(App(namespace, app_id, driver))

    def _uid(self) -> str:
        self.uids += 1
        return f"{self.uids:08x}-0000-4000-8000-000000000000"

    def play(self, op: Op) -> None:
        cluster, app = self.cluster, self.apps[op.app]
        with cluster.lock:
            if op.what == "driver":
                cluster.pods[(app.namespace, app.driver.name)] = app.driver
                cluster.emit_pod("ADDED", app.driver)
            elif op.what == "create":
                for _ in range(op.n):
                    app.next_id += 1
                    # Out of the cyclic GC, as the allocator's records are (allocator/model.py, gc=False).
                    pod = untracked(PodState(
                        app.namespace, f"app-{op.app}-exec-{app.next_id}", self._uid(), app.app_id, app.next_id,
                        app.driver.name, app.driver.uid, stamp(time.time()), tuple(copy.deepcopy(self.gates)),
                    ))  # fmt: skip
                    app.executors.append(pod)
                    cluster.unstarted += 1
                    cluster.pods[(pod.namespace, pod.name)] = pod
                    cluster.emit_pod("ADDED", pod)
            elif op.what == "scale_down":
                live = [p for p in app.executors if p.live]
                for pod in live[-op.n :]:
                    cluster.delete_pod(pod)
            elif op.what == "end":
                app.driver.phase = "Succeeded"
                cluster.emit_pod("MODIFIED", app.driver)
                for pod in app.executors:  # SparkContext.stop deletes its executors
                    if (pod.namespace, pod.name) in cluster.pods:
                        cluster.delete_pod(pod)
            elif op.what == "gone":
                cluster.delete_pod(app.driver)


# --- the allocator, and what is measured of it ----------------------------------------------------------


class Steps:
    """`Controller.step` wrapped: CPU (`thread_time`) and wall time, keys, whether a tick queued it; and how
    many watch events had been handled when each step began (so when an event was first decided on)."""

    def __init__(self, controller: Controller, cluster: Cluster) -> None:
        self.cpu, self.wall = array("d"), array("d")
        self.keys, self.tick = array("l"), array("b")
        self.cond = threading.Condition()
        self.covered = 0  # events handled before the last step began
        self.covered_at = 0.0  # when that step ended
        self.loop_thread: int | None = None
        self._in_step = False
        self._tick_pending = False
        step, add = controller.step, controller.queue.add

        def timed_step(keys: set[contract.AppKey]) -> None:
            delivered = cluster.delivered()
            tick, self._tick_pending = self._tick_pending, False
            self._in_step = True
            cpu, wall = time.thread_time(), time.perf_counter()
            try:
                step(keys)
            finally:
                self._in_step = False
                end = time.perf_counter()
                self.cpu.append(time.thread_time() - cpu)
                self.wall.append(end - wall)
                self.keys.append(len(keys))
                self.tick.append(tick)
                with self.cond:
                    self.covered, self.covered_at = delivered, end
                    self.cond.notify_all()

        def add_keys(keys: Any, delay: float = 0.0) -> None:
            # The loop thread adds keys outside a step only for its tick (Controller.run).
            if threading.get_ident() == self.loop_thread and not self._in_step:
                self._tick_pending = True
            add(keys, delay)

        controller.step = timed_step  # type: ignore[method-assign]
        controller.queue.add = add_keys  # type: ignore[method-assign]

    def wait(self, done: Callable[[], bool], what: str) -> None:
        """Block until `done()` holds after a step; a run stuck for WAIT seconds fails."""
        with self.cond:
            if not self.cond.wait_for(done, WAIT):
                raise RuntimeError(f"stuck: {what} not reached within {WAIT:.0f} s")

    def reset(self) -> None:
        for values in (self.cpu, self.wall, self.keys, self.tick):
            del values[:]


@dataclass
class Run:
    cluster: Cluster
    spark: Spark
    controller: Controller
    steps: Steps
    threads: list[threading.Thread]
    streams: list[Stream]
    server: StatusServer | None
    profiler: cProfile.Profile | None = None


def start(
    cluster: Cluster,
    spark: Spark,
    policy: Policy,
    identity: str,
    *,
    http: bool,
    profiler: cProfile.Profile | None,
) -> Run:
    """An allocator assembled as `sparkgate allocator` assembles it, leading, its threads started, synced
    (its reflectors have listed the cluster)."""
    options = Options(identity=identity)

    class Source:
        def current(self) -> Policy:
            return policy

    budget = TokenBucket(1e9, 1_000_000)  # the client-side budget's path, set above any pace reached here
    allocator = assemble(cluster, Source(), options, AllocatorMetrics(), write_budget=budget)  # type: ignore[arg-type]
    gc.freeze()  # as `sparkgate allocator` does once assembled (allocator/commands.py `run_allocator`)
    controller = allocator.controller
    lead(controller, True)
    steps = Steps(controller, cluster)

    def loop() -> None:
        steps.loop_thread = threading.get_ident()
        if profiler is not None:
            profiler.enable()
        try:
            controller.run()
        finally:
            if profiler is not None:
                profiler.disable()

    streams = [cluster.subscribe(r.path, r.label_selector) for r in controller.reflectors]
    for reflector in controller.reflectors:
        reflector.start()
    threads = [threading.Thread(target=loop, name="loop", daemon=True)]
    threads[0].start()
    server = None
    if http:
        server = StatusServer(controller, allocator.extender, "127.0.0.1", 0)
        server.start()
    steps.wait(lambda: controller.ready and steps.covered == cluster.delivered(), "the allocator ready")
    return Run(cluster, spark, controller, steps, threads, streams, server, profiler)


def stop(run: Run) -> None:
    run.controller.shutdown()
    run.cluster.unsubscribe(run.streams)
    for reflector in run.controller.reflectors:
        reflector.thread.join(timeout=WAIT)
    for thread in run.threads:
        thread.join(timeout=WAIT)
    if run.server is not None:
        run.server.stop()


def feed(run: Run, turns: list[list[Op]]) -> tuple[float, int]:
    """Play Spark's turns (the scheduler and kubelets reacting at each), then let the cluster settle: every
    live executor released, bound and running, every deletion over. (start time, events appended)."""
    cluster, spark = run.cluster, run.spark
    before, started = cluster.appended, time.perf_counter()
    for ops in turns:
        for op in ops:
            cluster.wait_for_room()
            spark.play(op)
        cluster.wait_for_room()
        cluster.react()
    while True:
        with cluster.lock:
            if cluster.settled():
                break
            # Pods still gated: wait for the allocator's next release (or its batch delay).
            idle = not cluster.released and not cluster.bound and not cluster.terminating
            if idle and not cluster.changed.wait(WAIT):
                gated = sum(1 for p in cluster.pods.values() if p.executor and p.gates)
                raise RuntimeError(f"stuck: {gated} pods still gated after {WAIT:.0f} s without a release")
        cluster.wait_for_room()
        cluster.react()
    return started, cluster.appended - before


class AllocatorCPU:
    """The CPU of the allocator's threads (every thread of this process but the main one, which plays Spark,
    the scheduler and the kubelets) from `__init__` to `seconds()`, the stand-in API server's answers to
    the allocator's requests taken out (they run in the allocator's threads here; in a cluster, in
    kube-apiserver): what the allocator itself spent, reflectors' parsing, loop and actor together."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.start = self._threads()
        self.served = cluster.served_cpu

    @staticmethod
    def _threads() -> dict[tuple[int, str], float]:
        out = {}
        for thread in threading.enumerate():
            if thread is threading.main_thread() or thread.ident is None:
                continue
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                out[thread.ident, thread.name] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        return out

    def seconds(self) -> tuple[float, Counter[str]]:
        """(the allocator's CPU seconds, its threads' by kind: reflector-NAME, loop, actor (the stand-in's
        answers included), actor-write (the same), histories, ...)."""
        by_kind: Counter[str] = Counter()
        for (ident, name), cpu in self._threads().items():
            by_kind[re.sub(r"_\d+$", "", name)] += cpu - self.start.get((ident, name), 0.0)
        return sum(by_kind.values()) - (self.cluster.served_cpu - self.served), by_kind


class Usage:
    """The whole process's getrusage over the timed phases (both replicas' and the stand-ins' threads): the
    kernel's part of the CPU and the context switches, per event. Threads that hand the GIL and their locks to
    one another pay for it in system time and switches, whatever code they run."""

    def __init__(self) -> None:
        self.spent = [0.0, 0.0, 0, 0]
        self.resume()

    @staticmethod
    def _now() -> tuple[float, float, int, int]:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime, r.ru_stime, r.ru_nvcsw, r.ru_nivcsw

    def resume(self) -> None:
        self.since = self._now()

    def pause(self) -> None:
        for i, (now, then) in enumerate(zip(self._now(), self.since, strict=True)):
            self.spent[i] += now - then

    def per_event(self, events: int) -> dict[str, float]:
        user, system, voluntary, involuntary = self.spent
        n = max(1, events)
        return {
            "user_us": round(user / n * 1e6, 1),
            "system_us": round(system / n * 1e6, 1),
            "voluntary_switches": round(voluntary / n, 2),
            "involuntary_switches": round(involuntary / n, 2),
        }


def processed(run: Run, what: str) -> float:
    """Block until a loop step began after every event appended so far was handled; when it ended."""
    cluster, steps = run.cluster, run.steps
    total = cluster.appended
    steps.wait(lambda: steps.covered >= total, what)
    return steps.covered_at


# The scraper: a process of its own, as Prometheus is (a client in this process would read the 7 MB answer
# while holding the GIL the allocator's HTTP thread needs to write it). It times one GET from the request to
# the last byte, and prints (seconds, bytes, series).
SCRAPER = """
import sys, time, urllib.request
started = time.perf_counter()
with urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])) as response:
    body = response.read()
seconds = time.perf_counter() - started
print(seconds, len(body), sum(1 for line in body.splitlines() if line and not line.startswith(b"#")))
"""


def scrape(run: Run, rounds: int = 5) -> dict[str, Any]:
    """The allocator's /metrics through its HTTP endpoint (allocator/http.py), `rounds` times, each by a
    scraper process of its own (`SCRAPER`)."""
    assert run.server is not None
    url = f"http://127.0.0.1:{run.server.port}/metrics"
    seconds, gc_seconds, size, series = [], [], 0, 0
    collecting: list[float] = []

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collecting.append(time.perf_counter())
        elif collecting:
            gc_seconds[-1] += time.perf_counter() - collecting.pop()

    gc.callbacks.append(timed)  # the collections during each scrape, whoever's allocations set them off
    try:
        for _ in range(rounds):
            gc_seconds.append(0.0)
            answer = subprocess.run(
                [sys.executable, "-c", SCRAPER, url, str(WAIT)],
                capture_output=True,
                text=True,
                check=True,
                timeout=WAIT * 2,
            )
            took, length, count = answer.stdout.split()
            seconds.append(float(took))
            size, series = int(length), int(count)
    finally:
        gc.callbacks.remove(timed)
    ms = [s * 1000 for s in seconds]
    # The first is the cold one: every series and every app's lines are formatted (later scrapes reuse
    # what did not change); each round is kept so the cold and the warm can be told apart, with the time
    # the cyclic GC took during it (this process's whole heap: the stand-in's objects too).
    return {
        "ms": _quantiles(ms),
        "rounds_ms": [round(m, 2) for m in ms],
        "rounds_gc_ms": [round(g * 1000, 2) for g in gc_seconds],
        "bytes": size,
        "series": series,
    }


def app_series(run: Run) -> int:
    return sum(1 for m in run.controller.metrics.families() for s in m.samples if "app" in s.labels)


def _peak_view(run: Run) -> dict[str, Any]:
    """What the allocator's cache shows at the peak, and what the stand-in holds."""
    views = run.controller.cache.snapshot().apps.values()
    tracked = [p for v in views for p in v.pods]
    with run.cluster.lock:
        live = [p for p in run.cluster.pods.values() if p.executor and p.live]
        return {
            "tracked_pods": len(tracked),
            "running_in_cache": sum(1 for p in tracked if p.phase == "Running" and not p.gated),
            "live_executors": len(live),
            "running": sum(1 for p in live if p.phase == "Running"),
            "released_once": sum(1 for p in live if p.releases == 1),
            "apps_tracked": len(views),
        }


def measure(template: Template, policy: Policy, pods: int, args: argparse.Namespace) -> dict[str, Any]:
    """One size: replica "a" leads while the apps arrive, to the peak (timed, then the scrape); it stops
    there and replica "b" takes over (a fail-over: it lists the cluster, reads the histories, decides every
    app), traced by tracemalloc from before it is assembled until it has decided every app: its memory is
    what a leader holds at the peak. Then "b" runs the teardown (timed, untraced)."""
    apps = pods // args.executors
    arrival, teardown = script(apps, args.executors, args.spark_batch, args.turns)
    cluster = Cluster(template)
    spark = Spark(cluster, apps, args.apps_per_namespace, template.gates)
    profiler = cProfile.Profile(time.thread_time) if args.profile is not None else None
    a = start(cluster, spark, policy, "a", http=True, profiler=profiler)
    try:
        a.steps.reset()
        cpu, allocator, usage = time.thread_time(), AllocatorCPU(cluster), Usage()
        began, events_in = feed(a, arrival)
        feeder_cpu = time.thread_time() - cpu
        ended = processed(a, "the peak")
        allocator_cpu, by_thread = allocator.seconds()
        usage.pause()
        peak = _peak_view(a)
        scraped = scrape(a)
    finally:
        stop(a)
    memory: dict[str, Any] = {}
    trace_off = pods > args.trace_up_to
    gc.collect()
    if not trace_off:
        tracemalloc.start(TRACE_FRAMES)
    try:
        b = start(cluster, spark, policy, "b", http=False, profiler=profiler)
        if not trace_off:
            b.steps.wait(lambda: any(b.steps.tick), "the new leader's first decision of every app")
            gc.collect()
            traced, most = tracemalloc.get_traced_memory()
            memory = {
                "tracked_pods": _peak_view(b)["tracked_pods"],
                "traced_bytes": traced,
                "bytes_per_pod": round(traced / max(1, pods), 1),
                # the most traced at once since b was assembled: its lists included (a page of whole
                # parsed pods at a time, and the stand-in's rendering of that page)
                "peak_traced_bytes": most,
                "peak_bytes_per_pod": round(most / max(1, pods), 1),
            }
            if pods <= CLASSIFIED_PODS:  # a snapshot's grouping is Python over every trace: small sizes only
                owned = _owned(tracemalloc.take_snapshot())
                memory["by_owner"] = owned | {
                    "allocator_bytes_per_pod": round(owned["allocator"] / max(1, pods), 1),
                    "list_bytes_per_pod": round(owned["list"] / max(1, pods), 1),
                    "outside_the_list_bytes_per_pod": round(
                        (owned["allocator"] - owned["list"]) / max(1, pods), 1
                    ),
                }
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    try:
        b.steps.reset()
        cpu, allocator = time.thread_time(), AllocatorCPU(cluster)
        usage.resume()
        down_began, events_out = feed(b, teardown)
        feeder_cpu += time.thread_time() - cpu
        processed(b, "the teardown")
        c = b.controller
        b.steps.wait(
            lambda: not c.cache.snapshot().apps and not c.memory and not c.settings and not c.ended,
            "nothing tracked after the teardown",
        )
        down_ended = b.steps.covered_at
        spent, down_by_thread = allocator.seconds()
        usage.pause()
        allocator_cpu += spent
        by_thread.update(down_by_thread)
        left = {
            "apps": len(c.cache.snapshot().apps),
            "memory": len(c.memory),
            "settings": len(c.settings),
            "ended": len(c.ended),
            "app_series": app_series(b),
        }
    finally:
        stop(b)
    if profiler is not None and args.profile is not None:
        profiler.dump_stats(str(args.profile))
    events = events_in + events_out
    seconds = (ended - began) + (down_ended - down_began)
    executors = [p for app in spark.apps for p in app.executors]
    return {
        "pods": pods,
        "apps": apps,
        "namespaces": -(-apps // args.apps_per_namespace),
        "executor_pods_created": len(executors),
        "events": events,
        "events_per_second": round(events / seconds, 1),
        "arrival": {
            "events": events_in,
            "seconds": round(ended - began, 3),
            "events_per_second": round(events_in / (ended - began), 1),
        },
        "teardown": {
            "events": events_out,
            "seconds": round(down_ended - down_began, 3),
            "events_per_second": round(events_out / (down_ended - down_began), 1),
        },
        "spark_and_kubelets_cpu_s": round(feeder_cpu, 3),
        # The allocator's own CPU in the two timed phases (AllocatorCPU), and the watch events one core of
        # it processes: what this process's wall-clock rate cannot show, its one GIL shared with the
        # stand-ins (the API server's answers, Spark, the kubelets).
        "allocator_cpu_s": round(allocator_cpu, 3),
        "allocator_cpu_per_event_us": round(allocator_cpu / max(1, events) * 1e6, 1),
        "events_per_allocator_cpu_second": round(events / allocator_cpu, 1) if allocator_cpu > 0 else None,
        "stand_in_served_cpu_s": round(cluster.served_cpu, 3),
        "allocator_threads_cpu_s": {k: round(v, 3) for k, v in by_thread.most_common()},
        "process_per_event": usage.per_event(events),
        **step_figures([a.steps, b.steps], events),
        "steps_until_peak": len(a.steps.wall),
        "peak": peak,
        "scrape": scraped,
        "memory": memory,
        "left_after_teardown": left,
        "released": sum(p.releases for p in executors),
        "released_twice": sum(1 for p in executors if p.releases > 1),
        "deleted_while_gated": sum(1 for p in executors if p.releases == 0),
        "pod_events": dict(cluster.by_type),
        "writes": dict(cluster.writes),
        "refused": dict(cluster.refused),
        "refused_gate_removals": cluster.refused_pods[:10],
        "violations": cluster.violations[:10],
        "violation_count": len(cluster.violations),
    }


def step_figures(recorded: list[Steps], events: int) -> dict[str, Any]:
    """The steps of both replicas' timed parts: the tick's steps apart from the others."""
    cpu = [x for s in recorded for x in s.cpu]
    wall = [x for s in recorded for x in s.wall]
    keys = [float(x) for s in recorded for x in s.keys]
    tick = [bool(x) for s in recorded for x in s.tick]
    rest = [i for i, t in enumerate(tick) if not t]
    ticks = [i for i, t in enumerate(tick) if t]
    return {
        "steps": len(wall),
        "events_per_step": round(events / max(1, len(rest)), 2),
        "step_cpu_ms": _quantiles([cpu[i] * 1000 for i in rest]),
        "step_wall_ms": _quantiles([wall[i] * 1000 for i in rest]),
        "keys_per_step": _quantiles([keys[i] for i in rest]),
        # Apps decided (the ticks' steps included) per watch event: what a decision-per-changed-app loop
        # keeps flat across sizes.
        "apps_decided_per_event": round(sum(keys) / max(1, events), 3),
        "tick_cpu_ms": _quantiles([cpu[i] * 1000 for i in ticks]) | {"count": len(ticks)},
        "tick_wall_ms": _quantiles([wall[i] * 1000 for i in ticks]),
        "loop_cpu_s": round(sum(cpu), 3),
    }


def _owned(snapshot: tracemalloc.Snapshot) -> dict[str, int]:
    """Traced bytes by owner: the allocator (innermost frame of its code or prometheus_client), the stand-in
    (innermost such frame is this file: the stored pods, the stream lines, the step records), other (no such
    frame within TRACE_FRAMES: the interpreter's own). "list": the part of the allocator's that its
    reflectors' lists parsed (`Cluster._pod_pages` stands in `Kube.list_pages`): the pods' strings its records
    share, and whatever keeps the listed objects alive."""
    this = str(Path(__file__).resolve())
    code = Cluster._pod_pages.__code__
    listing = {line for _, _, line in code.co_lines() if line is not None}
    out = {"allocator": 0, "list": 0, "stand-in": 0, "other": 0}
    for stat in snapshot.statistics("traceback"):
        owner = "other"
        for frame in stat.traceback:  # innermost first
            if frame.filename == this or "/bench/" in frame.filename:
                owner = "stand-in"
                break
            if any(part in frame.filename for part in OWN_CODE):
                owner = "allocator"
                break
        if owner == "allocator" and any(f.filename == this and f.lineno in listing for f in stat.traceback):
            out["list"] += stat.size
        out[owner] += stat.size
    return out


def _quantiles(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(common.percentile(values, 0.50), 4),
        "p99": round(common.percentile(values, 0.99), 4),
        "max": round(max(values, default=float("nan")), 4),
        "mean": round(sum(values) / len(values), 4) if values else float("nan"),
    }


def check(size: dict[str, Any]) -> list[str]:
    """What must hold in every run; each broken rule as a sentence."""
    problems = [f"{size['pods']} pods: {v}" for v in size["violations"]]
    peak, left = size["peak"], size["left_after_teardown"]
    name = f"{size['pods']:,} pods"
    if size["released_twice"]:
        problems.append(f"{name}: {size['released_twice']} pods released twice")
    if not peak["live_executors"] == peak["running"] == peak["released_once"] == size["pods"]:
        problems.append(f"{name}: at the peak not every executor was released once and running: {peak}")
    if peak["tracked_pods"] != size["pods"] or peak["running_in_cache"] != size["pods"]:
        problems.append(
            f"{name}: the allocator's cache did not show every executor running at the peak: {peak}"
        )
    if size["released"] + size["deleted_while_gated"] != size["executor_pods_created"]:
        problems.append(f"{name}: releases and gated deletions do not add up to the pods created")
    if any(left.values()):
        problems.append(f"{name}: left tracked after the teardown: {left}")
    return problems


def _void_run(hook: threading.ExceptHookArgs) -> None:
    """A thread of the allocator (its loop, its histories) or of the stand-in died: the run is void, and every
    wait of the main thread would otherwise last its WAIT seconds before failing. `sparkgate allocator` exits
    too when its loop ends (allocator/commands.py), and Kubernetes restarts it."""
    threading.__excepthook__(hook)
    name = hook.thread.name if hook.thread is not None else "?"
    print(f"# scale: thread {name} died: the run is void", file=sys.stderr, flush=True)
    os._exit(1)


def run(args: argparse.Namespace) -> dict[str, Any]:
    logging.basicConfig(level=logging.ERROR)
    threading.excepthook = _void_run  # this benchmark runs as its own process (python -m bench.scale)
    if args.smoke:
        # 10 apps a namespace: the namespace limit (100 in flight) binds, so its check has teeth.
        args.sizes, args.apps_per_namespace, args.turns = [200, 400], 10, 5
    policy = load_policy(POLICY)
    pod = admitted_pod(policy)
    template = Template(pod)
    sizes, problems = [], []
    for pods in args.sizes:
        print(f"# scale: {pods:,} pods ...", file=sys.stderr, flush=True)
        size = measure(template, policy, pods, args)
        problems += check(size)
        sizes.append(size)
        gc.collect()
    document = {
        "config": {
            "sizes": args.sizes,
            "executors_per_app": args.executors,
            "apps_per_namespace": args.apps_per_namespace,
            "spark_batch": args.spark_batch,
            "turns": args.turns,
            "pod_json_bytes": len(json.dumps(pod, separators=(",", ":"))),
            "stream_buffer": STREAM_BUFFER,
            "policy": POLICY,
        },
        "sizes": sizes,
        "targets": {
            "events_per_second_min": EVENTS_TARGET,
            "step_p99_ms_max": STEP_P99_TARGET_MS,
            "bytes_per_pod_max": BYTES_PER_POD_TARGET,
            "scrape_ms_max_at_100000": SCRAPE_TARGET_MS,
        },
        "problems": problems,
    }
    for problem in problems:
        print(f"# scale: CHECK FAILED: {problem}", file=sys.stderr)
    return document


def rows(result: dict[str, Any]) -> list[Row]:
    problems = result["problems"]
    out = [
        Row(
            "checks (released once, all ran, caps, nothing left)",
            f"{len(problems)} failed",
            "0",
            not problems,
        )
    ]
    for size in result["sizes"]:
        n = f"{size['pods']:,}"
        step, memory, usage = size["step_cpu_ms"], size.get("memory"), size["process_per_event"]
        out += [
            Row(
                f"{n} pods: apps / namespaces / events",
                f"{size['apps']:,} / {size['namespaces']} / {size['events']:,}",
            ),
            Row(
                f"{n} pods: watch events/s (arrival; teardown)",
                f"{fmt(size['events_per_second'], 0)} ({fmt(size['arrival']['events_per_second'], 0)}; "
                f"{fmt(size['teardown']['events_per_second'], 0)})",
                f">= {EVENTS_TARGET:,.0f}",
                size["events_per_second"] >= EVENTS_TARGET,
            ),
            Row(
                f"{n} pods: allocator CPU per watch event (its threads; the loop's) -> events per CPU-second",
                f"{size['allocator_cpu_per_event_us']:.1f} us ({size['loop_cpu_s'] / max(1, size['events']) * 1e6:.1f} us)"
                f" -> {fmt(size['events_per_allocator_cpu_second'] or 0, 0)}",
                f">= {EVENTS_TARGET:,.0f}",
                (size["events_per_allocator_cpu_second"] or 0) >= EVENTS_TARGET,
            ),
            Row(
                f"{n} pods: the process per watch event: user / system CPU; context switches (voluntary)",
                f"{usage['user_us']:.1f} / {usage['system_us']:.1f} us; {usage['voluntary_switches']:.2f}",
            ),
            Row(
                f"{n} pods: step CPU p50 / p99 / max (wall p99)",
                f"{step['p50']:.3f} / {step['p99']:.3f} / {step['max']:.1f} ms ({size['step_wall_ms']['p99']:.3f} ms)",
                f"p99 <= {STEP_P99_TARGET_MS:g} ms",
                step["p99"] <= STEP_P99_TARGET_MS,
            ),
            Row(
                f"{n} pods: keys per step p50 / max; tick CPU p50 ({size['tick_cpu_ms']['count']} ticks)",
                f"{size['keys_per_step']['p50']:.0f} / {size['keys_per_step']['max']:.0f}; "
                f"{size['tick_cpu_ms']['p50']:.1f} ms",
            ),
            Row(
                f"{n} pods: /metrics scrape at the peak p50 / max; first, GC in it ({size['scrape']['series']:,} series)",
                f"{size['scrape']['ms']['p50']:.1f} / {size['scrape']['ms']['max']:.1f}; "
                f"{size['scrape']['rounds_ms'][0]:.1f} ms (GC {size['scrape']['rounds_gc_ms'][0]:.1f} ms)",
                f"<= {SCRAPE_TARGET_MS:g} ms" if size["pods"] >= SCRAPE_TARGET_PODS else "",
                size["scrape"]["ms"]["max"] <= SCRAPE_TARGET_MS
                if size["pods"] >= SCRAPE_TARGET_PODS
                else None,
            ),
        ]
        if memory:
            out.append(
                Row(
                    f"{n} pods: allocator memory per tracked pod",
                    f"{memory['bytes_per_pod']:,.0f} B",
                    f"<= {BYTES_PER_POD_TARGET:,.0f} B",
                    memory["bytes_per_pod"] <= BYTES_PER_POD_TARGET,
                )
            )
            out.append(
                Row(
                    f"{n} pods: most traced at once by the new leader (its lists included), per pod",
                    f"{memory['peak_bytes_per_pod']:,.0f} B",
                )
            )
    return out


def main(argv: list[str] | None = None) -> int:
    """As `common.main`, and exit 1 when a check failed (the result is written all the same)."""
    module = sys.modules[__name__]
    document = common.execute(module, common.parser_for(module, __doc__).parse_args(argv))  # type: ignore[arg-type]
    print(common.table([(NAME, rows(document))]))
    return 1 if document["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
