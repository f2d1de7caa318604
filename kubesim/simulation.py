"""cluster-autoscaler's scheduling simulation: a snapshot of the nodes, pods packed onto it, and the
estimate of how many template nodes a scale-up needs.

- `Snapshot` is CA's ClusterSnapshot (simulator/clustersnapshot): every node with its free CPU, memory and
  pod slots after the pods bound to it; upcoming nodes of a node group are added as copies of its template
  (static_autoscaler.go `addUpcomingNodesToClusterSnapshot`), so pods that will fit there trigger no
  second scale-up. A pod fits a node under the filters kube-scheduler runs (scheduler.py `node_misfit`:
  taints, nodeSelector, requests). `place` is the HintingSimulator's TrySchedulePods for one pod, simplified:
  the first node in name order that fits (CA tries the pod's hinted node first, then the others from where
  its last search stopped).
- `estimate` is the BinpackingNodeEstimator (estimator/binpacking_estimator.go): the pods, largest first by
  `cpu/node cpu + memory/node memory` (decreasing_pod_orderer.go), go first-fit onto the template nodes added
  so far, a new one when none fits, as long as the group may grow (`SngCapacityThreshold`: its max size less
  its target size); pods that no template node could take are left out.
- `least_waste` is the least-waste expander (expander/waste/waste.go): the option wasting the smallest
  fraction of its nodes' CPU plus memory capacity; CA breaks remaining ties at random, kubesim takes the
  first option in node-group order.

Pure functions over plain data: the autoscaler's thread builds and uses a snapshot within one loop.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .nodegroups import NodeGroup
from .quantities import cpu_millis, memory_bytes
from .scheduler import node_misfit, pod_requests
from .store import Obj

Room = tuple[int, int, int]  # free cpu millis, memory bytes, pod slots


def allocatable(node: Obj) -> Room:
    alloc = (node.get("status") or {}).get("allocatable") or {}
    return (
        cpu_millis(alloc.get("cpu", "0")),
        memory_bytes(alloc.get("memory", "0")),
        int(alloc.get("pods", "110")),
    )


@dataclass
class SimNode:
    node: Obj
    room: Room
    pods: list[Obj] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.node["metadata"]["name"])

    def utilization(self) -> float:
        """utilization.Calculate: the larger of the CPU and memory requested over allocatable."""
        cpu, mem, _ = allocatable(self.node)
        used_cpu, used_mem = cpu - self.room[0], mem - self.room[1]
        return max(used_cpu / cpu if cpu else 0.0, used_mem / mem if mem else 0.0)


class Snapshot:
    def __init__(self, nodes: Iterable[Obj] = (), pods: Iterable[Obj] = ()) -> None:
        self.nodes: dict[str, SimNode] = {}
        for obj in sorted(nodes, key=lambda n: n["metadata"]["name"]):
            self.nodes[obj["metadata"]["name"]] = SimNode(obj, allocatable(obj))
        for pod in pods:
            node = self.nodes.get((pod.get("spec") or {}).get("nodeName", ""))
            if node is not None:
                self._add(node, pod)

    def fork(self) -> Snapshot:
        """ClusterSnapshot.Fork: a copy to try on, the nodes' objects shared."""
        forked = Snapshot()
        forked.nodes = {n: SimNode(s.node, s.room, list(s.pods)) for n, s in self.nodes.items()}
        return forked

    def add_node(self, node: Obj) -> None:
        self.nodes[node["metadata"]["name"]] = SimNode(node, allocatable(node))

    def remove_node(self, name: str) -> None:
        self.nodes.pop(name, None)

    def place(self, pod: Obj, *, exclude: Iterable[str] = ()) -> str | None:
        """Put the pod on the first node that fits it; the node's name, or None."""
        requests = pod_requests(pod)
        skipped = set(exclude)
        for name, node in self.nodes.items():
            if name not in skipped and node_misfit(pod, requests, node.node, node.room) is None:
                self._add(node, pod)
                return name
        return None

    def place_all(self, pods: Sequence[Obj]) -> list[Obj]:
        """TrySchedulePods (breakOnFailure false): the pods that did not fit."""
        return [pod for pod in pods if self.place(pod) is None]

    @staticmethod
    def _add(node: SimNode, pod: Obj) -> None:
        cpu, mem = pod_requests(pod)
        c, m, n = node.room
        node.room = (c - cpu, m - mem, n - 1)
        node.pods.append(pod)


@dataclass(frozen=True)
class Option:
    """expander.Option: a node group, how many nodes to add to it, and the pods they would take."""

    group: NodeGroup
    count: int
    pods: tuple[Obj, ...]


def estimate(group: NodeGroup, pods: Sequence[Obj], room_in_group: int) -> Option:
    template = group.template(f"template-node-for-{group.name}")
    cpu, mem, _ = allocatable(template)

    def score(pod: Obj) -> float:
        pcpu, pmem = pod_requests(pod)
        return (pcpu / cpu if cpu else 0.0) + (pmem / mem if mem else 0.0)

    empty = Snapshot([template])
    fitting = [p for p in pods if empty.fork().place(p) is not None]  # SchedulablePodGroups
    bins = Snapshot()
    placed: list[Obj] = []
    for pod in sorted(fitting, key=score, reverse=True):
        if bins.place(pod) is None:
            if len(bins.nodes) >= room_in_group:
                continue
            node = copy.deepcopy(template)
            node["metadata"]["name"] = f"{group.name}-estimated-{len(bins.nodes) + 1:05d}"
            bins.add_node(node)
            if bins.place(pod) is None:
                continue
        placed.append(pod)
    return Option(group, len(bins.nodes), tuple(placed))


def least_waste(options: Sequence[Option]) -> Option | None:
    best: Option | None = None
    best_score = 0.0
    for option in options:
        capacity = (option.group.template("waste").get("status") or {}).get("capacity") or {}
        avail_cpu = cpu_millis(capacity.get("cpu", "0")) * option.count
        avail_mem = memory_bytes(capacity.get("memory", "0")) * option.count
        requested = [pod_requests(p) for p in option.pods]
        wasted_cpu = (avail_cpu - sum(c for c, _ in requested)) / avail_cpu if avail_cpu else 0.0
        wasted_mem = (avail_mem - sum(m for _, m in requested)) / avail_mem if avail_mem else 0.0
        score = wasted_cpu + wasted_mem
        if best is None or score < best_score:
            best, best_score = option, score
    return best
