"""The demo's workloads: a cluster too small for its Spark applications, and the policy sparkgate runs with.

An application needs `work` executor-seconds: it is complete when its running executors have together run
that long, and then its driver stops and its driver pod is deleted (its executors go with it, as on a real
cluster). The drivers request executors as Spark does (`spark.kubernetes.allocation.batch.size` pods per
`batch.delay`, no limit on pending pods: Spark's defaults).

Most scenarios are one cluster of fixed size, run twice: without sparkgate, then with it. An autoscaled
scenario (`Autoscaling`) starts small and grows a node group through kubesim's cluster-autoscaler
(kubesim/autoscaler.py), and is run once more per setting that decides what the autoscaler sees
(`RUNS_AUTOSCALED`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from kubesim.autoscaler import AutoscalerConfig
from kubesim.nodegroups import NodeGroup


@dataclass(frozen=True)
class AppSpec:
    name: str
    executors: int
    submit_at: float  # seconds after the run starts
    task_seconds: float  # executor-seconds of work per executor the app ends with
    spark_batch: int = 5  # spark.kubernetes.allocation.batch.size
    # The driver's later targets, (seconds after submission, executors): a scale-down, or dynamic allocation's
    # ramp (`dynamic_allocation`).
    scale: tuple[tuple[float, int], ...] = ()

    @property
    def final(self) -> int:
        """The executors the app ends with: "all its executors running" means these."""
        return self.scale[-1][1] if self.scale else self.executors

    @property
    def work(self) -> float:
        return self.final * self.task_seconds

    def target_at(self, elapsed: float) -> int:
        """The driver's target `elapsed` seconds after submission."""
        target = self.executors
        for at, executors in self.scale:
            if at <= elapsed:
                target = executors
        return target


def dynamic_allocation(
    name: str,
    *,
    initial: int,
    needed: int,
    submit_at: float,
    backlog_at: float,
    backlog_timeout: float,
    task_seconds: float,
    spark_batch: int,
) -> AppSpec:
    """An app with dynamic allocation: `initial` executors (spark.dynamicAllocation.initialExecutors) until a
    stage with tasks for `needed` executors starts waiting, `backlog_at` seconds after submission; then the
    target ramps as Spark's ExecutorAllocationManager raises it (core ExecutorAllocationManager.scala
    `addExecutors`): by 1, 2, 4, ... executors, doubling at each `sustainedSchedulerBacklogTimeout` while
    the backlog lasts, capped at what the tasks need."""
    steps, target, add, at = [], initial, 1, backlog_at
    while target < needed:
        target = min(needed, target + add)
        steps.append((round(at, 3), target))
        add, at = add * 2, at + backlog_timeout
    return AppSpec(name, initial, submit_at, task_seconds, spark_batch=spark_batch, scale=tuple(steps))


@dataclass(frozen=True)
class RunSpec:
    """One run of a scenario: without sparkgate, or with it and these policy settings."""

    key: str  # its name in the report (`--json`)
    title: str  # its column in the comparison
    sparkgate: bool
    allocation: Mapping[str, str] = field(default_factory=dict)  # added to the policy's `allocation`


WITHOUT = RunSpec("without", "without sparkgate", sparkgate=False)
WITH = RunSpec("with", "with sparkgate", sparkgate=True)
# What the autoscaler sees of the executors sparkgate holds (docs/policy.md "Autoscaled clusters", issue 36):
# nothing (`released`, the gate only), all of them (`held`: each marked PodScheduled=False/Unschedulable), or a
# ProvisioningRequest per app for them. Each run names both settings, so that none depends on the default.
# The request's class is best-effort-atomic-scale-up: the cluster must grow to run the apps, and only that
# class adds nodes (check-capacity only says whether the pods fit the nodes there are; where they do not, the
# allocator falls back to the marks, which the `held` run measures already).
RUNS_AUTOSCALED = (
    WITHOUT,
    RunSpec(
        "released",
        "sparkgate, released",
        sparkgate=True,
        allocation={"autoscalerDemand": "released", "provisioning": "none"},
    ),
    RunSpec(
        "held",
        "sparkgate, held",
        sparkgate=True,
        allocation={"autoscalerDemand": "held", "provisioning": "none"},
    ),
    RunSpec(
        "provisioning",
        "sparkgate, ProvisioningRequest",
        sparkgate=True,
        allocation={"autoscalerDemand": "held", "provisioning": "best-effort-atomic-scale-up"},
    ),
)


