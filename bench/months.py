"""Months of a busy cluster in simulated time: what the allocator keeps stays bounded (issue 18).

The real allocator as `sparkgate allocator` assembles it (allocator/commands.py `assemble`: the Controller,
its cache with every pod observer, the work queue, the expectations, the deletion-history store, the real
decision and the real actor), two replicas (a leader and a warm follower), fed in this process by a
simulated API server (`Api`) instead of HTTP, for speed: its watch events go straight to each replica's
cache (`Cache.*_event`, as the reflectors call it), and the actor's writes are answered as kube-apiserver
answers them (JSON Patch `test`, uid preconditions, 404, AlreadyExists), carried out inline on the loop's
thread (the actor's thread pool is replaced by an inline executor). Every clock of every part is the
simulation's.

Over `days` simulated days, `apps_per_day` Spark applications come and go, half in cluster mode (a driver
pod that finishes, then is deleted), half in client mode (no driver pod: half stop cleanly, deleting their
executors and the ConfigMaps of their app id as Spark does, half are killed -9, their executors left, those
running exiting 1, the gated ones gated until sparkgate ends the app). Each has dynamic allocation (its
target moves), executors fail (OOMKilled: Spark deletes them and asks for new ones), webhook outages admit
pods without sparkgate (bypassed), the profile's config map is renamed once mid-run (a policy edit), and the
leader fails over every `failover_days` (it dies; the follower leads; a new follower starts from a list). The
pod garbage collector deletes terminated pods an hour after they ended, and Events expire after an hour
(kube-apiserver's --event-ttl default).

Checked along the way: no release ever puts more pods in flight than a limit allows (per app, namespace,
cluster, counting bypassed pods), no pod is released twice, every pod that mounts a copy finds it when it
starts, and no gated pod of a live app waits longer than `max_gated_wait`. Sampled every simulated hour and
checked at the end, once the cluster has been idle past the grace, the retention and the pod GC: tracked apps,
registry entries, memory and settings, metric series, Events, ConfigMaps (copies and histories), history
sizes and traced memory (tracemalloc) return to their floor.

    python -m bench.months [--days 30] [--apps-per-day 700] [--failover-days 3] [--trace-days 1] [--smoke]
    make soak                # the 30 days; the test suite runs --smoke (2 days)

In process for speed (about 4 simulated days a minute untraced on one core); no HTTP, no sleeps.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import math
import random
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any

from allocator.commands import assemble
from allocator.deletions import DATA_KEY, HISTORY_LABEL
from allocator.loop import Controller, Options
from allocator.metrics import AllocatorMetrics
from kubesim.errors import STALE
from sandbox.caps import CapChecker, Caps, state_of
from sparkgate import contract
from sparkgate.kube import Conflict, Invalid, NotFound, NotLeading
from sparkgate.policy import Policy, load_policy

DAY = 86_400.0
EPOCH = 1_800_000_000.0
STEP = 60.0  # simulated seconds per turn of the loop (a bind and a start take one turn each)
BATCH, PER_APP, PER_NS, CLUSTER = 5, 10, 30, 120
NAMESPACES = 12
GRACE, RETENTION, POD_GC, EVENT_TTL = 300.0, 3600.0, 3600.0, 3600.0
POLICY = """\
apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation: {{batchSize: {batch}, batchDelaySeconds: 1, maxPendingPerApp: {per_app}, maxPendingPerNamespace: {per_ns}, maxPendingCluster: {cluster}}}
caps: {{batchSize: 50, maxPendingPerApp: 100}}
profiles:
  - name: spark
    configMaps: [{{source: {source}, mountPath: /etc/spark-conf}}]
"""
Obj = dict[str, Any]


def policy_text(source: str) -> str:
    return POLICY.format(batch=BATCH, per_app=PER_APP, per_ns=PER_NS, cluster=CLUSTER, source=source)


class Inline(Executor):
    """The actor's pool, inline: an app's actions are carried out when submitted (deterministic)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # the real pool hands the exception to the future too
            future.set_exception(e)
        return future


