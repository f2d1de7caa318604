"""The allocator's limits under failure: kill -9 mid-ramp, a leader hand-over, API faults (500s, 409s, a
dropped watch, a forced 410), a hung API server, checked at every change the store commits, not just at
the end.

What is observable, and asserted at every moment (a store listener sees each committed change in order):
- in flight (released, not being deleted, phase Pending — bound or not) never exceeds maxPendingPerApp per
  app, nor maxPendingPerNamespace per namespace;
- while one allocator runs, released-but-unbound pods of an app never exceed batchSize: a batch is released
  only once the previous one is bound, so at most one batch waits for the scheduler. (A replacement
  allocator does not know which pods were the last batch, so across a kill this bound is 2 x batchSize.)
And at the end: every executor of a live app was released and runs, each gate removed exactly once.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kubesim.apiserver
from kubesim.cluster import Cluster
from sandbox.local_webhook import LocalWebhook
from sandbox.localsystem import AllocatorProcess, lease_holder, webhook_configurations
from sparkgate import contract

NS = "spark"
BATCH, PER_APP, PER_NS = 5, 10, 15

POLICY = f"""
apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation:
  batchSize: {BATCH}
  batchDelaySeconds: 0
  maxPendingPerApp: {PER_APP}
  maxPendingPerNamespace: {PER_NS}
  maxPendingCluster: 100
caps: {{batchSize: 50, maxPendingPerApp: 100}}
profiles:
  - name: spark
