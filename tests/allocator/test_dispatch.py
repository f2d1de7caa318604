"""The loop hands each decision's actions to the actor and goes on deciding (allocator/loop.py, `_dispatch`):
while an app's actions are being carried out, its releases count as in flight for the other apps' budgets,
the app itself is not decided again (a change is deferred to their end), and a failed write makes it
re-decided with what was not released no longer counted. The actor is replaced by one whose work the test
finishes by hand; the Lease is taken on kubesim over HTTP."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from allocator.loop import Controller, Options
from allocator.metrics import AllocatorMetrics
from allocator.model import Action, Release
from kubesim.cluster import Cluster
from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.kube import Kube
from sparkgate.policy_file import PolicySource

from .conftest import write_policy

A, B = AppKey("spark", "app-a"), AppKey("spark", "app-b")


class HeldActor:
    """Records what it is given; each app's work ends when the test says so."""

    def __init__(self) -> None:
        self.given: list[Action] = []
        self.pending: dict[AppKey, Future[bool]] = {}

    def submit(self, actions: Iterable[Action]) -> dict[AppKey, Future[bool]]:
        futures: dict[AppKey, Future[bool]] = {}
        for action in actions:
            assert action.app not in self.pending, f"{action.app} was given actions while busy"
            self.given.append(action)
            futures.setdefault(action.app, Future())
        self.pending.update(futures)
        return futures

    def finish(self, app: AppKey, ok: bool) -> None:
        self.pending.pop(app).set_result(ok)

    def releases(self) -> list[str]:
        given, self.given = self.given, []
        return [a.pod.name for a in given if isinstance(a, Release)]

    def close(self) -> None:
        pass


def executor(app: str, exec_id: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{app}-exec-{exec_id}",
            "namespace": "spark",
            "uid": f"uid-{app}-{exec_id}",
            "labels": {
                contract.LABEL_ROLE: contract.ROLE_EXECUTOR,
                contract.LABEL_APP_ID: app,
                contract.LABEL_EXEC_ID: str(exec_id),
            },
            "annotations": {contract.ANNOTATION_PROFILE: "spark"},
            "creationTimestamp": "2026-11-23T10:00:00Z",
        },
        "spec": {
            "containers": [{"name": "spark-kubernetes-executor", "image": "spark"}],
            "schedulingGates": [{"name": contract.GATE}],
        },
        "status": {"phase": "Pending"},
    }


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[tuple[Controller, HeldActor]]:
    with Cluster(nodes=1) as cluster:
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig("admin")))
        policy = write_policy(tmp_path / "policy.yaml", batch=4, delay=0, per_app=10, per_ns=10, cluster=4)
        c = Controller(kube, PolicySource(str(policy), "sparkgate-system"), Options(), AllocatorMetrics())
        c.actor.close()
        actor = HeldActor()
        c.actor = actor  # type: ignore[assignment]
        c.cache.pods_replace([executor(app, i) for app in ("app-a", "app-b") for i in range(1, 5)])
        c.cache.drivers_replace([])
        c.cache.config_maps_replace([], source=True)
        c.cache.config_maps_replace([], source=False)
        assert c.cache.is_synced and c.elector.try_acquire_or_renew()
        yield c, actor
        kube.close()


def dirty(c: Controller) -> set[AppKey]:
    with c._wake:
        found, c._dirty = c._dirty, set()
    return found


def test_dispatched_releases_count_and_a_busy_app_waits_for_its_actions(
    controller: tuple[Controller, HeldActor],
) -> None:
    c, actor = controller
    assert dirty(c) == {A, B}  # the cache's news of both apps
    c.step({A, B}, [], everything=False)
    # The cluster budget (4) goes to app-a; its releases are still being sent.
    assert actor.releases() == [f"app-a-exec-{i}" for i in range(1, 5)]
    actor.finish(B, True)  # app-b's Waiting event
    assert dirty(c) == set()  # nothing changed for it
    # app-b is decided while app-a's PATCHes are in flight: they count, so it gets nothing.
    c.step({B}, [], everything=False)
    assert actor.releases() == []
    actor.finish(B, True)
    # app-a changes while busy: not decided now, but once its actions are done.
    c.step({A}, [], everything=False)  # (the actor refuses actions for a busy app)
    assert actor.releases() == []
    c.step(set(), [], everything=True)  # a tick decides every app but the busy ones
    assert actor.releases() == []
    actor.pending.pop(B, Future()).set_result(True)
    # A write of app-a failed: what it did not release is no longer in flight, and it is decided again.
    actor.finish(A, False)
    assert dirty(c) == {A}
    c.step({A}, [], everything=False)
    assert actor.releases() == [f"app-a-exec-{i}" for i in range(1, 5)]