@dataclass(frozen=True)
class Autoscaling:
    """A node group that grows from nothing to fit every executor, and cluster-autoscaler's timers.

    The timers kubesim measures on the monotonic clock are CA's defaults scaled by `time_scale` (a cloud's
    minute to provision a node, the 10 s scan interval, 10 minutes before an unneeded node goes or a booking
    expires), and so is a loop's own time, 3 s (kubesim/autoscaler.py `AutoscalerConfig.loop_duration`).
    The new-pods buffer is compared with the pods' creationTimestamp, which the API server keeps in whole
    seconds: scaled below a second it would mean nothing, so it is at least one second (CA's is two)."""

    executors_per_node: int  # 1-CPU executors that fit on one of the group's nodes
    max_nodes: int
    time_scale: float = 0.1

    def config(self) -> AutoscalerConfig:
        scaled = self.time_scale
        group = NodeGroup(
            "spark-pool",
            max_size=self.max_nodes,
            cpu=str(self.executors_per_node),
            memory=f"{4 * self.executors_per_node}Gi",
        )
        return AutoscalerConfig(
            groups=(group,),
            provisioning_delay=60.0 * scaled,
            scan_interval=10.0 * scaled,
            loop_duration=3.0 * scaled,
            unneeded_time=600.0 * scaled,
            delay_after_add=600.0 * scaled,
            new_pods_buffer=max(1.0, 2.0 * scaled),
            booking_time=600.0 * scaled,
            request_initial_backoff=60.0 * scaled,
            request_max_backoff=600.0 * scaled,
        )


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    nodes: int
    executors_per_node: int  # 1-CPU executors that fit on one node (beside the drivers)
    apps: tuple[AppSpec, ...]
    batch_size: int
    max_pending_per_app: int
    max_pending_cluster: int
    batch_delay: float = 0.2
    spark_batch_delay: float = 1.0  # spark.kubernetes.allocation.batch.delay
    duration: float = 50.0  # default bound of one run, seconds
    pacing: str = (
        "adaptive"  # the policy's pacing (docs/policy.md "Pacing"); `sparkgate demo --pacing` overrides
    )
    spark_allocator: str = "direct"  # or "deployment": Spark 4.2+ has the ReplicaSet controller create them
    autoscaling: Autoscaling | None = None  # None: the cluster keeps its `nodes`
    runs: tuple[RunSpec, ...] = (WITHOUT, WITH)

    @property
    def capacity(self) -> int:
        """Executor slots on the cluster as it starts (an autoscaled one also on the most its group grows to)."""
        grown = self.autoscaling.max_nodes * self.autoscaling.executors_per_node if self.autoscaling else 0
        return self.nodes * self.executors_per_node + grown

    @property
    def executors(self) -> int:
        return sum(a.final for a in self.apps)

    def policy_yaml(self, run: RunSpec = WITH) -> str:
        extra = "".join(f"  {key}: {value}\n" for key, value in run.allocation.items())
        return f"""\
apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation:
  batchSize: {self.batch_size}
  batchDelaySeconds: {self.batch_delay}
  maxPendingPerApp: {self.max_pending_per_app}
  maxPendingPerNamespace: {self.max_pending_cluster}
  maxPendingCluster: {self.max_pending_cluster}
  pacing: {self.pacing}
{extra}caps:
  batchSize: {max(50, self.batch_size)}
  maxPendingPerApp: {max(100, self.max_pending_per_app)}
profiles:
  - name: demo
    labels:
      sparkgate.io/demo: "true"
"""


