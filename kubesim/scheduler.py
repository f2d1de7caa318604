"""kube-scheduler, simulated: binds schedulable pods to nodes that fit them, first come first served, calling
scheduler extenders as kube-scheduler does.

A pod is schedulable when it has no scheduling gates, no node, no deletionTimestamp and is Pending (a gated
pod is invisible to the real scheduler: https://kubernetes.io/docs/concepts/scheduling-eviction/pod-scheduling-readiness/),
and when a configured profile serves its `spec.schedulerName` (a pod for a scheduler nobody runs stays
Pending, as on a real cluster). Pods are taken in the order they became schedulable.

One scheduling attempt follows pkg/scheduler/schedule_one.go (kube-scheduler 1.36):
- Filter plugins, in the default order, the first failure giving the node's reason: TaintToleration
  (NoSchedule/NoExecute taints), NodeAffinity (nodeSelector), NodeResourcesFit (the pod's requests, sum of
  its containers or the largest init container, against allocatable CPU, memory and pod count minus the live
  pods' requests);
- then each extender of the profile in turn (`findNodesThatPassExtenders`): it gets the feasible nodes'
  names (`nodeCacheCapable`) or objects, answers the nodes that pass and FailedNodes /
  FailedAndUnresolvableNodes (node -> reason); an error, a timeout or a non-200 answer fails the attempt
  unless the extender is `ignorable`;
- one feasible node is taken at once; several are scored: NodeResourcesFit's LeastAllocated (CPU and memory,
  `(allocatable - requested) * 100 / allocatable` each, averaged), plus each extender's prioritize scores as
  `score * weight * (MaxNodeScore 100 / MaxExtenderPriority 10)` (`prioritizeNodes`; a prioritize error
  gives no score). The highest total wins, ties going to the first node in name order (the real scheduler
  picks among ties at random);
- no feasible node: the FitError message of pkg/scheduler/framework/types.go, `0/3 nodes are available: 1
  Insufficient cpu, 2 <extender's reason>.` (reasons counted, sorted, joined) then the PostFilter messages
  of DynamicResources and DefaultPreemption, `no new claims to deallocate, preemption: 0/3 nodes are
  available: ...` (nothing here has a lower priority: no victims, or "Preemption is not helpful for
  scheduling" on unresolvable nodes), as 1.35 clusters write them, goes into a FailedScheduling Warning event from the profile and
  the pod's `PodScheduled=False` condition, reason Unschedulable (SchedulerError when an extender failed).
  The event and condition are written when the message changes (the real event recorder aggregates
  repeats into a series).
Bind latency and a maximum bind rate are configurable.
"""

from __future__ import annotations

import collections
import contextlib
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import ids
from .errors import ApiError
from .quantities import cpu_millis, memory_bytes
from .store import Obj, Store, now_rfc3339

Key = tuple[str, str]
DEFAULT_SCHEDULER = "default-scheduler"
MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
UNRESOLVABLE = "unresolvable"  # UnschedulableAndUnresolvable: preemption cannot help on that node


def pod_requests(pod: Obj) -> tuple[int, int]:
    spec = pod.get("spec") or {}

    def total(containers: list[Obj]) -> tuple[int, int]:
        cpu = mem = 0
        for c in containers:
            requests = (c.get("resources") or {}).get("requests") or {}
            cpu += cpu_millis(requests.get("cpu", "0"))
            mem += memory_bytes(requests.get("memory", "0"))
        return cpu, mem

    cpu, mem = total(spec.get("containers") or [])
    for init in spec.get("initContainers") or []:
        icpu, imem = total([init])
        cpu, mem = max(cpu, icpu), max(mem, imem)
    return cpu, mem


