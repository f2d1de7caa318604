"""Leader election on a `coordination.k8s.io/v1` Lease, so exactly one replica writes (the allocator; rotation).

The rules of client-go's leaderelection (staging/src/k8s.io/client-go/tools/leaderelection/leaderelection.go),
with a monotonic clock for every duration:
- a candidate takes the lease when it is free or when its holder has not renewed it for the lease's
  `leaseDurationSeconds` as observed locally (client-go's `observedTime`: clock skew between machines does
  not matter);
- leadership is a capability that expires by itself: `leading` is true only while the last successful
  renew (timed from before its request was sent) is younger than `renew_deadline`. client-go's `renew`
  gives each round of renewals a `RenewDeadline` context and stops leading when it ends; here nothing has
  to notice the failure for leadership to end, so a renew stuck in a hung API server cannot keep a replica
  writing (client-go's `IsLeader` only compares the observed holder with its own identity). Every write of
  the leader checks it first (sparkgate/kube.py `Kube.gated`);
- each lease request is one attempt (no retry loop: the next turn, `retry_period` later, is the retry)
  with a timeout of half the renew deadline, so a turn (a read, then a write) ends before the deadline;
- the leader renews every `retry_period`; a graceful stop gives the lease up (client-go's `ReleaseOnCancel`)
  so a follower takes over without waiting for it to expire, and the thread that renews is the one that
  gives it up (`campaign`, `LeaderTask`), after its turn in progress: a release sent beside a renew would
  lose to it (409) and leave the follower waiting a whole lease. Every write carries the lease's
  resourceVersion, so two candidates can never both win (the loser gets 409).
`lease_duration > renew_deadline > retry_period` is checked (as client-go's `NewLeaderElector` checks its
durations): a follower waits a whole lease duration from its own observation, so the old leader's last
write is sent `lease_duration - renew_deadline` or more before a new leader's first. The leader's writes go
through a client gated on `leading` whose requests end within half that gap (`gate`): a write sent at the
renew deadline reaches the API server within it or not at all, and the API server ends its handler within
it again (the request's `timeout`), so none lands after a new leader's first (client-go sets no such bound:
its `leaderelection.go` documents that it gives no fencing).

The one elector of sparkgate: the allocator's Lease and certificate rotation's both use it. `LeaderTask`
runs a periodic piece of work only while a Lease is held: its own Lease, renewed by the task's thread (the
certificate loop), or the allocator's, renewed by the allocator's leader thread (work for the leader).

Threading: an elector is driven by one thread (the one that calls `turn`/`try_acquire_or_renew`), which
owns every field; `leading` may be read from any thread (it reads one float and the clock).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sparkgate.kube import Conflict, Kube, KubeError, NotFound

log = logging.getLogger(__name__)


def _micro_time(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_error: Callable[[], None] = lambda: None,
    ) -> None:
        # The Lease says whole seconds (leaseDurationSeconds): what the followers wait is the whole part.
        if not int(lease_duration) > renew_deadline > retry_period > 0:
            raise ValueError(
                f"lease {name}: need lease duration (whole seconds) > renew deadline > retry period > 0, got "
                f"{lease_duration:g} s, {renew_deadline:g} s, {retry_period:g} s"
            )
        self.kube = kube
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        # Each lease request: one attempt, a timeout of half the renew deadline (a turn is a read and a write).
        self._once: dict[str, Any] = {"retry": False, "timeout": renew_deadline / 2}
        self.monotonic = monotonic
        self.wall = wall
        self.on_error = on_error
        self.transitions = 0  # times this candidate became the leader
        self.losses = 0  # times its leadership ended (lost, lapsed or given up)
        self.errors = 0  # unexpected exceptions of a turn (logged, `on_error`; the next turn retries)
        self._observed: tuple[str, str, str] | None = None  # (holder, renewTime, resourceVersion)
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # monotonic time before the last successful renew was sent

    @property
    def leading(self) -> bool:
        """True while the last successful renew is younger than the renew deadline: false by itself after."""
        renewed = self._renewed_at
        return renewed is not None and self.monotonic() - renewed < self.renew_deadline

    @property
    def write_timeout(self) -> float:
        """How long one leader write may take (`gate`): half the gap between the lease duration and the renew
        deadline, once to reach the API server and once for its handler (the request's `timeout`)."""
        return (int(self.lease_duration) - self.renew_deadline) / 2

    def gate(self, kube: Kube) -> Kube:
        """`kube` for the writes only this Lease's holder may make (sparkgate/kube.py `Kube.gated`)."""
        return kube.gated(lambda: self.leading, timeout=self.write_timeout)

    def _spec(self, previous: dict[str, Any] | None) -> dict[str, Any]:
        now = _micro_time(self.wall())
        transitions = int((previous or {}).get("leaseTransitions") or 0)
        acquired = (
            (previous or {}).get("acquireTime")
            if (previous or {}).get("holderIdentity") == self.identity
            else now
        )
        if previous is not None and previous.get("holderIdentity") != self.identity:
            transitions += 1  # as client-go counts them: any change of holder, from nobody too
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_duration),
            "acquireTime": acquired or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def try_acquire_or_renew(self) -> bool:
        """One attempt (a read, then a create or a write); True when this candidate leads afterwards."""
        now = self.monotonic()
        if self._renewed_at is not None:
            self._still_leading()
        try:
            lease = self.kube.request("GET", f"{self.path}/{self.name}", **self._once)
        except NotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name},
                "spec": self._spec(None),
            }
            try:
                self.kube.request("POST", self.path, body=body, **self._once)
            except KubeError as e:
                log.info("lease %s not created: %s", self.name, e)
                return self._lost(f"the lease was not created: {e}")
            return self._won(now)
        except KubeError as e:
            log.warning("lease %s not read: %s", self.name, e)
            return self._still_leading()
        # A record is observed when the read returns, not when it was sent (client-go stamps observedTime
        # after the Get too): a renew can land while the read is in flight, and dating it from before the
        # read would let this candidate take the lease up to a read's latency before the holder's renew
        # deadline has passed, while it may still write.
        seen = self.monotonic()
        spec = lease.get("spec") or {}
        meta = lease["metadata"]
        observed = (
            spec.get("holderIdentity") or "",
            spec.get("renewTime") or "",
            meta.get("resourceVersion", ""),
        )
        if observed != self._observed:
            self._observed, self._observed_at = observed, seen
        holder = observed[0]
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and seen - self._observed_at < duration:
            return self._lost(f"{holder} holds it")
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "resourceVersion": meta["resourceVersion"]},
            "spec": self._spec(spec),
        }
        try:
            self.kube.request("PUT", f"{self.path}/{self.name}", body=body, **self._once)
        except Conflict:
            return self._lost("another candidate wrote it first (409)")
        except KubeError as e:
            log.warning("lease %s not renewed: %s", self.name, e)
            return self._still_leading()
        return self._won(now)

    def turn(self) -> bool:
        """`try_acquire_or_renew` that never raises: an unexpected exception (a malformed Lease, a bug) is
        logged and counted (`errors`), and the next turn retries; leadership lapses by itself meanwhile."""
        try:
            return self.try_acquire_or_renew()
        except Exception:
            self._error()
            log.exception("lease %s: the turn failed (retried in %gs)", self.name, self.retry_period)
            return self.leading

    def campaign(
        self,
        stop: threading.Event,
        *,
        on_turn: Callable[[bool], None],
        on_started: Callable[[], None],
        on_lost: Callable[[], None],
    ) -> None:
        """A leader thread: a turn every retry period until `stop`, then the lease given up (`release`: by
        this thread, after its last turn), or until leadership ends: then `on_lost()` (the caller stops its
        writers) and return. `on_turn(leading)` after every turn (health), `on_started()` when this candidate
        becomes the leader. The thread survives its own exceptions: logged, counted in `errors`, and the next
        turn comes a retry period later."""
        try:
            while not stop.is_set():
                try:
                    transitions, losses = self.transitions, self.losses
                    leading = self.turn()
                    on_turn(leading)
                    if self.losses > losses and not stop.is_set():
                        on_lost()
                        return
                    if self.transitions > transitions:
                        on_started()
                except Exception:
                    self._error()
                    log.exception(
                        "lease %s: the leader thread failed (retried in %gs)", self.name, self.retry_period
                    )
                stop.wait(self.retry_period)
        finally:
            if stop.is_set():
                self.release()

    def _error(self) -> None:
        self.errors += 1
        self.on_error()

    def _won(self, now: float) -> bool:
        if self._renewed_at is None:
            log.info("%s became the leader (lease %s)", self.identity, self.name)
            self.transitions += 1
        self._renewed_at = now
        return True

    def _lost(self, why: str) -> bool:
        if self._renewed_at is not None:
            log.warning("%s stopped leading (lease %s): %s", self.identity, self.name, why)
            self.losses += 1
            self._renewed_at = None
        return False

    def _still_leading(self) -> bool:
        """After a failed request: still leading until the renew deadline has passed, lost from then on."""
        if self.leading:
            return True
        return self._lost(f"not renewed within the renew deadline ({self.renew_deadline:g} s)")

    def release(self) -> None:
        """Give the lease up (graceful stop) so a follower need not wait for it to expire. Called by the thread
        that drives this elector (`campaign`, `LeaderTask`), never beside a turn."""
        if not self.leading:
            return
        self._renewed_at = None  # no write of ours from here on; not a loss
        try:
            lease = self.kube.request("GET", f"{self.path}/{self.name}", **self._once)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = {
                **lease["spec"],
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": _micro_time(self.wall()),
            }
            self.kube.request("PUT", f"{self.path}/{self.name}", body={**lease, "spec": spec}, **self._once)
        except KubeError as e:
            log.warning("lease %s not released: %s", self.name, e)