"""


class World:
    def __init__(
        self, cluster: Cluster, webhook: LocalWebhook, policy: Path, workdir: Path, observer: Any
    ) -> None:
        self.cluster = cluster
        self.webhook = webhook
        self.policy = policy
        self.workdir = workdir
        self.observer = observer
        self.allocators: list[AllocatorProcess] = []

    def allocator(self, identity: str, **options: Any) -> AllocatorProcess:
        process = AllocatorProcess(self.cluster, self.policy, self.workdir, identity, **options)
        self.allocators.append(process)
        return process

    def wait_leader(self, identity: str) -> None:
        self.cluster.wait_for(
            lambda: lease_holder(self.cluster) == identity, timeout=60, what=f"{identity} leads"
        )

    def executors(self, app_id: str) -> list[dict[str, Any]]:
        pods, _, _ = self.cluster.store.list(
            "pods", NS, label_selector=f"{contract.LABEL_APP_ID}={app_id},{contract.LABEL_ROLE}=executor"
        )
        return pods

    def running(self, app_id: str) -> int:
        return sum(1 for p in self.executors(app_id) if (p.get("status") or {}).get("phase") == "Running")

    def released(self, app_id: str) -> int:
        return sum(
            1
            for p in self.executors(app_id)
            if not any(g.get("name") == contract.GATE for g in p["spec"].get("schedulingGates") or ())
        )

    def logs(self) -> str:
        return "\n".join(f"--- {a.identity}\n{a.log.read_text()[-3000:]}" for a in self.allocators)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, observe: Any) -> Iterator[World]:
    # kubesim answers headers and body in two send()s without TCP_NODELAY: ~40 ms per request (Nagle and
    # delayed ACK). Not what is under test here; switched off for this test's cluster only.
    monkeypatch.setattr(kubesim.apiserver._Handler, "disable_nagle_algorithm", True, raising=False)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    with (
        Cluster(nodes=4, node_cpu="8", node_memory="64Gi", start_delay=0.3, bookmark_interval=0.5) as cluster,
        LocalWebhook(policy, tmp_path / "webhook", allocator_users=(contract.ALLOCATOR_USER,)) as webhook,
    ):
        cluster.add_namespace(NS)
        mutating, validating = webhook_configurations(webhook.url, webhook.ca_pem)
        cluster.store.create("mutatingwebhookconfigurations", mutating)
        cluster.store.create("validatingwebhookconfigurations", validating)
        w = World(cluster, webhook, policy, tmp_path, observe(cluster, PER_APP, PER_NS, 100, BATCH))
        try:
            yield w
        finally:
            for allocator in w.allocators:
                allocator.kill(signal.SIGTERM)


def start_apps(world: World, executors: int) -> list[Any]:
    return [
        world.cluster.spark_driver(
            NS,
            f"app-{i}",
            executors=executors,
            batch_size=executors,
            batch_delay=0.2,
            cpu="100m",
            memory="128Mi",
        )
        for i in range(2)
    ]


def test_kill_9_mid_ramp_then_a_new_allocator_finishes_within_the_limits(world: World) -> None:
    first = world.allocator("alloc-a")
    world.wait_leader("alloc-a")
    drivers = start_apps(world, 40)
    world.cluster.wait_for(
        lambda: all(world.released(d.app_id) >= 10 for d in drivers), timeout=60, what="both apps ramping"
    )
    first.kill()
    world.observer.phase = "after kill -9"
    # The replacement cannot know which pods were the last batch: one more batch may wait for the scheduler.
    with world.observer.lock:
        world.observer.unbound_limit = 2 * BATCH
    world.allocator("alloc-b")
    world.wait_leader("alloc-b")
    world.cluster.wait_for(
        lambda: all(world.running(d.app_id) == 40 for d in drivers),
        timeout=120,
        what="all 80 executors running",
    )
    assert world.observer.violations == [], world.logs()
    assert not any(n > 1 for n in world.observer.releases.values())
    assert all(world.observer.max_in_flight[d.app_id] <= PER_APP for d in drivers)


def test_api_faults_and_a_leader_hand_over_keep_the_limits(world: World) -> None:
    # Two live allocators: with the short default lease a pause of the machine longer than it would let the
    # follower take over on its own (the leader then gets 409 and exits). A long lease keeps the only
    # hand-over the planned one, which stays immediate: a graceful stop releases the lease.
    lease = {"lease": (15.0, 10.0, 0.3)}
    first = world.allocator("alloc-a", **lease)
    world.wait_leader("alloc-a")
    second = world.allocator("alloc-b", **lease)  # a follower with a warm cache
    drivers = start_apps(world, 40)
    faults = world.cluster.faults
    faults.fail("patch", "pods", 500, count=3)  # within kube.py's retries
    world.cluster.wait_for(
        lambda: all(world.released(d.app_id) >= 10 for d in drivers), timeout=60, what="both apps ramping"
    )
    assert lease_holder(world.cluster) == "alloc-a"
    faults.drop_watches()
    world.cluster.store.compact()  # every resourceVersion too old: the watches get 410 and relist
    world.cluster.wait_for(
        lambda: all(world.released(d.app_id) >= 20 for d in drivers), timeout=60, what="ramping after the 410"
    )
    assert world.observer.violations == [], world.logs()
    # The new leader does not know alloc-a's last batch: from here one more batch may wait for the scheduler.
    with world.observer.lock:
        world.observer.unbound_limit = 2 * BATCH
    first.kill(signal.SIGTERM)  # a graceful stop releases the lease: the follower takes over at once
    world.wait_leader("alloc-b")
    world.cluster.wait_for(
        lambda: all(world.running(d.app_id) == 40 for d in drivers),
        timeout=120,
        what="all 80 executors running",
    )
    assert second.process.poll() is None
    assert world.observer.violations == [], world.logs()
    assert not any(n > 1 for n in world.observer.releases.values())


def test_a_conflicting_gate_removal_is_re_decided_not_lost(world: World) -> None:
    world.allocator("alloc-a")
    world.wait_leader("alloc-a")
    world.cluster.faults.fail("patch", "pods", 409, count=2)
    driver = world.cluster.spark_driver(
        NS, "conflicted", executors=20, batch_size=20, batch_delay=0.2, cpu="100m", memory="128Mi"
    )
    world.cluster.wait_for(lambda: world.running(driver.app_id) == 20, timeout=30, what="all 20 running")
    assert world.observer.violations == [], world.logs()


def test_a_hung_api_server_the_leader_stops_writing_by_itself_and_the_follower_waits_for_expiry(
    world: World,
) -> None:
    """Issue 18: the API server stops answering the Lease requests (they hang, nothing is refused) while it
    goes on serving the rest. The leader's renewals cannot succeed, so its leadership lapses at its renew
    deadline and it stops writing by itself although its pod writes would still go through; it exits. The
    follower takes the Lease only once it has seen it unchanged for a whole lease duration. The API
    server's request log (writer = the pod the token is bound to; writes in commit order) must show the
    two replicas' writes never interleave: every write of A while A held the Lease by the log's timeline,
    none after B's first. Durations leave wide margins for a loaded machine; the asserts are on order."""
    lease_duration, renew_deadline = 10.0, 4.0
    lease = {"lease": (lease_duration, renew_deadline, 0.5)}
    world.cluster.scheduler.max_bind_rate = 5.0  # a steady stream of releases, long enough to outlast A
    first = world.allocator("alloc-a", **lease)
    world.wait_leader("alloc-a")
    world.allocator("alloc-b", **lease)
    drivers = start_apps(world, 50)
    world.cluster.wait_for(
        lambda: all(world.released(d.app_id) >= 10 for d in drivers), timeout=60, what="both apps ramping"
    )
    log = world.cluster.requests
    hang_started = max(e.time for e in log.entries())
    world.cluster.faults.hang("*", "leases")
    try:
        assert first.process.wait(timeout=120) == 1, "A lost the lease by itself and exited\n" + world.logs()
    finally:
        world.cluster.faults.resume()
    world.wait_leader("alloc-b")
    with world.observer.lock:  # B does not know A's last batch: one more batch may wait for the scheduler
        world.observer.unbound_limit = 2 * BATCH
    world.cluster.wait_for(
        lambda: all(world.running(d.app_id) == 50 for d in drivers),
        timeout=180,
        what="all 100 executors running",
    )
    writes = sorted((e for e in log.entries() if e.applied_write), key=lambda e: e.resource_version)
    by_a = [e for e in writes if e.identity == "alloc-a"]
    by_b = [e for e in writes if e.identity == "alloc-b"]
    renews_a = [e for e in by_a if e.resource == "leases"]
    assert any(e.resource == "pods" and e.time > hang_started for e in by_a), (
        "A went on releasing while its renewals hung: the server served its writes, A stopped on its own"
    )
    last_renew = renews_a[-1]
    assert all(w.time < last_renew.time + lease_duration for w in by_a), "every A write while A held it"
    taken = by_b[0]
    assert taken.resource == "leases" and taken.verb == "update", "B's first write takes the Lease"
    assert taken.time - last_renew.time >= lease_duration - 0.05, "B waited for the lease to expire"
    assert by_a[-1].resource_version < taken.resource_version, "after B's first write A never writes"
    assert world.observer.violations == [], world.logs()
    assert not any(n > 1 for n in world.observer.releases.values())