def tolerates(pod: Obj, taint: Obj) -> bool:
    if taint.get("effect") not in ("NoSchedule", "NoExecute"):
        return True
    for t in (pod.get("spec") or {}).get("tolerations") or []:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t.get("key") == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def node_misfit(
    pod: Obj, requests: tuple[int, int], node: Obj, room: tuple[int, int, int]
) -> tuple[tuple[str, ...], str] | None:
    """The first failing filter plugin's (reasons, code) for this node, None when the pod fits: TaintToleration,
    NodeAffinity (nodeSelector), NodeResourcesFit against `room` (free cpu millis, memory bytes, pods).
    kube-scheduler's filters, and cluster-autoscaler's scheduling simulation, which runs the same plugins."""
    labels = node["metadata"].get("labels") or {}
    if not all(tolerates(pod, t) for t in (node.get("spec") or {}).get("taints") or []):
        return ("node(s) had untolerated taint(s)",), UNRESOLVABLE
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return ("node(s) didn't match Pod's node affinity/selector",), UNRESOLVABLE
    cpu, mem = requests
    c, m, n = room
    reasons = tuple(
        text
        for short, text in (
            (n < 1, "Too many pods"),
            (c < cpu, "Insufficient cpu"),
            (m < mem, "Insufficient memory"),
        )
        if short
    )
    return (reasons, "unschedulable") if reasons else None


def schedulable(pod: Obj) -> bool:
    spec, meta = pod.get("spec") or {}, pod["metadata"]
    return (
        not spec.get("schedulingGates")
        and not spec.get("nodeName")
        and not meta.get("deletionTimestamp")
        and (pod.get("status") or {}).get("phase") == "Pending"
    )


