"""Leader election on a `coordination.k8s.io/v1` Lease, so exactly one replica writes (the allocator; rotation).

The rules of client-go's leaderelection, with a monotonic clock for every duration: a candidate takes the
lease when it is free or when its holder has not renewed it for `lease_duration` as observed locally (so
clock skew between machines does not matter); the leader renews every `retry_period`; a leader that has
not renewed within `renew_deadline` has lost the lease and must stop writing at once; a graceful stop
gives the lease up so a follower takes over without waiting for it to expire. Every write carries the
lease's resourceVersion, so two candidates can never both win (the loser gets 409).

The one elector of sparkgate: the allocator's Lease and certificate rotation's both use it. `LeaderTask`
runs a periodic piece of work only while a Lease is held: its own Lease, renewed by the task's thread (the
certificate loop), or the allocator's, renewed by the allocator's leader thread (work for the leader).

Threading: an elector is driven by one thread (the one that calls `try_acquire_or_renew`); `leading` is a
plain bool other threads may read.
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
    ) -> None:
        self.kube = kube
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.monotonic = monotonic
        self.wall = wall
        self.leading = False
        self.transitions = 0
        self._observed: tuple[str, str, str] | None = None  # (holder, renewTime, resourceVersion)
        self._observed_at = 0.0
        self._renewed_at = 0.0

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
        """One attempt; True when this candidate holds the lease afterwards."""
        now = self.monotonic()
        try:
            lease = self.kube.get(f"{self.path}/{self.name}")
        except NotFound:
            try:
                self.kube.create(
                    self.path,
                    {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": self.name},
                        "spec": self._spec(None),
                    },
                )
            except (Conflict, KubeError) as e:
                log.info("lease %s not created: %s", self.name, e)
                return self._lost()
            return self._won(now)
        except KubeError as e:
            log.warning("lease %s not read: %s", self.name, e)
            return self._still_leading(now)
        spec = lease.get("spec") or {}
        meta = lease["metadata"]
        observed = (
            spec.get("holderIdentity") or "",
            spec.get("renewTime") or "",
            meta.get("resourceVersion", ""),
        )
        if observed != self._observed:
            self._observed, self._observed_at = observed, now
        holder = observed[0]
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and now - self._observed_at < duration:
            return self._lost()
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "resourceVersion": meta["resourceVersion"]},
            "spec": self._spec(spec),
        }
        try:
            self.kube.replace(f"{self.path}/{self.name}", body)
        except Conflict:
            return self._lost()
        except KubeError as e:
            log.warning("lease %s not renewed: %s", self.name, e)
            return self._still_leading(now)
        return self._won(now)

    def _won(self, now: float) -> bool:
        if not self.leading:
            log.info("%s became the leader (lease %s)", self.identity, self.name)
            self.transitions += 1
        self.leading, self._renewed_at = True, now
        return True

    def _lost(self) -> bool:
        if self.leading:
            log.warning("%s lost the lease %s", self.identity, self.name)
        self.leading = False
        return False

    def _still_leading(self, now: float) -> bool:
        """An API error: a leader keeps leading until its renew deadline passes, then must stop."""
        if self.leading and now - self._renewed_at < self.renew_deadline:
            return True
        return self._lost()

    def release(self) -> None:
        """Give the lease up (graceful stop) so a follower need not wait for it to expire."""
        if not self.leading:
            return
        self.leading = False
        try:
            lease = self.kube.get(f"{self.path}/{self.name}")
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = {
                **lease["spec"],
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": _micro_time(self.wall()),
            }
            self.kube.replace(f"{self.path}/{self.name}", {**lease, "spec": spec})
        except KubeError as e:
            log.warning("lease %s not released: %s", self.name, e)


class LeaderTask:
    """`work()` every `interval` seconds while `elector` holds its Lease, in a thread of its own.

    With `own_lease` the task's thread also renews the Lease every `retry_period` (and gives it up when
    stopped); without it, the Lease is someone else's (the allocator's) and the task only reads `leading`.
    An exception in `work` is logged and reported (`on_run(name, "error")`), and the task runs again at its
    next interval: a bug never ends it. `on_run(name, "ok")` after each run that went through. `follow`, if
    given, runs every interval in the replicas that do not hold the Lease (read-only work, e.g. reporting).
    """

    def __init__(
        self,
        name: str,
        interval: float,
        work: Callable[[], None],
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
        next_run = self.monotonic()
        try:
            while not self.stop.is_set():
                leading = self.elector.try_acquire_or_renew() if self.own_lease else self.elector.leading
                if self.monotonic() >= next_run and (leading or self.follow is not None):
                    try:
                        (self.work if leading else self.follow or self.work)()
                    except Exception:
                        log.exception("task %s failed (run again in %gs)", self.name, self.interval)
                        self.on_run(self.name, "error")
                    else:
                        if leading:
                            self.on_run(self.name, "ok")
                    next_run = self.monotonic() + self.interval
                wait = max(0.0, next_run - self.monotonic())
                if self.own_lease or not leading:
                    wait = min(wait, self.elector.retry_period)
                self.stop.wait(max(wait, 0.01))
        finally:
            if self.own_lease:
                self.elector.release()