class LeaderTask:
    """`work()` every `interval` seconds while `elector` holds its Lease, in a thread of its own.

    With `own_lease` the task's thread also renews the Lease every `retry_period` (and gives it up when
    stopped); without it, the Lease is someone else's (the allocator's) and the task only reads `leading`.
    A run may outlive the Lease (a hung API server): its writes go through a client gated on
    `elector.leading` (sparkgate/kube.py `Kube.gated`), which refuses them once leadership has lapsed.
    An exception in `work` is logged and reported (`on_run(name, "error")`), and the task runs again at its
    next interval: a bug never ends it. `on_run(name, "ok")` after each run that went through; a `work` that
    polls (returns False when it had nothing to do, its own interval not yet due) is not counted then, so the
    counts are of runs, not of polls. `follow`, if given, runs every interval in the replicas that do not
    hold the Lease (read-only work, e.g. reporting): not a run of the task, never counted (an exception is
    logged). A replica that becomes the leader runs `work` at its first poll as the leader (within a retry
    period), not at the end of the interval its last `follow` began.
    """

    def __init__(
        self,
        name: str,
        interval: float,
        work: Callable[[], bool | None],
        *,
        elector: LeaderElector,
        own_lease: bool,
        stop: threading.Event,
        on_run: Callable[[str, str], None] = lambda name, result: None,
        follow: Callable[[], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.follow = follow
        self.interval = interval
        self.work = work
        self.elector = elector
        self.own_lease = own_lease
        self.stop = stop
        self.on_run = on_run
        self.monotonic = monotonic
        self.thread = threading.Thread(target=self.run, name=f"task-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def run(self) -> None:
        next_run, led = self.monotonic(), False
        try:
            while not self.stop.is_set():
                leading = self.elector.turn() if self.own_lease else self.elector.leading
                if leading and not led:
                    next_run = self.monotonic()  # leadership begins: the work runs now, not an interval late
                led = leading
                if self.monotonic() >= next_run and (leading or self.follow is not None):
                    if leading:
                        self._run_work()
                    else:
                        self._follow()
                    next_run = self.monotonic() + self.interval
                wait = max(0.0, next_run - self.monotonic())
                if self.own_lease or not leading:
                    wait = min(wait, self.elector.retry_period)
                self.stop.wait(max(wait, 0.01))
        finally:
            if self.own_lease:
                self.elector.release()

    def _run_work(self) -> None:
        """One poll of `work` on the leader, counted unless it says it had nothing to do."""
        try:
            ran = self.work()
        except KubeError as e:  # the API server's answer: one line, no traceback at every run
            log.error("task %s failed (run again in %gs): %s", self.name, self.interval, e)
            self.on_run(self.name, "error")
        except Exception:
            log.exception("task %s failed (run again in %gs)", self.name, self.interval)
            self.on_run(self.name, "error")
        else:
            if ran is not False:
                self.on_run(self.name, "ok")

    def _follow(self) -> None:
        """A follower's `follow`: not a run of the task, never counted."""
        assert self.follow is not None
        try:
            self.follow()
        except Exception:
            log.exception("task %s: a follower's work failed (again in %gs)", self.name, self.interval)
