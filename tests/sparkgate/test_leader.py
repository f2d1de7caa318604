"""sparkgate/leader.py against kubesim over HTTP: leadership that expires by itself, single-attempt lease
requests with a timeout, a leader thread that survives its own exceptions, and the certificate task's
writes gated on its Lease."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from certs.sync import Target, certs_task
from kubesim.cluster import Cluster
from sparkgate import contract
from sparkgate.cli import main
from sparkgate.kube import Kube
from sparkgate.leader import LeaderElector, LeaderTask

NS = contract.INSTALL_NAMESPACE
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with Cluster(nodes=1, namespaces=("default", NS)) as c:
        yield c


@pytest.fixture
def kube(cluster: Cluster) -> Iterator[Kube]:
    k = Kube.from_kubeconfig(str(cluster.kubeconfig()))
    yield k
    k.close()


def lease_requests(cluster: Cluster) -> list[tuple[str, int]]:
    return [(e.verb, e.code) for e in cluster.requests.entries() if e.resource == "leases"]


def test_leading_turns_false_by_itself_at_the_renew_deadline(cluster: Cluster, kube: Kube) -> None:
    """client-go's leaderelection stops leading when a renew round outlives RenewDeadline; here no request
    and no thread has to notice: the capability is the last renew's time plus the deadline."""
    now = [0.0]
    elector = LeaderElector(
        kube, NS, "l", "a", lease_duration=15, renew_deadline=10, monotonic=lambda: now[0]
    )
    assert not elector.leading
    assert elector.try_acquire_or_renew() and elector.leading
    sent = len(lease_requests(cluster))
    now[0] = 9.99
    assert elector.leading
    now[0] = 10.0
    assert not elector.leading, "lapsed with no renew: nobody had to call anything"
    assert len(lease_requests(cluster)) == sent
    assert elector.try_acquire_or_renew() and elector.leading  # still its lease: renewed, leading again
    assert (elector.transitions, elector.losses) == (2, 1)


def test_lease_requests_are_single_attempts_with_a_timeout_under_the_renew_deadline(
    cluster: Cluster, kube: Kube
) -> None:
    """With the lease requests hanging, each turn sends one GET, gives up after half the renew deadline and
    is not retried; leadership ends at the deadline although no request ever failed fast."""
    now = [0.0]
    elector = LeaderElector(
        kube, NS, "l", "a", lease_duration=3, renew_deadline=2, retry_period=0.5, monotonic=lambda: now[0]
    )
    assert elector.try_acquire_or_renew()
    cluster.requests.clear()
    cluster.faults.hang("*", "leases")
    assert elector.turn(), "the renew deadline has not passed on the elector's clock"
    now[0] = 2.0
    assert not elector.turn() and elector.losses == 1
    cluster.faults.resume()
    cluster.wait_for(lambda: len(lease_requests(cluster)) == 2, what="both hung requests logged")
    assert lease_requests(cluster) == [("get", 0), ("get", 0)], "one attempt per turn, no retries"


def test_the_leader_thread_survives_its_own_exceptions(cluster: Cluster, kube: Kube) -> None:
    """A Lease the elector cannot read (a bug's stand-in: leaseDurationSeconds is not a number) raises
    inside a turn: logged, counted, and the thread goes on; once the Lease is readable it leads."""
    cluster.store.create(
        "leases",
        {"metadata": {"name": "l"}, "spec": {"holderIdentity": "b", "leaseDurationSeconds": "soon"}},
        namespace=NS,
    )
    errors: list[int] = []
    started, stop = threading.Event(), threading.Event()
    elector = LeaderElector(
        kube,
        NS,
        "l",
        "a",
        lease_duration=3,
        renew_deadline=2,
        retry_period=0.05,
        on_error=lambda: errors.append(1),
    )
    thread = threading.Thread(
        target=elector.campaign,
        args=(stop,),
        kwargs={"on_turn": lambda leading: None, "on_started": started.set, "on_lost": stop.set},
        daemon=True,
    )
    thread.start()
    try:
        cluster.wait_for(lambda: len(errors) >= 2, what="two failed turns")
        assert thread.is_alive() and not started.is_set()
        cluster.store.delete("leases", NS, "l")
        assert started.wait(30), "the thread went on and took the free Lease"
        assert elector.errors == len(errors) >= 2 and elector.leading
    finally:
        stop.set()
        thread.join(timeout=30)