@dataclass
class Pod:
    obj: Obj
    app: App
    ended_at: float | None = None  # when it terminated (Failed or Succeeded)

    @property
    def gated(self) -> bool:
        return bool(self.obj["spec"].get("schedulingGates"))

    @property
    def phase(self) -> str:
        return str(self.obj["status"]["phase"])


@dataclass
class App:
    namespace: str
    app_id: str
    client: bool
    target: int
    ends_at: float
    killed: bool = False  # client mode: kill -9 (else a clean stop)
    live: bool = True  # the driver runs
    driver: Obj | None = None
    next_id: int = 0
    pods: dict[str, Pod] = field(default_factory=dict)  # live objects (not yet deleted) by name
    gone_at: float | None = None  # cluster mode: when its finished driver pod is deleted


class Api:
    """The simulated API server: pods, ConfigMaps and Events, the scheduler and kubelets reduced to a bind
    and a start one turn each after the release, and the watch: every change goes to every replica's cache."""

    def __init__(self, rand: random.Random) -> None:
        self.now = EPOCH
        self.rand = rand
        self.caches: list[Any] = []
        self.pods: dict[tuple[str, str], Pod] = {}
        self.config_maps: dict[tuple[str, str], Obj] = {}
        self.events: list[tuple[float, str]] = []  # (created, namespace), until they expire
        self.events_posted = 0
        self.apps: dict[str, App] = {}
        self.uid = 0
        # The cap invariant (sandbox/caps.py), at every pod change; a violation is dated in simulated time.
        self.caps = CapChecker(Caps(PER_APP, PER_NS, CLUSTER))
        self.releases = 0
        self.writes: Counter[str] = Counter()

    # --- the watch ---------------------------------------------------------------------------------------

    def _emit_pod(self, kind: str, pod: Pod) -> None:
        self.caps.phase = f"{self.now - EPOCH:.0f}s"
        state = state_of(pod.obj)
        if state is not None:
            self.caps.change(pod.obj["metadata"]["uid"], None if kind == "DELETED" else state)
        role = pod.obj["metadata"]["labels"].get(contract.LABEL_ROLE)
        for cache in self.caches:
            if role == contract.ROLE_DRIVER:
                cache.driver_event(kind, pod.obj)
            else:
                cache.pod_event(kind, pod.obj)

    def _emit_cm(self, kind: str, obj: Obj) -> None:
        meta = obj["metadata"]
        if meta["namespace"] == contract.INSTALL_NAMESPACE:
            if HISTORY_LABEL in meta.get("labels", {}):
                return
            source = True
        elif meta.get("labels", {}).get(contract.LABEL_MANAGED_BY) == contract.MANAGED_BY:
            source = False
        else:
            return
        for cache in self.caches:
            cache.config_map_event(kind, obj, source=source)

    def relist(self, cache: Any) -> None:
        """A new replica's lists (its reflectors' first step)."""
        executors = [
            p.obj
            for p in self.pods.values()
            if p.obj["metadata"]["labels"][contract.LABEL_ROLE] == "executor"
        ]
        drivers = [
            p.obj for p in self.pods.values() if p.obj["metadata"]["labels"][contract.LABEL_ROLE] == "driver"
        ]
        cms = list(self.config_maps.values())
        cache.pods_replace(executors)
        cache.drivers_replace(drivers)
        cache.config_maps_replace(
            [
                c
                for c in cms
                if c["metadata"]["namespace"] == contract.INSTALL_NAMESPACE
                and HISTORY_LABEL not in c["metadata"].get("labels", {})
            ],
            source=True,
        )
        cache.config_maps_replace(
            [
                c
                for c in cms
                if c["metadata"].get("labels", {}).get(contract.LABEL_MANAGED_BY) == contract.MANAGED_BY
                and HISTORY_LABEL not in c["metadata"]["labels"]
            ],
            source=False,
        )

    # --- pods ----------------------------------------------------------------------------------------------

    def stamp(self, at: float | None = None) -> str:
        return dt.datetime.fromtimestamp(self.now if at is None else at, dt.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )

    def _new_uid(self) -> str:
        self.uid += 1
        return f"uid-{self.uid}"

    @property
    def violations(self) -> list[str]:
        return self.caps.violations

    def change(self, pod: Pod, change: Callable[[Obj], None]) -> None:
        change(pod.obj)
        pod.obj["metadata"]["resourceVersion"] = str(self.uid)
        self._emit_pod("MODIFIED", pod)

    def create_pod(self, pod: Pod) -> None:
        meta = pod.obj["metadata"]
        meta.update(uid=self._new_uid(), creationTimestamp=self.stamp())
        self.pods[(meta["namespace"], meta["name"])] = pod
        pod.app.pods[meta["name"]] = pod
        self._emit_pod("ADDED", pod)

    def remove_pod(self, pod: Pod) -> None:
        meta = pod.obj["metadata"]
        if self.pods.pop((meta["namespace"], meta["name"]), None) is None:
            return
        pod.app.pods.pop(meta["name"], None)
        meta["deletionTimestamp"] = self.stamp()
        self._emit_pod("DELETED", pod)

    def terminate(self, pod: Pod, phase: str, reason: str, code: int) -> None:
        def end(obj: Obj) -> None:
            obj["status"] = {
                "phase": phase,
                "containerStatuses": [
                    {
                        "name": contract.SPARK_CONTAINER_NAME,
                        "state": {
                            "terminated": {"exitCode": code, "reason": reason, "finishedAt": self.stamp()}
                        },
                    }
                ],
            }

        pod.ended_at = self.now
        self.change(pod, end)

    # --- what the allocator calls (sparkgate.kube.Kube's methods) ------------------------------------------

    def _path(self, path: str) -> tuple[str, str, str]:
        parts = path.strip("/").split("/")  # api v1 namespaces NS RESOURCE [NAME]
        return parts[3], parts[4], parts[5] if len(parts) > 5 else ""

    def patch(self, path: str, body: Any, content_type: str, *, shape: Any = None) -> Obj:
        namespace, _, name = self._path(path)
        self.writes["release"] += 1
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise NotFound(404, "NotFound", f'pods "{name}" not found')
        gates = pod.obj["spec"].get("schedulingGates") or []
        if not gates or gates[0] != {"name": contract.GATE}:
            raise Invalid(422, "Invalid", "the test operation failed")
        self.change(pod, lambda obj: obj["spec"].pop("schedulingGates"))
        self.releases += 1
        return pod.obj

    def delete(self, path: str, *, preconditions: Any = None, grace_period: int | None = None) -> Obj:
        namespace, resource, name = self._path(path)
        self.writes[f"delete {resource}"] += 1
        if resource == "pods":
            pod = self.pods.get((namespace, name))
            if pod is None or (preconditions and preconditions.get("uid") != pod.obj["metadata"]["uid"]):
                raise (
                    NotFound(404, "NotFound", f'pods "{name}" not found')
                    if pod is None
                    else Conflict(409, "Conflict", "uid precondition failed")
                )
            self.remove_pod(pod)  # not bound: removed at once
            return {}
        obj = self.config_maps.pop((namespace, name), None)
        if obj is None:
            raise NotFound(404, "NotFound", f'configmaps "{name}" not found')
        self._emit_cm("DELETED", obj)
        return {}

    def get(self, path: str) -> Obj:
        namespace, _, name = self._path(path)
        obj = self.config_maps.get((namespace, name))
        if obj is None:
            raise NotFound(404, "NotFound", f'configmaps "{name}" not found')
        return obj

    def create(self, path: str, body: Obj) -> Obj:
        namespace, _, _ = self._path(path + "/x")
        obj = json.loads(json.dumps(body))
        obj["metadata"]["namespace"] = namespace
        key = (namespace, obj["metadata"]["name"])
        self.writes["create configmaps"] += 1
        if key in self.config_maps:
            raise Conflict(409, "AlreadyExists", f'configmaps "{key[1]}" already exists')
        self.uid += 1
        obj["metadata"]["resourceVersion"] = str(self.uid)
        self.config_maps[key] = obj
        self._emit_cm("ADDED", obj)
        return obj

    def replace(self, path: str, body: Obj) -> Obj:
        namespace, _, name = self._path(path)
        if (namespace, name) not in self.config_maps:
            raise NotFound(404, "NotFound", f'configmaps "{name}" not found')
        wanted = body["metadata"].get("resourceVersion")
        if wanted and wanted != self.config_maps[(namespace, name)]["metadata"].get("resourceVersion"):
            raise Conflict(
                409, "Conflict", f'Operation cannot be fulfilled on configmaps "{name}": {STALE}'
            )  # kube-apiserver's precondition
        obj = json.loads(json.dumps(body))
        self.uid += 1
        obj["metadata"].update(namespace=namespace, resourceVersion=str(self.uid))
        self.config_maps[(namespace, name)] = obj
        self.writes["replace configmaps"] += 1
        return obj

    def list(
        self, path: str, *, label_selector: str | None = None, page_size: int = 500
    ) -> tuple[list[Obj], str]:
        namespace, _, _ = self._path(path + "/x")
        label = (label_selector or "").split("=")[0]
        items = [
            c for (ns, _), c in self.config_maps.items()
            if ns == namespace and c["metadata"].get("labels", {}).get(label) == "true"
        ]  # fmt: skip
        return items, str(self.uid)

    def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        """The actor's Events (sparkgate/events.py): a POST makes an Event object, a PATCH updates one."""
        namespace, _, _ = self._path(path + "/x")
        self.writes[f"{method.lower()} events"] += 1
        if method == "POST":
            self.events.append((self.now, namespace))
            self.events_posted += 1
        return {}

    def gated(self, leading: Callable[[], bool], *, timeout: float) -> Gated:
        return Gated(self, leading)  # answered at once: no request outlives the fence