def _autoscaled(
    name: str,
    description: str,
    *,
    sizes: tuple[int, int, int],
    dynamic: tuple[int, int, float],  # initial executors, then needed from this many seconds on
    per_node: int,
    task_seconds: float,
    batch_size: int,
    max_pending_per_app: int,
    max_pending_cluster: int,
    time_scale: float,
    duration: float,
) -> Scenario:
    """Three apps of `sizes` executors, submitted a second apart, and one whose dynamic allocation asks for
    more once it runs, on one node that holds the drivers; a node group grows to fit them all. Spark's
    timers are scaled as cluster-autoscaler's are (`Autoscaling.time_scale`)."""
    apps = (
        *(
            AppSpec(f"etl-{letter}", size, float(i), task_seconds, spark_batch=10)
            for i, (letter, size) in enumerate(zip("abc", sizes, strict=True))
        ),
        dynamic_allocation(
            "dynamic",
            initial=dynamic[0],
            needed=dynamic[1],
            submit_at=0.5,
            backlog_at=dynamic[2],
            backlog_timeout=1.0 * time_scale,  # spark.dynamicAllocation.sustainedSchedulerBacklogTimeout
            task_seconds=task_seconds,
            spark_batch=10,
        ),
    )
    return Scenario(
        name,
        description,
        nodes=1,
        executors_per_node=4,
        apps=apps,
        batch_size=batch_size,
        max_pending_per_app=max_pending_per_app,
        max_pending_cluster=max_pending_cluster,
        spark_batch_delay=1.0 * time_scale,  # spark.kubernetes.allocation.batch.delay
        duration=duration,
        autoscaling=Autoscaling(
            per_node, math.ceil(sum(a.final for a in apps) / per_node) + 2, time_scale=time_scale
        ),
        runs=RUNS_AUTOSCALED,
    )


def _seven_twenty(
    name: str, description: str, *, backlog_at: float, task_seconds: float, time_scale: float, duration: float
) -> Scenario:
    """The autoscaled scenario's apps and cluster (720 executors, nodes of 16, the caps) at a time scale."""
    return _autoscaled(
        name,
        description,
        sizes=(250, 200, 150),
        dynamic=(8, 120, backlog_at),
        per_node=16,
        task_seconds=task_seconds,
        batch_size=40,
        max_pending_per_app=100,
        max_pending_cluster=150,
        time_scale=time_scale,
        duration=duration,
    )