def live(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


@dataclass(frozen=True)
class Extender:
    """One entry of KubeSchedulerConfiguration.extenders (the fields kubesim honours)."""

    url_prefix: str
    filter_verb: str = "filter"
    prioritize_verb: str = "prioritize"
    weight: int = 1
    node_cache_capable: bool = True
    ignorable: bool = False
    http_timeout: float = 5.0  # the real default

    @classmethod
    def from_config(cls, entry: Obj, url_prefix: str | None = None) -> Extender:
        """An entry of KubeSchedulerConfiguration.extenders, its defaults as kube-scheduler's (weight 1,
        httpTimeout 5s); `url_prefix` replaces the configured one (a Service name outside a cluster)."""
        return cls(
            url_prefix=url_prefix or entry["urlPrefix"],
            filter_verb=entry.get("filterVerb", ""),
            prioritize_verb=entry.get("prioritizeVerb", ""),
            weight=int(entry.get("weight", 1)),
            node_cache_capable=bool(entry.get("nodeCacheCapable", False)),
            ignorable=bool(entry.get("ignorable", False)),
            http_timeout=go_duration(entry.get("httpTimeout", "5s")),
        )

    def call(self, verb: str, args: Obj) -> Any:
        """POST ExtenderArgs to <urlPrefix>/<verb> (extender.go `send`): the decoded answer, or ExtenderError."""
        url = self.url_prefix.rstrip("/") + "/" + verb
        request = urllib.request.Request(
            url, json.dumps(args).encode(), {"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.http_timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            raise ExtenderError(f"failed {verb} with extender at URL {url}, code {e.code}") from None
        except (OSError, ValueError) as e:
            raise ExtenderError(f'Post "{url}": {e}') from None


class ExtenderError(Exception):
    pass


def go_duration(text: str) -> float:
    """A metav1.Duration as kube-scheduler's configuration writes it ("500ms", "1s", "1m30s"), in seconds."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(n) * units[u] for n, u in parts)


def _field(document: Any, name: str) -> Any:
    """A field of a Go-decoded answer: Go matches JSON names to fields case-insensitively."""
    if not isinstance(document, dict):
        return None
    return next((v for k, v in document.items() if str(k).lower() == name.lower()), None)


@dataclass
class Attempt:
    """The outcome of one scheduling attempt."""

    node: str | None = None
    message: str = ""
    reason: str = "Unschedulable"  # or SchedulerError


# node -> (the reasons its filter failed with, the status code): a plugin may give several reasons
# (noderesources/fit.go: one per insufficient resource), each counted on its own by FitError.Error.
Statuses = dict[str, tuple[tuple[str, ...], str]]


def fit_error(total: int, statuses: Statuses) -> str:
    """FitError.Error() followed by DefaultPreemption's message: each node's reasons counted one by one
    (pkg/scheduler/framework/types.go: `for _, reason := range status.Reasons() { reasons[reason]++ }`)."""
    counts = collections.Counter(reason for reasons, _ in statuses.values() for reason in reasons)
    message = (
        f"0/{total} nodes are available: " + ", ".join(sorted(f"{n} {r}" for r, n in counts.items())) + "."
    )
    preemption = collections.Counter(
        "Preemption is not helpful for scheduling"
        if code == UNRESOLVABLE
        else "No preemption victims found for incoming pod"
        for _, code in statuses.values()
    )
    return (
        message
        + f" no new claims to deallocate, preemption: 0/{total} nodes are available: "
        + ", ".join(sorted(f"{n} {r}" for r, n in preemption.items()))
        + "."
    )


class Scheduler:
    def __init__(
        self,
        store: Store,
        *,
        profiles: Mapping[str, Sequence[Extender]] | None = None,
        bind_latency: float = 0.0,
        max_bind_rate: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.profiles: dict[str, tuple[Extender, ...]] = {
            name: tuple(extenders) for name, extenders in (profiles or {DEFAULT_SCHEDULER: ()}).items()
        }
        self.bind_latency = bind_latency
        self.max_bind_rate = max_bind_rate
        self.clock = clock
        self.binds = 0
        self.attempts = 0  # pods evaluated against the nodes: the scheduler's work (kube-scheduler's
        # scheduling attempts), which grows with every unschedulable pod retried on each cluster change
        self._queue: collections.OrderedDict[Key, None] = collections.OrderedDict()
        # The most pods the scheduler had waiting at once (ungated, unbound, Pending, not being deleted, of a
        # profile it serves): what a cap on pending pods bounds. Written by the store's dispatching thread.
        self.peak_pending = 0
        self._unschedulable: dict[Key, str] = {}  # the last failure message written for each pod
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubesim-scheduler", daemon=True)
        self._unsubscribe: Callable[[], None] | None = None
        self._nodes: dict[str, Obj] = {}
        self._allocatable: dict[str, tuple[int, int]] = {}
        # Each pod's (cpu, memory) requests by uid, computed once as the real scheduler's PodInfo does (a
        # pod's resources cannot change: podrules.check_update); forgotten when the pod is deleted. Written
        # by the scheduler thread, popped by the store's dispatching thread.
        self._requests: dict[str, tuple[int, int]] = {}
        # What the pods bound to each node request, kept from the store's events as kube-scheduler's cache
        # keeps its NodeInfos (pkg/scheduler/backend/cache): a wake costs per node, not per pod of the
        # cluster. `_placed` is each live bound pod's (node, cpu, memory) by uid, `_used` their sums per
        # node; `_seen_rv` the last pod event applied, `_bound_rv` the scheduler's own last bind: a wake
        # waits until its binds are in (the assumed pods of kube-scheduler's cache). Written by the store's
        # dispatching thread and read by the scheduler thread, under `_cache`.
        self._cache = threading.Condition()
        self._placed: dict[str, tuple[str, int, int]] = {}
        self._used: dict[str, tuple[int, int, int]] = {}
        self._seen_rv = 0
        self._bound_rv = 0

    def start(self) -> None:
        self._unsubscribe = self.store.subscribe(self._on_event)
        pods, _, _ = self.store.list_objects("pods")
        for pod in pods:
            self._on_event("ADDED", "pods", pod)
        self._thread.start()

    def stop(self) -> None:
        if self._unsubscribe:
            self._unsubscribe()
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def add_profile(self, name: str, extenders: Sequence[Extender] = ()) -> None:
        """Serve (or reconfigure) a scheduler name; its pods waiting already are queued at once."""
        self.profiles[name] = tuple(extenders)
        pods, _, _ = self.store.list_objects("pods")
        for pod in pods:
            self._on_event("MODIFIED", "pods", pod)
        self._wake.set()

    def reset_peak_pending(self) -> None:
        """Start counting `peak_pending` again from the pods waiting now (a benchmark's phase)."""
        self.peak_pending = len(self._queue)

    def describe(self) -> str:
        alive = "running" if self._thread.is_alive() else "NOT RUNNING"
        return (
            f"{alive}, {len(self._queue)} queued, {len(self._unschedulable)} unschedulable, "
            f"{self.binds} binds, {self.attempts} attempts"
        )

    def serves(self, pod: Obj) -> bool:
        return ((pod.get("spec") or {}).get("schedulerName") or DEFAULT_SCHEDULER) in self.profiles

    def _on_event(self, kind: str, resource: str, obj: Obj) -> None:
        if resource == "pods":
            key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            if kind != "DELETED" and schedulable(obj) and self.serves(obj):
                if key not in self._queue:
                    self._queue[key] = None
                    self.peak_pending = max(self.peak_pending, len(self._queue))
            else:
                self._queue.pop(key, None)
                self._unschedulable.pop(key, None)
            if kind == "DELETED":
                self._requests.pop(obj["metadata"].get("uid", ""), None)
            self._account(kind, obj)
            if kind == "DELETED" or not live(obj) or key in self._queue:
                self._wake.set()
        elif resource == "nodes":
            self._wake.set()

    def _account(self, kind: str, pod: Obj) -> None:
        """A pod event into the per-node sums: a live pod bound to a node counts there until it ends."""
        meta = pod["metadata"]
        uid = meta.get("uid", "")
        node = (pod.get("spec") or {}).get("nodeName")
        placed = (node, *self._requests_of(pod)) if node and kind != "DELETED" and live(pod) else None
        with self._cache:
            previous = self._placed.pop(uid, None)
            if previous is not None:
                self._add(previous, -1)
            if placed is not None:
                self._placed[uid] = placed
                self._add(placed, 1)
            self._seen_rv = max(self._seen_rv, int(meta.get("resourceVersion") or 0))
            self._cache.notify_all()

    def _add(self, placed: tuple[str, int, int], sign: int) -> None:
        node, cpu, mem = placed
        c, m, n = self._used.get(node, (0, 0, 0))
        self._used[node] = (c + sign * cpu, m + sign * mem, n + sign)

    def _run(self) -> None:
        next_bind = 0.0
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            free = self._free_capacity()
            for key in list(self._queue):
                if self._stop.is_set():
                    return
                try:
                    pod = self.store.get("pods", key[0], key[1])
                except ApiError:
                    self._queue.pop(key, None)
                    continue
                if not schedulable(pod):
                    self._queue.pop(key, None)
                    continue
                self.attempts += 1
                attempt = self._schedule(pod, free)
                if attempt.node is None:
                    self._mark_unschedulable(key, pod, attempt)
                    continue
                node = attempt.node
                if self.max_bind_rate:
                    wait = next_bind - self.clock()
                    if wait > 0 and self._stop.wait(wait):
                        return
                    next_bind = max(next_bind, self.clock()) + 1.0 / self.max_bind_rate
                if self.bind_latency and self._stop.wait(self.bind_latency):
                    return
                try:
                    bound = self.store.bind(key[0], key[1], node)
                except ApiError:
                    continue
                with self._cache:
                    self._bound_rv = int(bound["metadata"]["resourceVersion"])
                self.binds += 1
                self._queue.pop(key, None)
                self._unschedulable.pop(key, None)
                cpu, mem = self._requests_of(pod)
                c, m, n = free[node]
                free[node] = (c - cpu, m - mem, n - 1)

    def _requests_of(self, pod: Obj) -> tuple[int, int]:
        uid = pod["metadata"].get("uid", "")
        requests = self._requests.get(uid)
        if requests is None:
            requests = self._requests[uid] = pod_requests(pod)
        return requests

    def _free_capacity(self) -> dict[str, tuple[int, int, int]]:
        nodes, _, _ = self.store.list_objects("nodes")
        free: dict[str, tuple[int, int, int]] = {}
        for node in nodes:
            alloc = (node.get("status") or {}).get("allocatable") or {}
            free[node["metadata"]["name"]] = (
                cpu_millis(alloc.get("cpu", "0")),
                memory_bytes(alloc.get("memory", "0")),
                int(alloc.get("pods", "110")),
            )
        self._allocatable = {name: (c, m) for name, (c, m, _) in free.items()}
        with self._cache:
            # The store delivers events outside its lock, by whichever thread committed last: this
            # scheduler's last bind may still be on its way here.
            self._cache.wait_for(lambda: self._seen_rv >= self._bound_rv, timeout=10.0)
            for name, (cpu, mem, pods) in self._used.items():
                if name in free:
                    c, m, n = free[name]
                    free[name] = (c - cpu, m - mem, n - pods)
        self._nodes = {n["metadata"]["name"]: n for n in sorted(nodes, key=lambda n: n["metadata"]["name"])}
        return free

    def _misfit(self, pod: Obj, node: Obj, room: tuple[int, int, int]) -> tuple[tuple[str, ...], str] | None:
        return node_misfit(pod, self._requests_of(pod), node, room)

    def _schedule(self, pod: Obj, free: dict[str, tuple[int, int, int]]) -> Attempt:
        statuses: Statuses = {}
        feasible = []
        for name, node in self._nodes.items():
            misfit = self._misfit(pod, node, free[name])
            if misfit is None:
                feasible.append(name)
            else:
                statuses[name] = misfit
        extenders = self.profiles[(pod.get("spec") or {}).get("schedulerName") or DEFAULT_SCHEDULER]
        for extender in extenders:
            if not feasible:
                break
            try:
                feasible = self._filter(extender, pod, feasible, statuses)
            except ExtenderError as e:
                if extender.ignorable:
                    continue
                return Attempt(message=str(e), reason="SchedulerError")
        if not feasible:
            return Attempt(message=fit_error(len(self._nodes), statuses))
        if len(feasible) == 1:
            return Attempt(node=feasible[0])
        scores = {name: self._least_allocated(pod, name, free[name]) for name in feasible}
        for extender in extenders:
            if not extender.prioritize_verb:
                continue
            try:
                answer = extender.call(extender.prioritize_verb, self._args(extender, pod, feasible))
                for entry in answer if isinstance(answer, list) else []:
                    host, score = _field(entry, "Host"), _field(entry, "Score")
                    if host in scores and isinstance(score, int):
                        scores[host] += score * extender.weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
            except ExtenderError:
                continue  # "Prioritization errors from extender can be ignored"
        best = max(scores.values())
        return Attempt(node=next(name for name in feasible if scores[name] == best))

    def _args(self, extender: Extender, pod: Obj, names: list[str]) -> Obj:
        if extender.node_cache_capable:
            return {"Pod": pod, "Nodes": None, "NodeNames": names}
        return {"Pod": pod, "Nodes": {"items": [self._nodes[n] for n in names]}, "NodeNames": None}

    def _filter(self, extender: Extender, pod: Obj, feasible: list[str], statuses: Statuses) -> list[str]:
        if not extender.filter_verb:
            return feasible
        answer = extender.call(extender.filter_verb, self._args(extender, pod, feasible))
        error = _field(answer, "Error")
        if error:
            raise ExtenderError(str(error))
        names, nodes = _field(answer, "NodeNames"), _field(answer, "Nodes")
        if extender.node_cache_capable and names is not None:
            for name in names:
                if name not in feasible:
                    raise ExtenderError(
                        f'extender "{extender.url_prefix}" claims a filtered node "{name}" '
                        "which is not found in the input node list"
                    )
            passed = list(names)
        elif nodes is not None:
            passed = [(n.get("metadata") or {}).get("name") for n in _field(nodes, "items") or []]
        else:
            passed = []  # neither: kube-scheduler reads no node back, so none passes
        unresolvable = _field(answer, "FailedAndUnresolvableNodes") or {}
        for name, message in unresolvable.items():
            statuses[name] = ((message,), UNRESOLVABLE)
        for name, message in (_field(answer, "FailedNodes") or {}).items():
            if name not in unresolvable:
                statuses[name] = ((message,), "unschedulable")
        return passed

    def _least_allocated(self, pod: Obj, name: str, room: tuple[int, int, int]) -> int:
        """NodeResourcesFit's default LeastAllocated score, CPU and memory weighted 1 each."""
        alloc = self._allocatable[name]
        cpu, mem = self._requests_of(pod)
        total = 0
        for free_now, capacity, request in ((room[0], alloc[0], cpu), (room[1], alloc[1], mem)):
            if capacity <= 0:
                continue
            requested = capacity - free_now + request
            total += (capacity - requested) * MAX_NODE_SCORE // capacity if requested <= capacity else 0
        return total // 2

    def _mark_unschedulable(self, key: Key, pod: Obj, attempt: Attempt) -> None:
        """handleSchedulingFailure (pkg/scheduler/schedule_one.go): a FailedScheduling event, then `updatePod`,
        which applies podutil.UpdatePodCondition (pkg/api/v1/pod/util.go) to the pod as the scheduler sees it
        and patches the status only when the condition changed. The new condition keeps the old one's
        lastTransitionTime when its status (False) is the same, so a `PodScheduled=False` that a client wrote
        on a gated pod (or the API server's SchedulingGated) is replaced in place, its transition time kept.
        The patch is a strategic merge of the status: conditions merge by type (util.PatchPodStatus)."""
        self._unschedulable[key] = attempt.message
        old = next(
            (c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"),
            None,
        )
        if (
            old is not None
            and old.get("status") == "False"
            and old.get("reason") == attempt.reason
            and old.get("message") == attempt.message
            and not old.get("lastProbeTime")
        ):
            return
        now = now_rfc3339(self.store.clock)
        condition: dict[str, Any] = {
            "type": "PodScheduled",
            "status": "False",
            "reason": attempt.reason,
            "message": attempt.message,
            "lastTransitionTime": old["lastTransitionTime"]
            if old is not None and old.get("status") == "False" and old.get("lastTransitionTime")
            else now,
        }
        if old is not None and old.get("lastProbeTime"):
            condition["lastProbeTime"] = None  # the scheduler's condition has none: the patch clears it
        scheduler = (pod.get("spec") or {}).get("schedulerName") or DEFAULT_SCHEDULER
        meta = pod["metadata"]
        with contextlib.suppress(ApiError):  # the event first, then the condition, as handleSchedulingFailure
            self.store.create(
                "events",
                {
                    "metadata": {"name": f"{key[1]}.{ids.suffix(16)}", "namespace": key[0]},
                    "involvedObject": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "namespace": key[0],
                        "name": key[1],
                        "uid": meta.get("uid", ""),
                    },
                    "type": "Warning",
                    "reason": "FailedScheduling",
                    "action": "Scheduling",
                    "message": attempt.message,
                    "reportingComponent": scheduler,
                    "source": {"component": scheduler},
                    "eventTime": now,
                    "count": 1,
                },
            )
            self.store.patch(
                "pods",
                key[0],
                key[1],
                {"status": {"conditions": [condition]}},
                "application/strategic-merge-patch+json",
                subresource="status",
            )
