"""cluster-autoscaler, simulated: it adds nodes for pods the scheduler marked unschedulable and removes the
nodes nobody needs, following kubernetes-sigs/cluster-autoscaler's rules (sources named at each step).

    cluster = Cluster(nodes=1, autoscaler=AutoscalerConfig(
        groups=[NodeGroup("ng-small", max_size=10, cpu="2", memory="8Gi")],
        provisioning_delay=0.2, scan_interval=1.0))
    ... cluster.autoscaler.rounds, .plans, .usage.peak, .usage.node_seconds(), cluster.scheduler.peak_pending

The loop (pkg/loop/trigger.go `Wait`, core/static_autoscaler.go `RunOnce`):
- it runs every `scan_interval` (10 s), at once when a pod becomes unschedulable (the pod observer: a pod
  not bound, not finished, whose PodScheduled=False/Unschedulable condition changed less than 10 s ago,
  whoever wrote it), and at once after a loop that scaled up, deleted nodes or processed a
  ProvisioningRequest. Its snapshot of pods and nodes is taken when it starts: pods marked while a loop
  runs wait for the next one (`hold` keeps a loop from starting, so that writes land together). A real
  loop takes seconds between its snapshot and its scale-up (the simulation, the cloud's IncreaseSize),
  kubesim's milliseconds: `loop_duration` stands in for that time, so that marks spread over it join one
  loop as they would in CA, not one loop each;
- the pods it helps are those ArrangePodsBySchedulability (utils/kubernetes/listers.go) finds unschedulable:
  not bound, not being deleted, PodScheduled=False with reason Unschedulable — gated or not. Any other
  unbound pod (a gated pod with reason SchedulingGated) is "ignored";
- the pod-list processors (core/podlistprocessor, processors/provreq): pods that fit the nodes (upcoming
  ones included) are dropped by the scheduling simulation (filter_out_schedulable.go, highest priority
  first); then the pods consuming a ProvisioningRequest; then one request's pods are injected and the
  booked capacity is put into the snapshot (provisioning.py);
- no pod left: "No unschedulable pods". All of them created less than `new_pods_buffer` (2 s,
  `unschedulablePodTimeBuffer`) ago: wait one loop for more, no scale-down in this one (`shouldScaleUp`),
  unless they come from a request (ScaleUpEnforcer);
- a scale-up (core/scaleup/orchestrator `ScaleUp`): each node group below its max size estimates the nodes
  its template needs (simulation.py), least-waste picks one, and the group grows (capped at its max size;
  all or nothing for a best-effort-atomic request). With ProvisioningRequests enabled, a loop helps either
  the requests' pods or the others, alternating when both wait (provisioningrequest/orchestrator/
  wrapper_orchestrator.go);
- scale-down (core/scaledown: planner, unneeded/nodes.go, eligibility/eligibility.go): a node of a group
  above its min size is unneeded when its utilization (the larger of requested CPU and memory over
  allocatable) is below `utilization_threshold` (0.5) and its pods fit on the other nodes; it is removed
  after being unneeded for `unneeded_time` (10 min), unless a scale-up happened within
  `delay_after_add` (10 min) or a deletion within a scan interval. Simplified: every pod is movable (CA
  also refuses nodes with pods without a controller, kube-system pods without a PDB, local storage...),
  a node holding booked capacity is never unneeded, empty nodes go ten at a time and one non-empty node
  at a time (`--max-empty-bulk-delete`, `--max-drain-parallelism`).

Counts for a benchmark: `rounds` (scale-up plans executed), `plans` (each as {group: (from, to)}), `usage`
(nodegroups.NodeUsage: peak nodes, node-seconds), `loops` (the recent loops, `Loop`), and the scheduler's
own `peak_pending` (scheduler.py).

Threads: one thread runs the loops and the cloud (nodegroups.Cloud) and owns every attribute here; the
store's dispatching thread only sets the trigger (`_on_event`). `rounds`, `plans` and `loops` are read by
tests between loops (`wait_for`).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from . import provreq
from .nodegroups import Cloud, NodeGroup, NodeUsage
from .provisioning import Injected, Provisioning, timestamp
from .simulation import Option, Snapshot, estimate, least_waste
from .store import Obj, Store

MAX_POD_CHANGE_AGE = 10.0  # loop/trigger.go `maxPodChangeAge`
MAX_EMPTY_BULK_DELETE = 10


@dataclass(frozen=True)
class AutoscalerConfig:
    """CA's flags that kubesim honours, with CA's defaults (config/flags/flags.go, config/const.go)."""

    groups: Sequence[NodeGroup]
    provisioning_delay: float = 60.0  # not a CA setting: how long a cloud takes to make a node Ready
    scan_interval: float = 10.0  # --scan-interval
    unneeded_time: float = 600.0  # --scale-down-unneeded-time
    delay_after_add: float = 600.0  # --scale-down-delay-after-add
    utilization_threshold: float = 0.5  # --scale-down-utilization-threshold
    scale_down: bool = True  # --scale-down-enabled
    new_pods_buffer: float = 2.0  # unschedulablePodTimeBuffer (a constant in CA)
    # Not a CA setting: how long one loop takes from its snapshot to its actions (0: kubesim's own speed,
    # milliseconds). CA's RunOnce lists the nodes and pods first (core/static_autoscaler.go `RunOnce`,
    # `obtainNodeLists`) and scales up at its end, after the simulation and the cloud's IncreaseSize; its
    # iterations take seconds: below 10 s at 1,000 nodes (proposals/scalability_tests.md), about 5 s on
    # average from a pod marked unschedulable to its scale-up on clusters below 100 nodes (FAQ.md "What
    # are the Service Level Objectives", the new-pods buffer included).
    loop_duration: float = 0.0
    provisioning_requests: bool = True  # --enable-provisioning-requests (serves the CRD)
    booking_time: float = 600.0  # processor.go defaultReservationTime (a constant in CA)
    request_initial_backoff: float = 60.0  # --provisioning-request-initial-backoff-time
    request_max_backoff: float = 600.0  # --provisioning-request-max-backoff-time


@dataclass
class Loop:
    """One RunOnce, as CA logs it."""

    trigger: str
    unschedulable: int = 0  # "Found N pods in the cluster: ... N unschedulable"
    ignored: int = 0  # "... N ignored by allowed schedulers"
    helped: int = 0  # unschedulable pods left after the pod-list processors
    outcome: str = ""  # "No unschedulable pods", "Unschedulable pods are very new...", "Scale-up", ...
    schedulable_present: bool = False  # "Schedulable pods present"
    plan: dict[str, tuple[int, int]] = field(default_factory=dict)  # "Final scale-up plan"
    deleted: list[str] = field(default_factory=list)


def _created(pod: Obj) -> float:
    return timestamp(pod["metadata"].get("creationTimestamp"))


def _consumes(pod: Obj) -> bool:
    return provreq.CONSUME_ANNOTATION in (pod["metadata"].get("annotations") or {})


def unschedulable(pod: Obj) -> bool:
    """ArrangePodsBySchedulability's unschedulable pod (the caller drops bound and deleted ones)."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled":
            return bool(c.get("status") == "False" and c.get("reason") == "Unschedulable")
    return False


