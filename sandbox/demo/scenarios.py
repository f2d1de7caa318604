"""The demo's workloads: a cluster too small for its Spark applications, and the policy sparkgate runs with.

An application needs `work` executor-seconds: it is complete when its running executors have together run
that long, and then its driver stops and its driver pod is deleted (its executors go with it, as on a real
cluster). The drivers request executors as Spark does (`spark.kubernetes.allocation.batch.size` pods per
`batch.delay`, no limit on pending pods: Spark's defaults).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AppSpec:
    name: str
    executors: int
    submit_at: float  # seconds after the run starts
    task_seconds: float  # executor-seconds of work per executor the app ends with
    spark_batch: int = 5  # spark.kubernetes.allocation.batch.size
    scale_to: tuple[float, int] | None = None  # (seconds after submission, executors): a scale-down

    @property
    def work(self) -> float:
        final = self.scale_to[1] if self.scale_to else self.executors
        return final * self.task_seconds


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

    @property
    def capacity(self) -> int:
        return self.nodes * self.executors_per_node

    def policy_yaml(self) -> str:
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
caps:
  batchSize: {max(50, self.batch_size)}
  maxPendingPerApp: {max(100, self.max_pending_per_app)}
profiles:
  - name: demo
    labels:
      sparkgate.io/demo: "true"
"""


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
                AppSpec("shrinking", 60, 0.0, 8.0, spark_batch=20, scale_to=(2.0, 16)),
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
    )
}
DEFAULT = "mixed"