def test_a_certificate_cycle_writes_only_while_its_lease_is_held(cluster: Cluster, kube: Kube) -> None:
    """The certificate task's writes go through a client gated on its Lease: a cycle run by a replica that
    does not lead (or no longer does) sends none of them."""
    task = certs_task(
        kube,
        Target(),
        identity="a",
        interval=60,
        stop=threading.Event(),
        clock=lambda: dt.datetime.now(dt.UTC),
    )
    cluster.requests.clear()
    with pytest.raises(RuntimeError):
        task.work()  # not leading: the Secret's create is refused before it is sent
    sent = cluster.requests.entries()
    assert sent and {e.verb for e in sent} == {"get"}, "the Secret and configurations read, nothing written"
    assert task.elector.try_acquire_or_renew()
    task.work()
    assert cluster.store.get("secrets", NS, Target().secret)["data"]


def test_durations_the_elector_cannot_keep_are_refused_with_a_clear_error(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A renew deadline at least the lease duration would let a follower take over while the leader still
    writes: `sparkgate allocator` refuses to start, saying which durations."""
    code = main(
        [
            "allocator",
            "--kubeconfig",
            str(cluster.kubeconfig()),
            "--policy",
            str(tmp_path / "policy.yaml"),
            "--lease-duration",
            "15",
            "--renew-deadline",
            "20",
            "--no-certs",
        ]
    )
    assert code == 2
    assert capsys.readouterr().err == (
        "sparkgate allocator: lease sparkgate-allocator: need lease duration (whole seconds) > renew deadline"
        " > retry period > 0, got 15 s, 20 s, 2 s\n"
    )
    assert cluster.requests.count(resource="leases") == 0


def test_a_renew_that_lands_while_a_follower_reads_is_dated_from_the_read_not_before_it(
    cluster: Cluster, kube: Kube
) -> None:
    """client-go stamps observedTime when its Get returns. Stamped before the read, a renew that landed while
    the read was in flight looked up to a read's latency older, and the follower took the lease while the
    holder still led (15 s lease, 12 s renew deadline, a 5.5 s read: 2.5 s of two leaders)."""
    now = [100.0]
    follower_kube = Kube.from_kubeconfig(str(cluster.kubeconfig()))
    a = LeaderElector(kube, NS, "l", "a", lease_duration=15, renew_deadline=12, monotonic=lambda: now[0])
    b = LeaderElector(
        follower_kube, NS, "l", "b", lease_duration=15, renew_deadline=12, monotonic=lambda: now[0]
    )
    read = follower_kube.request

    def slow_read(method: str, path: str, **kwargs: object) -> object:
        if method == "GET":
            now[0] += 5.5  # the read takes 5.5 s (under its 6 s timeout) ...
            assert a.try_acquire_or_renew()  # ... and the holder renews meanwhile
        return read(method, path, **kwargs)  # type: ignore[arg-type]

    try:
        assert a.try_acquire_or_renew()
        follower_kube.request = slow_read  # type: ignore[method-assign]
        assert not b.try_acquire_or_renew()  # read from 100 to 105.5: a's renew of 105.5 seen
        follower_kube.request = read  # type: ignore[method-assign]
        for at in (115.0, 117.4, 117.5, 120.4):
            now[0] = at
            assert not b.try_acquire_or_renew(), at
            assert not (a.leading and b.leading)
        assert not a.leading
        now[0] = 120.5  # the renew seen at 105.5, plus the lease duration
        assert b.try_acquire_or_renew() and b.leading
    finally:
        follower_kube.close()


def finish(task: LeaderTask) -> None:
    """Run the task until its work stops it; a task that never does fails the test instead of hanging it."""
    task.thread.start()
    task.thread.join(timeout=60)
    task.stop.set()
    assert not task.thread.is_alive(), "the task's work never stopped it"


def test_a_leader_task_counts_runs_not_polls_and_not_a_followers_work() -> None:
    """`on_run` counts each run of `work` on the leader: "ok" when it went through, "error" when it raised;
    a poll that found nothing due (work returns False) is no run, and a follower's `follow` is never counted,
    even when it raises (sparkgate_allocator_task_runs_total: a task polled every few seconds counted "ok"
    at each poll, and SparkgateAllocatorTaskFailing could never fire for it)."""
    stop = threading.Event()
    clock = [0.0]

    def monotonic() -> float:
        clock[0] += 1.0  # every poll is due
        return clock[0]

    outcomes = iter([False, None, True, RuntimeError("refused"), False])
    runs: list[tuple[str, str]] = []

    def work() -> bool | None:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def count(name: str, result: str) -> None:
        runs.append((name, result))
        if len(runs) == 3:
            stop.set()

    # An elector as a LeaderTask without its own Lease reads it.
    leader: Any = SimpleNamespace(leading=True, retry_period=0.01)
    finish(
        LeaderTask(
            "probe", 0.5, work, elector=leader, own_lease=False, stop=stop, on_run=count, monotonic=monotonic
        )
    )
    assert runs == [("probe", "ok"), ("probe", "ok"), ("probe", "error")]
    follower, followed = threading.Event(), []

    def follower_work() -> None:
        followed.append(1)
        if len(followed) == 3:
            follower.set()
        raise RuntimeError("cannot read")

    counted: list[tuple[str, str]] = []
    standby: Any = SimpleNamespace(leading=False, retry_period=0.01)
    finish(
        LeaderTask(
            "certs",
            0.5,
            work,
            elector=standby,
            own_lease=False,
            stop=follower,
            on_run=lambda name, result: counted.append((name, result)),
            follow=follower_work,
            monotonic=monotonic,
        )
    )
    assert len(followed) == 3 and counted == []


def test_a_follower_that_becomes_the_leader_runs_its_task_at_once_not_an_interval_late() -> None:
    """Issue 37: a follower's `follow` ran at 0 s and set the next run an interval (60 s) later; it became
    the leader at 2 s and did the leader's work only at 60 s. Now the first poll as the leader runs it."""
    stop = threading.Event()
    now = [0.0]
    elector: Any = SimpleNamespace(leading=False, retry_period=0.01)
    ran: list[tuple[str, float]] = []

    def follow() -> None:
        ran.append(("follow", now[0]))
        now[0] = 2.0
        elector.leading = True  # the Lease is this replica's from now

    def work() -> None:
        ran.append(("work", now[0]))
        stop.set()

    finish(
        LeaderTask(
            "probe", 60.0, work, elector=elector, own_lease=False, stop=stop, follow=follow,
            monotonic=lambda: now[0],
        )
    )  # fmt: skip
    assert ran == [("follow", 0.0), ("work", 2.0)]


def test_the_thread_that_renews_the_lease_gives_it_up_after_its_turn(cluster: Cluster, kube: Kube) -> None:
    """A graceful stop gives the Lease up from the leader thread, after its turn in progress: a release sent
    from another thread beside a renew read the Lease before the renew landed and got 409 (issue 37), and
    the follower waited a whole lease duration."""
    elector = LeaderElector(kube, NS, "l", "a", lease_duration=15, renew_deadline=10, retry_period=0.01)
    stop, renewing, go = threading.Event(), threading.Event(), threading.Event()
    request = kube.request
    senders: list[str] = []

    def held(method: str, path: str, **kwargs: Any) -> Any:
        if method == "PUT":
            senders.append(threading.current_thread().name)
            if len(senders) == 2:  # the second renew: in flight while the stop comes
                renewing.set()
                assert go.wait(60)
        return request(method, path, **kwargs)

    elector.kube.request = held  # type: ignore[method-assign]
    thread = threading.Thread(
        target=elector.campaign,
        args=(stop,),
        kwargs={"on_turn": lambda leading: None, "on_started": lambda: None, "on_lost": lambda: None},
        name="leader",
    )
    thread.start()
    assert renewing.wait(60)
    stop.set()  # the graceful stop, while the renew is in flight
    go.set()
    thread.join(timeout=60)
    assert not thread.is_alive() and not elector.leading
    lease = cluster.store.get("leases", NS, "l")
    assert lease["spec"]["holderIdentity"] == "" and lease["spec"]["leaseDurationSeconds"] == 1
    assert senders == ["leader"] * 3  # two renews (the first turn created it), the release
    assert ("update", 409) not in lease_requests(cluster)
