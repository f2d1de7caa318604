"""The `sparkgate-certs` Lease: one replica at a time runs certificate rotation.

Certificate work is rare and idempotent, so this elector is deliberately small: each cycle, hold the Lease
(create it, renew it, or take it over once the holder's `renewTime + leaseDurationSeconds` has passed) and
only then sync. Every write carries the Lease's resourceVersion, so two replicas cannot both take it; the
loser sees a Conflict and sits the cycle out. On shutdown the holder releases it (holderIdentity cleared)
so that another replica takes over at its next cycle instead of after a full lease duration.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from sparkgate.kube import Kube, KubeError, NotFound

log = logging.getLogger(__name__)

MICROTIME = "%Y-%m-%dT%H:%M:%S.%fZ"


def _parse(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    for fmt in (MICROTIME, "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return dt.datetime.strptime(value, fmt).replace(tzinfo=dt.UTC)
        except ValueError:
            continue
    return None


def may_take(spec: dict[str, Any], identity: str, now: dt.datetime) -> bool:
    """Whether `identity` may hold a Lease with this spec at `now`."""
    holder = spec.get("holderIdentity") or ""
    if holder in ("", identity):
        return True
    renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
    duration = dt.timedelta(seconds=int(spec.get("leaseDurationSeconds") or 0))
    return renewed is None or renewed + duration <= now


class LeaseElector:
    def __init__(self, kube: Kube, namespace: str, name: str, identity: str, *, duration: float) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = max(1, int(duration))
        self.holding = False

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    def try_hold(self, now: dt.datetime) -> bool:
        """Create, renew or take over the Lease; False when another replica holds it or a write lost."""
        stamp = now.strftime(MICROTIME)
        try:
            lease = self.kube.get(self.path)
        except NotFound:
            lease = None
        except KubeError as e:
            log.warning("cannot read Lease %s: %s", self.name, e)
            self.holding = False
            return False
        try:
            if lease is None:
                spec = self._spec(stamp, stamp, 0)
                self.kube.create(
                    f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases",
                    {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": self.name},
                        "spec": spec,
                    },
                )
            else:
                spec = lease.get("spec") or {}
                if not may_take(spec, self.identity, now):
                    self.holding = False
                    return False
                ours = spec.get("holderIdentity") == self.identity
                transitions = int(spec.get("leaseTransitions") or 0) + (0 if ours else 1)
                acquired = spec.get("acquireTime") if ours else stamp
                lease["spec"] = self._spec(acquired or stamp, stamp, transitions)
                self.kube.replace(self.path, lease)
        except KubeError as e:
            log.info("Lease %s not taken: %s", self.name, e)
            self.holding = False
            return False
        self.holding = True
        return True

    def _spec(self, acquired: str, renewed: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration,
            "acquireTime": acquired,
            "renewTime": renewed,
            "leaseTransitions": transitions,
        }

    def release(self) -> None:
        if not self.holding:
            return
        try:
            lease = self.kube.get(self.path)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                self.kube.replace(self.path, lease)
        except KubeError as e:
            log.info("Lease %s not released: %s", self.name, e)
        self.holding = False