class Gated:
    """`Kube.gated` for the simulated API server: every write asks `leading()` first and is not sent
    (NotLeading) when it is false; reads go through."""

    def __init__(self, api: Api, leading: Callable[[], bool]) -> None:
        self.api, self.leading = api, leading

    def _write(self, what: str) -> None:
        if not self.leading():
            raise NotLeading(0, "NotLeading", f"{what} not sent: this replica does not lead")

    def may_write(self) -> bool:
        return self.leading()

    def patch(self, path: str, body: Any, content_type: str, *, shape: Any = None) -> Obj:
        self._write(f"PATCH {path}")
        return self.api.patch(path, body, content_type)

    def delete(self, path: str, **kwargs: Any) -> Obj:
        self._write(f"DELETE {path}")
        return self.api.delete(path, **kwargs)

    def create(self, path: str, body: Obj) -> Obj:
        self._write(f"POST {path}")
        return self.api.create(path, body)

    def replace(self, path: str, body: Obj) -> Obj:
        self._write(f"PUT {path}")
        return self.api.replace(path, body)

    def get(self, path: str) -> Obj:
        return self.api.get(path)

    def list(self, path: str, **kwargs: Any) -> tuple[list[Obj], str]:
        return self.api.list(path, **kwargs)

    def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        if method != "GET":
            self._write(f"{method} {path}")
        return self.api.request(method, path, **kwargs)


