"""The watches that feed the scheduler extender's placement index beyond executor pods: nodes (their zone)
and Spark driver pods (their node and zone). They reuse the cache's Reflector (list, then watch, resume,
relist on 410, back off); executor pods come from the cache itself, which reports every change."""

from __future__ import annotations

from typing import Any

from sparkgate import contract
from sparkgate.kube import Kube

from .cache import Reflector
from .placement import Placement


def placement_reflectors(kube: Kube, placement: Placement, **common: Any) -> list[Reflector]:
    """`common`: the Reflector keywords every watch of the allocator shares (stop, restart/crash/progress
    reports, timeout), so these watches are restarted, counted and watched by /healthz like the others."""
    return [
        Reflector(
            kube,
            "nodes",
            "/api/v1/nodes",
            None,
            placement.node_event,
            placement.nodes_replace,
            **common,
        ),
        Reflector(
            kube,
            "driver-zones",
            "/api/v1/pods",
            f"{contract.LABEL_ROLE}={contract.ROLE_DRIVER}",
            placement.driver_event,
            placement.drivers_replace,
            **common,
        ),
    ]