class Autoscaler:
    def __init__(
        self,
        store: Store,
        config: AutoscalerConfig,
        *,
        on_loop: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.config = config
        self.on_loop = on_loop
        self.clock = clock
        self.cloud = Cloud(store, config.groups, provisioning_delay=config.provisioning_delay, clock=clock)
        self.usage = NodeUsage(store, clock)
        self.provisioning = Provisioning(
            store,
            booking_time=config.booking_time,
            initial_backoff=config.request_initial_backoff,
            max_backoff=config.request_max_backoff,
        )
        if config.provisioning_requests:
            store.install("provisioningrequests")
        self.rounds = 0
        self.plans: list[dict[str, tuple[int, int]]] = []
        self.loops: collections.deque[Loop] = collections.deque(maxlen=1000)
        self.loop_count = 0
        self._last_scale_up = float("-inf")
        self._last_delete = float("-inf")
        self._unneeded: dict[str, float] = {}  # node -> since when it is unneeded
        self._provreq_mode = False  # the wrapper orchestrator's alternation
        self._trigger = threading.Event()
        self._reason = ""
        self._hold = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubesim-autoscaler", daemon=True)
        self._unsubscribe = store.subscribe(self._on_event)

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._unsubscribe()
        self.usage.close()
        self._stop.set()
        self._trigger.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """No loop starts inside: what is written meanwhile is seen together by the next one."""
        with self._hold:
            yield

    def describe(self) -> str:
        sizes = {g: self.cloud.target[g] for g in self.cloud.groups}
        return f"{self.loop_count} loops, {self.rounds} scale-ups, targets {sizes}, last {self.loops[-1] if self.loops else None}"

    # --- the trigger -------------------------------------------------------------------------------

    def _on_event(self, kind: str, resource: str, obj: Obj) -> None:
        """StartPodObserver's handler: a recent unschedulable pod starts a loop at once."""
        if resource != "pods" or kind == "DELETED" or (obj.get("spec") or {}).get("nodeName"):
            return
        if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed") or not unschedulable(obj):
            return
        condition = next(c for c in obj["status"]["conditions"] if c.get("type") == "PodScheduled")
        if timestamp(condition.get("lastTransitionTime")) + MAX_POD_CHANGE_AGE >= self.store.clock():
            self._reason = "Autoscaler loop triggered by unschedulable pod appearing"
            self._trigger.set()

    def _run(self) -> None:
        next_scan = self.clock() + self.config.scan_interval
        while not self._stop.is_set():
            due = self.cloud.next_due()
            wake = min(next_scan, due) if due is not None else next_scan
            triggered = self._trigger.wait(max(0.0, wake - self.clock()))
            if self._stop.is_set():
                return
            self.cloud.boot_due()
            if not triggered and self.clock() < next_scan:
                continue
            reason = (
                self._reason
                if triggered
                else f"Autoscaler loop triggered by a {self.config.scan_interval}s timer"
            )
            self._trigger.clear()
            with self._hold:
                productive = self._run_once(reason)
            self.on_loop()
            next_scan = self.clock() + self.config.scan_interval
            if productive:  # trigger.go: "triggered immediately after a scale up / scale down / request"
                self._reason = "Autoscaler loop triggered immediately after a productive iteration"
                self._trigger.set()

    # --- one loop ----------------------------------------------------------------------------------

    def _run_once(self, trigger: str) -> bool:
        loop = Loop(trigger)
        self.loops.append(loop)
        self.loop_count += 1
        now, wall = self.clock(), self.store.clock()
        processed_before = self.provisioning.last_processed
        if self.config.provisioning_requests:
            self.provisioning.refresh()
        nodes, _, _ = self.store.list_objects("nodes")
        pods, _, _ = self.store.list_objects("pods")
        pods = [p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        bound = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
        waiting = [p for p in pods if p not in bound and not p["metadata"].get("deletionTimestamp")]
        marked = [p for p in waiting if unschedulable(p)]
        loop.unschedulable, loop.ignored = len(marked), len(waiting) - len(marked)
        self.cloud.finish_deletions(collections.Counter(p["spec"]["nodeName"] for p in bound))
        snapshot = Snapshot(nodes, bound)
        for group in self.cloud.groups.values():
            for i in range(self.cloud.upcoming(group.name)):
                snapshot.add_node(group.template(f"upcoming-{group.name}-{i}"))
        self._spend(self.config.loop_duration)  # RunOnce's own time, on this snapshot
        # The pod-list processors, in CA's order.
        priority = sorted(marked, key=lambda p: -int((p.get("spec") or {}).get("priority") or 0))
        helped = snapshot.place_all(priority)
        loop.schedulable_present = len(helped) != len(marked)
        helped = [p for p in helped if not _consumes(p)]
        injected = self.provisioning.next_request() if self.config.provisioning_requests else None
        if self.config.provisioning_requests:
            self.provisioning.book(snapshot, bound)
        loop.helped = len(helped) + (len(injected.pods) if injected else 0)
        scaled, scale_down_allowed = False, True
        if not helped and injected is None:
            loop.outcome = "No unschedulable pods"
        elif injected is None and min(_created(p) for p in helped) + self.config.new_pods_buffer > wall:
            loop.outcome = "Unschedulable pods are very new, waiting one iteration for more"
            scale_down_allowed = False
        else:
            scaled = self._scale_up(loop, helped, injected, snapshot)
        if scaled:
            self._last_scale_up = now
        elif self.config.scale_down and scale_down_allowed:
            self._scale_down(loop, snapshot, bound, now)
        return scaled or bool(loop.deleted) or self.provisioning.last_processed != processed_before

    def _spend(self, seconds: float) -> None:
        """The loop's own time, after its snapshot: the cloud goes on meanwhile (nodes join when due)."""
        end = self.clock() + seconds
        while not self._stop.is_set() and (left := end - self.clock()) > 0:
            due = self.cloud.next_due()
            self._stop.wait(left if due is None else min(left, max(0.0, due - self.clock())))
            self.cloud.boot_due()

    def _scale_up(
        self, loop: Loop, regular: Sequence[Obj], injected: Injected | None, snapshot: Snapshot
    ) -> bool:
        """WrapperOrchestrator.ScaleUp: the request's pods or the regular ones, alternating."""
        if injected is None:
            self._provreq_mode = False
        elif not regular:
            self._provreq_mode = True
        provreq_mode, self._provreq_mode = self._provreq_mode, not self._provreq_mode
        if not provreq_mode or injected is None:
            loop.outcome = (
                "Scale-up" if self._grow(loop, regular, all_or_nothing=False) else "No expansion options"
            )
            return bool(loop.plan)
        if injected.request["spec"]["provisioningClassName"] == provreq.CHECK_CAPACITY:
            self.provisioning.check_capacity(injected, snapshot)
            loop.outcome = "ProvisioningRequest checked"
            return False
        scaled = self.provisioning.best_effort_atomic(
            injected, snapshot, lambda pods: self._grow(loop, pods, all_or_nothing=True)
        )
        loop.outcome = "ProvisioningRequest scale-up" if scaled else "ProvisioningRequest not provisioned"
        return scaled

    def _grow(self, loop: Loop, pods: Sequence[Obj], *, all_or_nothing: bool) -> bool:
        """ScaleUpOrchestrator.ScaleUp: the expansion options, least-waste's pick, the group grown."""
        options: list[Option] = []
        for group in self.cloud.groups.values():
            room = group.max_size - self.cloud.target[group.name]
            if room <= 0:
                continue  # "Skipping node group - max size reached"
            option = estimate(group, pods, room)
            if not option.pods or option.count == 0:
                continue
            if all_or_nothing and len(option.pods) < len(pods):
                continue  # "Some pods can't fit, giving up due to all-or-nothing scale-up strategy"
            options.append(option)
        best = least_waste(options)
        if best is None:
            return False
        current = self.cloud.target[best.group.name]
        self.cloud.increase_size(best.group.name, best.count)
        loop.plan[best.group.name] = (current, current + best.count)
        self.plans.append(dict(loop.plan))
        self.rounds += 1
        return True

    def _scale_down(self, loop: Loop, snapshot: Snapshot, bound: Sequence[Obj], now: float) -> None:
        deleting = self.cloud.deleting()
        booked = {  # a request's pods, booked (provisioning.py) or about to land (filter_out_schedulable)
            name
            for name, node in snapshot.nodes.items()
            if any(_consumes(p) and not (p.get("spec") or {}).get("nodeName") for p in node.pods)
        }
        destinations = snapshot.fork()
        removable: dict[str, int] = {
            g: self.cloud.target[g] - self.cloud.groups[g].min_size for g in self.cloud.groups
        }
        unneeded: dict[str, float] = {}
        for name in sorted(snapshot.nodes):
            group = self.cloud.group_of(name)
            if group is None or name in deleting or name in booked or removable[group.name] <= 0:
                continue
            node = snapshot.nodes[name]
            if node.utilization() >= self.config.utilization_threshold:
                continue
            trial = destinations.fork()
            trial.remove_node(name)
            if trial.place_all(node.pods):
                continue  # its pods cannot move
            destinations = trial
            removable[group.name] -= 1
            unneeded[name] = self._unneeded.get(name, now)
        self._unneeded = unneeded
        if (
            now < self._last_scale_up + self.config.delay_after_add
            or now < self._last_delete + self.config.scan_interval
        ):
            return  # isScaleDownInCooldown
        ripe = [n for n, since in sorted(unneeded.items()) if since + self.config.unneeded_time <= now]
        pods_on = {n: [p for p in bound if p["spec"]["nodeName"] == n] for n in ripe}
        empty = [n for n in ripe if not pods_on[n]][:MAX_EMPTY_BULK_DELETE]
        drain = [n for n in ripe if pods_on[n]][:1] if not deleting else []
        for name in empty + drain:
            self.cloud.delete_node(name, pods_on[name], int(self.store.clock()))
            self._unneeded.pop(name, None)
            loop.deleted.append(name)
        if loop.deleted:
            self._last_delete = now