class Sim:
    """The cluster's users and Spark: apps come and go, drivers ask for executors, executors fail."""

    def __init__(
        self, api: Api, rand: random.Random, apps_per_day: float, outages: list[tuple[float, float]]
    ) -> None:
        self.api = api
        self.rand = rand
        self.apps_per_day = apps_per_day
        self.outages = outages
        self.source = "spark-conf"
        self.started = 0
        self.modes: Counter[str] = Counter()
        self.max_gated_wait = 0.0
        self.unmountable = 0
        self.bypassed = 0

    def webhook_down(self) -> bool:
        return any(a <= self.api.now < b for a, b in self.outages)

    def start_app(self) -> None:
        api, rand = self.api, self.rand
        self.started += 1
        client = rand.random() < 0.5
        app = App(
            f"team-{rand.randrange(NAMESPACES):02d}",
            f"spark-{self.started:06d}",
            client,
            rand.randint(2, 12),
            api.now + rand.uniform(5 * 60, 50 * 60),
            killed=client and rand.random() < 0.5,
        )
        self.modes["client-killed" if app.killed else "client" if client else "cluster"] += 1
        api.apps[app.app_id] = app
        if not client:
            app.driver = {
                "metadata": {
                    "name": f"{app.app_id}-driver",
                    "namespace": app.namespace,
                    "labels": {contract.LABEL_ROLE: "driver", contract.LABEL_APP_ID: app.app_id},
                },
                "spec": {},
                "status": {"phase": "Running"},
            }
            api.create_pod(Pod(app.driver, app))

    def executor(self, app: App) -> None:
        app.next_id += 1
        meta: Obj = {
            "name": f"{app.app_id}-exec-{app.next_id}",
            "namespace": app.namespace,
            "labels": {
                contract.LABEL_ROLE: "executor",
                contract.LABEL_APP_ID: app.app_id,
                contract.LABEL_EXEC_ID: str(app.next_id),
            },
            "annotations": {},
        }
        spec: Obj = {}
        if app.driver is not None:
            meta["ownerReferences"] = [
                {"uid": app.driver["metadata"]["uid"], "controller": True, "kind": "Pod"}
            ]
        self.bypassed += self.webhook_down()
        if not self.webhook_down():  # the webhook: gate, profile, the copy of the profile's config map
            meta["annotations"][contract.ANNOTATION_PROFILE] = "spark"
            spec["schedulingGates"] = [{"name": contract.GATE}]
            spec["volumes"] = [
                {
                    "name": contract.configmap_volume_name(self.source),
                    "configMap": {"name": contract.app_configmap_name(app.app_id, self.source)},
                }
            ]
        self.api.create_pod(Pod({"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}, app))

    def turn(self) -> None:
        api, rand = self.api, self.rand
        for _ in range(self._arrivals()):
            self.start_app()
        for app in list(api.apps.values()):
            if app.live:
                self._spark(app)
            self._kubelet(app)
            if not app.live and app.gone_at is not None and api.now >= app.gone_at and app.driver is not None:
                driver = api.pods.get((app.namespace, app.driver["metadata"]["name"]))
                if driver is not None:  # the finished driver pod is deleted: its executors are collected
                    for pod in list(app.pods.values()):
                        api.remove_pod(pod)
                    app.gone_at = None
            if not app.live and not app.pods:
                del api.apps[app.app_id]
        if api.events and api.events[0][0] < api.now - EVENT_TTL:
            api.events = [e for e in api.events if e[0] >= api.now - EVENT_TTL]
        del rand

    def _arrivals(self) -> int:
        expected = self.apps_per_day * STEP / DAY
        n = int(expected)
        return n + (1 if self.rand.random() < expected - n else 0)

    def _spark(self, app: App) -> None:
        api, rand = self.api, self.rand
        if api.now >= app.ends_at:
            self._end(app)
            return
        if rand.random() < 0.02:  # dynamic allocation
            app.target = max(1, min(30, app.target + rand.choice((-4, -2, 2, 4, 8))))
        pods = [
            p for p in app.pods.values() if p.obj["metadata"]["labels"][contract.LABEL_ROLE] == "executor"
        ]
        for pod in pods:
            if pod.phase == "Failed":  # Spark deletes a failed executor (and asks for another)
                api.remove_pod(pod)
        live = [
            p for p in pods if p.phase in ("Pending", "Running") and p.obj["metadata"]["name"] in app.pods
        ]
        if len(live) > app.target:  # scale down: the newest pending pods go
            pending = sorted(
                (p for p in live if p.phase == "Pending"),
                key=lambda p: -int(p.obj["metadata"]["labels"][contract.LABEL_EXEC_ID]),
            )
            for pod in pending[: len(live) - app.target]:
                api.remove_pod(pod)
        elif len(live) < app.target:
            for _ in range(min(BATCH, app.target - len(live))):
                self.executor(app)

    def _end(self, app: App) -> None:
        api = self.api
        app.live = False
        executors = [
            p for p in app.pods.values() if p.obj["metadata"]["labels"][contract.LABEL_ROLE] == "executor"
        ]
        if app.killed:  # kill -9: nothing deleted; running executors lose their driver and exit 1
            for pod in executors:
                if pod.phase == "Running":
                    api.terminate(pod, "Failed", "Error", 1)
            return
        for pod in executors:  # SparkContext.stop: the executors are deleted
            api.remove_pod(pod)
        if app.client:  # ... and the ConfigMaps of its app id (sparkgate's copies included)
            for key, obj in list(api.config_maps.items()):
                if (
                    key[0] == app.namespace
                    and obj["metadata"].get("labels", {}).get(contract.LABEL_APP_ID) == app.app_id
                ):
                    api.delete(f"/api/v1/namespaces/{key[0]}/configmaps/{key[1]}")
        else:
            assert app.driver is not None
            driver = api.pods[(app.namespace, app.driver["metadata"]["name"])]
            api.terminate(driver, "Succeeded", "Completed", 0)
            app.gone_at = api.now + self.rand.uniform(60, 3 * 3600)

    def _kubelet(self, app: App) -> None:
        """The scheduler and kubelets: released pods bind, bound pods start (if their copy exists), some fail;
        the pod GC deletes terminated pods POD_GC after they ended."""
        api, rand = self.api, self.rand
        for pod in list(app.pods.values()):
            obj = pod.obj
            if obj["metadata"]["labels"][contract.LABEL_ROLE] != "executor":
                if pod.ended_at is not None and api.now - pod.ended_at > POD_GC:
                    api.remove_pod(pod)
                continue
            if pod.gated:
                if app.live:
                    created = (
                        dt.datetime.strptime(obj["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ")
                        .replace(tzinfo=dt.UTC)
                        .timestamp()
                    )
                    self.max_gated_wait = max(self.max_gated_wait, api.now - created)
                continue
            phase = pod.phase
            if phase == "Pending" and not obj["spec"].get("nodeName"):
                api.change(pod, lambda o: o["spec"].__setitem__("nodeName", f"node-{rand.randrange(50)}"))
            elif phase == "Pending":
                copies = [v["configMap"]["name"] for v in obj["spec"].get("volumes") or []]
                if any((app.namespace, name) not in api.config_maps for name in copies):
                    self.unmountable += 1  # ContainerCreating: counted, it starts once its copy exists
                    continue
                if not app.live:  # started after its client driver died: cannot reach it, exits 1
                    api.terminate(pod, "Failed", "Error", 1)
                else:
                    api.change(pod, lambda o: o["status"].__setitem__("phase", "Running"))
            elif phase == "Running" and rand.random() < 0.002:
                api.terminate(pod, "Failed", "OOMKilled", 137)
            elif pod.ended_at is not None and api.now - pod.ended_at > POD_GC:
                api.remove_pod(pod)


class Replicas:
    """The leader and its warm follower, assembled as `sparkgate allocator` assembles them."""

    def __init__(self, api: Api, policy: list[Policy]) -> None:
        self.api = api
        self.policy = policy
        self.leader = self.replica("a", leading=True)
        self.follower = self.replica("b", leading=False)
        self.failovers = 0

    def replica(self, identity: str, *, leading: bool) -> Controller:
        api = self.api
        options = Options(identity=identity, client_grace=GRACE, history_retention=RETENTION)
        current = self.policy

        class Source:
            def current(self) -> Policy:
                return current[0]

        allocator = assemble(api, Source(), options, AllocatorMetrics())  # type: ignore[arg-type]
        c = allocator.controller
        now = lambda: api.now  # noqa: E731
        c.clock = c.monotonic = now
        c.queue.monotonic = c.expectations.monotonic = c.bind_times.clock = now
        c.histories.clock = c.histories.monotonic = c.actor.clock = now
        c.actor._pool.shutdown()
        c.actor._pool = Inline()  # type: ignore[assignment]
        c.actor._writes.shutdown()
        c.actor._writes = Inline()  # type: ignore[assignment]
        lead(c, leading)
        c.elector.try_acquire_or_renew = lambda: c.elector.leading  # type: ignore[method-assign]
        api.caches.append(c.cache)
        api.relist(c.cache)
        while not c.histories.load():
            pass
        return c

    def failover(self) -> None:
        """The leader dies (its last flush was this turn's); the follower leads; a new follower lists."""
        dead = self.leader
        self.api.caches.remove(dead.cache)
        self.leader, self.follower = self.follower, self.replica(f"r{self.failovers}", leading=False)
        lead(self.leader, True)
        self.leader.metrics.leader_transitions.inc()
        self.failovers += 1

    def turn(self) -> None:
        for c in (self.leader, self.follower):
            c.tick()
            for _ in range(50):
                keys = c.queue.get(0)
                if not keys:
                    break
                c.step(keys)
        self.leader.histories.flush()


def lead(c: Controller, leading: bool) -> None:
    """Make a replica lead or follow for good: the soak stands in for the Lease (its fail-overs are the
    soak's), so leadership is a renew that never ages (sparkgate/leader.py derives `leading` from it)."""
    c.elector._renewed_at = math.inf if leading else None


def series(metrics: AllocatorMetrics) -> int:
    return sum(len(m.samples) for m in metrics.families())


def app_series(metrics: AllocatorMetrics) -> int:
    return sum(
        1 for m in metrics.families() for s in m.samples if "app" in s.labels or "namespace" in s.labels
    )


def sample(api: Api, replicas: Replicas, sim: Sim) -> dict[str, float]:
    c = replicas.leader
    histories = [
        cm
        for (ns, _), cm in api.config_maps.items()
        if ns == contract.INSTALL_NAMESPACE and HISTORY_LABEL in cm["metadata"].get("labels", {})
    ]
    return {
        "day": round((api.now - EPOCH) / DAY, 3),
        "live_apps": sum(1 for a in api.apps.values() if a.live),
        "pods": len(api.pods),
        "tracked_apps": len(c._visible(c.cache.snapshot()).apps),
        "cache_apps": len(c.cache.snapshot().apps),
        "registry": len(c.registry._lives),
        "memory": len(c.memory) + len(replicas.follower.memory),
        "settings": len(c.settings),
        "histories": c.histories.count(),
        "history_configmaps": len(histories),
        "largest_history_bytes": max((len(h["data"][DATA_KEY]) for h in histories), default=0),
        "copies": sum(1 for (ns, _) in api.config_maps if ns != contract.INSTALL_NAMESPACE),
        "events": len(api.events),
        "series": series(c.metrics),
        "app_and_namespace_series": app_series(c.metrics),
        "follower_series": series(replicas.follower.metrics),
        "traced_mib": round(tracemalloc.get_traced_memory()[0] / 2**20, 2),
        "allocated_blocks": sys.getallocatedblocks(),
    }


def run(
    days: float,
    apps_per_day: float,
    failover_days: float,
    *,
    trace_days: float = 1,
    seed: int = 18,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The simulation; tracemalloc (which slows it fivefold) traces the last `trace_days` of arrivals and the
    idle tail: what it still holds at the end was allocated then and kept."""
    rand = random.Random(seed)
    api = Api(rand)
    for source in ("spark-conf", "spark-conf-v2"):
        api.create(
            f"/api/v1/namespaces/{contract.INSTALL_NAMESPACE}/configmaps",
            {"metadata": {"name": source}, "data": {"a": source}},
        )
    policy = [load_policy(policy_text("spark-conf"))]
    # A webhook outage of 30 minutes every other day (daily in a short run): pods admitted without sparkgate.
    outages = [
        (EPOCH + d * DAY + 0.3 * DAY, EPOCH + d * DAY + 0.3 * DAY + 1800)
        for d in range(int(days))
        if d % 2 == 1 or days <= 2
    ]
    sim = Sim(api, rand, apps_per_day, outages)
    replicas = Replicas(api, policy)
    gc.collect()
    floor = sample(api, replicas, sim)
    started, samples = time.perf_counter(), [floor]
    end_of_arrivals, next_sample, next_failover = (
        EPOCH + days * DAY,
        EPOCH + 3600,
        EPOCH + failover_days * DAY,
    )
    trace_from = end_of_arrivals - trace_days * DAY
    # Idle until every app ended (50 min), its grace, its history's retention and the pod GC have passed.
    idle_until = end_of_arrivals + 50 * 60 + GRACE + RETENTION + POD_GC + 2 * 3600
    renamed = False
    while api.now < idle_until:
        api.now += STEP
        if api.now >= end_of_arrivals:
            sim.apps_per_day = 0
        if not tracemalloc.is_tracing() and api.now >= trace_from:
            gc.collect()
            tracemalloc.start()
        if (
            not renamed and api.now >= EPOCH + days * DAY / 2
        ):  # a policy edit: the profile's config map renamed
            policy[0], sim.source, renamed = load_policy(policy_text("spark-conf-v2")), "spark-conf-v2", True
        sim.turn()
        replicas.turn()
        if api.now >= next_failover and api.now < end_of_arrivals:
            replicas.failover()
            next_failover += failover_days * DAY
        if api.now >= next_sample:
            next_sample += 3600
            samples.append(sample(api, replicas, sim))
            if len(samples) % 24 == 0:
                log(f"day {samples[-1]['day']:>6}: {json.dumps(samples[-1])}")
    gc.collect()
    final = sample(api, replicas, sim)
    tracemalloc.stop()
    peak = {k: max(s[k] for s in samples) for k in samples[0] if k != "day"}
    return {
        "days": days,
        "apps": sim.started,
        "modes": dict(sim.modes),
        "failovers": replicas.failovers,
        "releases": api.releases,
        "bypassed_pods": sim.bypassed,
        "events_posted": api.events_posted,
        "writes": dict(api.writes),
        "violations": api.violations,
        "max_gated_wait_s": sim.max_gated_wait,
        "unmountable_turns": sim.unmountable,
        "ended": {
            m: replicas.leader.metrics.apps_ended.labels(m)._value.get() for m in ("cluster", "client")
        },
        "floor": floor,
        "peak": peak,
        "final": final,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def check(result: dict[str, Any]) -> list[str]:
    """What must hold; each broken bound as a sentence (empty: all hold)."""
    peak, final, floor = result["peak"], result["final"], result["floor"]
    problems = list(result["violations"][:5])
    # Along the way: what the allocator keeps follows the live apps (plus those in their grace or being
    # cleaned up, and histories within their retention), never the apps seen so far.
    bounds = {
        "tracked_apps": 2 * peak["live_apps"],
        "registry": 4 * peak["live_apps"] + 50,
        "memory": 2 * peak["live_apps"],
        "settings": 2 * peak["live_apps"],
        "histories": 8 * peak["live_apps"] + 100,
        "largest_history_bytes": 64 * 1024,
        "app_and_namespace_series": 40 * peak["live_apps"] + 20 * NAMESPACES,
    }
    for key, bound in bounds.items():
        if peak[key] > bound:
            problems.append(f"peak {key} {peak[key]} > {bound}")
    # Idle again: back to the floor.
    for key in ("tracked_apps", "cache_apps", "registry", "memory", "settings", "histories", "history_configmaps",
                "copies", "events", "app_and_namespace_series", "pods"):  # fmt: skip
        if final[key] != floor[key]:
            problems.append(f"idle at the end: {key} {final[key]} != {floor[key]} at the start")
    if final["series"] > floor["series"] + 5:
        problems.append(f"series {final['series']} at the end, {floor['series']} at the start")
    if final["traced_mib"] > 2:
        problems.append(f"{final['traced_mib']} MiB allocated while traced and still held at the end")
    if result["max_gated_wait_s"] > 600:
        problems.append(f"a gated pod of a live app waited {result['max_gated_wait_s']:.0f} s")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--apps-per-day", type=float, default=700)
    parser.add_argument("--failover-days", type=float, default=3)
    parser.add_argument(
        "--trace-days", type=float, default=1, help="days traced by tracemalloc (fivefold slower)"
    )
    parser.add_argument("--smoke", action="store_true", help="2 days, as the test suite runs it")
    args = parser.parse_args(argv)
    if args.smoke:
        args.days, args.failover_days, args.trace_days = 2, 0.7, 0.5
    result = run(
        args.days, args.apps_per_day, args.failover_days, trace_days=args.trace_days,
        log=lambda line: print(line, file=sys.stderr),
    )  # fmt: skip
    problems = check(result)
    result["problems"] = problems
    print(json.dumps(result, indent=1))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
