"""A step of the wall clock moves no decision (issue 37, finding 3): the allocator assembled in this process as
`sparkgate allocator` assembles it (allocator/commands.py `assemble`: its watches, cache, loop and actor),
against kubesim over HTTP; its wall clock is stepped an hour either way (an NTP step, a VM resumed), its
monotonic clock moved ahead by the test (time passing without the test waiting for it). Before, the loop
decided on the wall clock: a step back held an app's next batch for the hour, a step forward released it at
once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from allocator.commands import assemble
from allocator.loop import Options
from allocator.metrics import AllocatorMetrics
from kubesim.cluster import Cluster
from sparkgate import contract
from sparkgate.kube import Kube
from sparkgate.policy_file import PolicySource

from .conftest import write_policy
from .test_containment import executor


class Clock:
    """A real clock the test moves: `offset` seconds ahead of `source`."""

    def __init__(self, source: Any) -> None:
        self.source, self.offset = source, 0.0

    def __call__(self) -> float:
        return float(self.source()) + self.offset


@pytest.mark.parametrize("step", [3600.0, -3600.0])
def test_a_wall_clock_step_of_an_hour_either_way_moves_no_batch_delay(tmp_path: Path, step: float) -> None:
    with Cluster(nodes=2, bookmark_interval=0.2) as cluster:
        cluster.add_namespace("spark")
        kube = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
        policy = PolicySource(
            str(write_policy(tmp_path / "policy.yaml", batch=2, delay=30)), contract.INSTALL_NAMESPACE
        )
        allocator = assemble(
            kube, policy, Options(identity="alloc-1", tick=0.2, retry_period=0.2), AllocatorMetrics()
        )
        c = allocator.controller
        wall, monotonic = Clock(time.time), Clock(time.monotonic)
        c.clock, c.monotonic, c.queue.monotonic = wall, monotonic, monotonic
        ticks = [0]
        tick = c.tick

        def counted() -> None:
            tick()
            ticks[0] += 1

        c.tick = counted  # type: ignore[method-assign]
        released: list[float] = []  # the loop's monotonic time of each gate removal the API server applied

        def on_change(kind: str, resource: str, obj: dict[str, Any]) -> None:
            if (
                resource == "pods"
                and kind == "MODIFIED"
                and not (obj.get("spec") or {}).get("schedulingGates")
            ):
                name = obj["metadata"]["name"]
                if name not in seen:
                    seen.add(name)
                    released.append(monotonic())

        seen: set[str] = set()
        unsubscribe = cluster.store.subscribe(on_change)
        allocator.start()
        loop = threading.Thread(target=c.run, daemon=True)
        loop.start()
        try:
            for i in range(1, 7):
                cluster.store.create("pods", executor(f"app-1-exec-{i}", exec_id=i), namespace="spark")
            cluster.wait_for(lambda: len(released) == 2, timeout=60, what="the first batch")
            first = released[0]
            wall.offset += step  # the step
            monotonic.offset += 29 - (monotonic() - first)  # 29 s after the first release: still in its delay
            after = ticks[0]
            cluster.wait_for(lambda: ticks[0] >= after + 2, timeout=30, what="two ticks after the step")
            assert len(released) == 2  # a step forward no longer ends the delay at once
            monotonic.offset += 1.5  # past the delay: a step back no longer holds it for the hour
            cluster.wait_for(lambda: len(released) == 4, timeout=30, what="the second batch after the delay")
            assert released[2] - first >= 30  # never before its delay (and promptly after: the wait above)
        finally:
            unsubscribe()
            allocator.stop.set()
            loop.join(timeout=30)
            allocator.shutdown()
            kube.close()