SCENARIOS = {
    s.name: s
    for s in (
        Scenario(
            "mixed",
            "five applications of different sizes, submitted two seconds apart, on room for 32 executors",
            nodes=4,
            executors_per_node=8,
            apps=(
                AppSpec("etl-big", 80, 0.0, 4.0, spark_batch=10),
                AppSpec("ml-train", 40, 2.0, 4.0, spark_batch=10),
                AppSpec("report-a", 12, 4.0, 4.0),
                AppSpec("report-b", 12, 6.0, 4.0),
                AppSpec("adhoc", 8, 8.0, 4.0),
            ),
            batch_size=8,
            max_pending_per_app=16,
            max_pending_cluster=24,
        ),
        Scenario(
            "huge",
            "one application asking for ten times the cluster",
            nodes=4,
            executors_per_node=8,
            apps=(AppSpec("huge", 320, 0.0, 2.0, spark_batch=50),),
            batch_size=10,
            max_pending_per_app=20,
            max_pending_cluster=20,
        ),
        Scenario(
            "many-small",
            "twenty small applications, one every half second",
            nodes=4,
            executors_per_node=8,
            apps=tuple(AppSpec(f"small-{i:02d}", 6, i * 0.5, 4.0) for i in range(20)),
            batch_size=3,
            max_pending_per_app=6,
            max_pending_cluster=16,
        ),
        Scenario(
            "scale-down",
            "a driver that asks for 60 executors and scales down to 16 while others wait",
            nodes=4,
            executors_per_node=8,
            apps=(
                AppSpec("shrinking", 60, 0.0, 8.0, spark_batch=20, scale=((2.0, 16),)),
                AppSpec("steady-a", 16, 1.0, 4.0),
                AppSpec("steady-b", 16, 2.0, 4.0),
            ),
            batch_size=8,
            max_pending_per_app=16,
            max_pending_cluster=24,
        ),
        Scenario(
            "tiny",
            "three small applications on room for 8 executors (for CI)",
            nodes=2,
            executors_per_node=4,
            apps=(
                AppSpec("a", 10, 0.0, 1.5),
                AppSpec("b", 6, 0.5, 1.5),
                AppSpec("c", 4, 1.0, 1.5),
            ),
            batch_size=2,
            max_pending_per_app=4,
            max_pending_cluster=4,
            spark_batch_delay=0.3,
            duration=30.0,
        ),
        Scenario(
            "large",
            "five drivers of 200 executors on room for 100 (the benchmark's size)",
            nodes=10,
            executors_per_node=10,
            apps=tuple(AppSpec(f"app-{i}", 200, i * 2.0, 1.0, spark_batch=20) for i in range(5)),
            batch_size=20,
            max_pending_per_app=40,
            max_pending_cluster=60,
            duration=120.0,
        ),
        *(
            Scenario(
                f"roomy{suffix}",
                f"five drivers of 200 executors on room for 1,000 ({what}): sparkgate must cost nothing",
                nodes=10,
                executors_per_node=100,
                apps=tuple(
                    AppSpec(f"app-{i}", 200, 0.0, task_seconds, spark_batch=spark_batch) for i in range(5)
                ),
                batch_size=10,
                batch_delay=1.0,
                max_pending_per_app=200,
                max_pending_cluster=1000,
                duration=120.0,
                spark_allocator=allocator,
            )
            # With the Deployment allocator the ReplicaSet controller creates the 1,000 executors at its client's
            # rate limit, 20 a second (kubesim/sparkdriver.py): each app gets work enough to still run when its
            # last executor starts, or "every executor running" would never be measured.
            for suffix, what, spark_batch, allocator, task_seconds in (
                ("", "Spark batch 10", 10, "direct", 20.0),
                ("-batch100", "Spark batch 100", 100, "direct", 20.0),
                (
                    "-deployment",
                    "Spark's Deployment allocator: the ReplicaSet controller's pace",
                    10,
                    "deployment",
                    60.0,
                ),
            )
        ),
        _seven_twenty(
            "autoscaled",
            "one node and a node group that grows to fit 720 executors, at cluster-autoscaler's and Spark's own "
            "timers (a node 60 s after it is asked for; about 4 minutes a run): apps of 250, 200 and 150, and "
            "one whose dynamic allocation ramps from 8 to 120",
            backlog_at=80.0,
            task_seconds=40.0,
            time_scale=1.0,
            duration=900.0,
        ),
        # The same apps and cluster at a tenth of the timers, for a quick look (each executor's work is 250 s at
        # full scale, so that every app has all its executors before it is done). What the API server, the webhook
        # and the allocator take per request is not scaled with them: a Spark driver's batch of 10 creations
        # waits on them for a larger share of its 0.1 s than of its 1 s, and the held pods' marks crowd a
        # kubesim on shared cores in a tenth of the time, so there the run with sparkgate is slower for reasons
        # of the harness, not of what the autoscaler sees (docs/performance.md "Autoscaled clusters").
        _seven_twenty(
            "autoscaled-fast",
            "the autoscaled scenario at a tenth of cluster-autoscaler's and Spark's timers, a node 6 s after "
            "it is asked for (a quick look: each request's own cost is not scaled with them)",
            backlog_at=8.0,
            task_seconds=25.0,
            time_scale=0.1,
            duration=300.0,
        ),
        _autoscaled(
            "autoscaled-tiny",
            "the autoscaled scenario at 44 executors, nodes of 4, a node 3 s after it is asked for (for CI)",
            sizes=(12, 8, 8),
            dynamic=(4, 16, 3.0),
            per_node=4,
            task_seconds=3.0,
            batch_size=4,
            max_pending_per_app=8,
            max_pending_cluster=12,
            time_scale=0.05,
            duration=120.0,
        ),
    )
}
DEFAULT = "mixed"
