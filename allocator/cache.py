"""The allocator's view of the cluster: reflectors (sparkgate/kube.py `Reflector`: list, then watch) feeding
a cache of compact records.

A reflector relists only on 410 (or after a handler's crash); the cache diffs a relist against what it
held and treats what vanished as deleted. Objects are raw JSON turned at once into small frozen records
(allocator/model.py): the cache never keeps whole pods. Every change names the apps it touched, so the loop decides only for those.

Pruning: an app's entries go with the last of its objects (pods, driver, copies); its view and whether its
driver was seen go at the next snapshot after that.

Threading: each reflector runs in its own thread and calls the cache's `*_event`/`*_replace` methods. The
cache holds one lock, `Cache._lock`, for its maps; it is a leaf: every callback (`on_change`, `on_gone`, the
pod observers) is called after it is released, on the calling reflector's thread, in the order of the
changes (every pod change comes from the one executors reflector). Readers (the loop, HTTP threads) take
immutable snapshots.
"""

from __future__ import annotations

import datetime as dt
import functools
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import immutables

from sparkgate import contract
from sparkgate.contract import AppKey

from .model import AppView, DriverRecord, PodRecord, RequestRecord, Snapshot

Obj = dict[str, Any]
# The volumes of the copies the webhook mounts: named contract.configmap_volume_name(source).
COPY_VOLUME_PREFIX = "sparkgate-"


@functools.lru_cache(maxsize=4096)
def _timestamp(text: str | None) -> float:
    """Seconds since the epoch of an RFC 3339 time (0.0: none or not one). Memoized: a pod's creation time is
    read again at each of its watch events, and the pods of a burst share theirs (one-second resolution)."""
    if not text:
        return 0.0
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _shared(value: str | None) -> str | None:
    return None if value is None else sys.intern(value)


# --- what the allocator reads of an executor pod ----------------------------------------------------------
# The executors' reflector decodes only these fields of each pod (sparkgate/kube.py `decode`): a Spark executor
# pod is ~10 KB of JSON of which `pod_record` reads these few, and building the rest was most of the
# reflector's time per watch event. A field `pod_record` reads must be named here: the tests compare the
# records of whole and shaped pods (tests/allocator/test_cache.py).


class _Owner(TypedDict, total=False):
    uid: str | None
    controller: bool | None


class _Meta(TypedDict, total=False):
    namespace: str | None
    name: str | None
    uid: str | None
    resourceVersion: str | None  # the reflector's
    labels: dict[str, str] | None
    annotations: dict[str, str] | None
    ownerReferences: list[_Owner] | None
    deletionTimestamp: str | None
    creationTimestamp: str | None


class _Named(TypedDict, total=False):
    name: str | None


class _Volume(TypedDict, total=False):
    name: str | None
    configMap: _Named | None


class _Spec(TypedDict, total=False):
    nodeName: str | None
    schedulingGates: list[_Named] | None
    volumes: list[_Volume] | None


class _Terminated(TypedDict, total=False):
    reason: str | None
    exitCode: int | None
    finishedAt: str | None


class _State(TypedDict, total=False):
    terminated: _Terminated | None


class _ContainerStatus(TypedDict, total=False):
    name: str | None
    state: _State | None


class _Condition(TypedDict, total=False):
    type: str | None
    status: str | None
    reason: str | None
    message: str | None


class _Status(TypedDict, total=False):
    phase: str | None
    reason: str | None
    containerStatuses: list[_ContainerStatus] | None
    conditions: list[_Condition] | None


class ExecutorPod(TypedDict, total=False):
    """The fields of an executor pod that `pod_record` (and the reflector) read."""

    metadata: _Meta | None
    spec: _Spec | None
    status: _Status | None


def pod_record(obj: Obj) -> PodRecord | None:
    """The record of an executor pod, or None when it is not one (no app id)."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    app_id = labels.get(contract.LABEL_APP_ID)
    if not app_id:
        return None
    raw_id = labels.get(contract.LABEL_EXEC_ID, "")
    gate_index = contract.gate_index(obj)
    reason, exit_code, finished = status.get("reason"), None, None
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            reason = reason or terminated.get("reason")
            exit_code = terminated.get("exitCode")
            finished = _timestamp(terminated.get("finishedAt")) or None
            if container.get("name") == contract.SPARK_CONTAINER_NAME:
                break
    owner = next((r.get("uid") for r in meta.get("ownerReferences") or [] if r.get("controller")), None)
    copies = tuple(
        sys.intern(v["configMap"]["name"])
        for v in spec.get("volumes") or []
        if str(v.get("name", "")).startswith(COPY_VOLUME_PREFIX) and (v.get("configMap") or {}).get("name")
    )
    # kube-scheduler's verdict on a pod it could not place (pkg/scheduler/schedule_one.go,
    # handleSchedulingFailure), or sparkgate's own mark on a pod it holds (contract.HELD_MARK), or the API
    # server's SchedulingGated, which the mark replaces.
    unschedulable = held_mark = False
    gated_condition = None
    for i, c in enumerate(status.get("conditions") or ()):
        if c.get("type") != "PodScheduled" or c.get("status") != "False":
            continue
        if c.get("reason") == "Unschedulable":
            held_mark = contract.is_held_mark(c.get("message"))
            unschedulable = not held_mark
        elif c.get("reason") == contract.SCHEDULING_GATED:
            gated_condition = i
    # The values every pod of an app (or of a node) repeats are interned: one string each, not one per pod
    # (a third of a record's memory, bench/scale.py).
    return PodRecord(
        namespace=sys.intern(meta.get("namespace", "")),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        app_id=sys.intern(app_id),
        exec_id=int(raw_id) if raw_id.isdecimal() else None,
        resource_profile=sys.intern(labels.get(contract.LABEL_RESOURCE_PROFILE, "0")),
        gated=gate_index is not None,
        profile=_shared(annotations.get(contract.ANNOTATION_PROFILE)),
        node=_shared(spec.get("nodeName") or None),
        phase=sys.intern(status.get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        created=_timestamp(meta.get("creationTimestamp")),
        batch_size=annotations.get(contract.ANNOTATION_BATCH_SIZE),
        max_pending=annotations.get(contract.ANNOTATION_MAX_PENDING),
        owner_uid=_shared(owner),  # the driver's: the same for every pod of an app
        reason=reason,
        exit_code=exit_code,
        gate_index=gate_index,
        finished=finished,
        copies=copies,
        unschedulable=unschedulable,
        held_mark=held_mark,
        gated_condition=gated_condition,
        consumes=annotations.get(contract.ANNOTATION_CONSUME_REQUEST),
    )


def driver_record(obj: Obj) -> DriverRecord | None:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    app_id = (meta.get("labels") or {}).get(contract.LABEL_APP_ID)
    if not app_id:
        return None
    return DriverRecord(
        meta.get("namespace", ""),
        meta.get("name", ""),
        meta.get("uid", ""),
        app_id,
        status.get("phase") or "Pending",
        bool(meta.get("deletionTimestamp")),
    )


def request_record(obj: Obj) -> RequestRecord | None:
    """The record of one of sparkgate's ProvisioningRequests (labelled with its app), or None."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    app_id = (meta.get("labels") or {}).get(contract.LABEL_APP_ID)
    if not app_id:
        return None
    conditions = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or ()}

    def true(kind: str) -> bool:
        return (conditions.get(kind) or {}).get("status") == "True"

    # The verdict that ends a request first (conditions.go: Failed and BookingExpired are final), then CA's
    # own answer (Provisioned True or False); no answer yet (or Accepted alone): pending.
    state, said = "pending", None
    for kind, name in (("Failed", "failed"), ("BookingExpired", "expired"), ("CapacityRevoked", "revoked")):
        if true(kind):
            state, said = name, conditions[kind]
            break
    else:
        provisioned = conditions.get("Provisioned")
        if provisioned is not None and provisioned.get("status") in ("True", "False"):
            state = "provisioned" if provisioned["status"] == "True" else "not-provisioned"
            said = provisioned
    name = meta.get("name", "")
    return RequestRecord(
        namespace=meta.get("namespace", ""),
        name=name,
        app_id=app_id,
        class_name=str(spec.get("provisioningClassName", "")),
        count=sum(int(s.get("count") or 0) for s in spec.get("podSets") or ()),
        state=state,
        sequence=contract.provisioning_sequence(name),
        message=str((said or {}).get("message") or ""),
    )


Gone_ = Callable[[PodRecord, bool], None]  # (the pod's last record, removed from the cluster?)
# (old, new) record of one executor pod: old None when it appears, new None when it is gone.
PodObserver = Callable[[PodRecord | None, PodRecord | None], None]


class Cache:
    """Thread-safe. Reflectors call the `*_event`/`*_replace` methods; the loop calls `snapshot()`.

    `pod_observers` is the one place where every change of an executor pod's record is seen (old, new),
    after the cache has applied it: add one to follow pods (expectations, release-to-bind times, ...)."""

    def __init__(self, on_change: Callable[[set[AppKey]], None], on_gone: Gone_) -> None:
        self._lock = threading.Lock()
        self._on_change = on_change
        self._on_gone = on_gone
        self.pod_observers: list[PodObserver] = []
        # Whether a change of a pod's record is the allocator's own write that its decisions already count
        # (Expectations.confirms): the app's view changes, but the app is not decided again for it. At every
        # release the watch shows each gate removal; deciding the app again for it found nothing new.
        self.confirms: Callable[[PodRecord, PodRecord], bool] | None = None
        self._pods: dict[AppKey, dict[str, PodRecord]] = {}
        self._drivers: dict[AppKey, DriverRecord] = {}
        self._driver_seen: set[AppKey] = set()
        self._config_maps: dict[AppKey, set[str]] = {}
        self._sources: set[str] = set()
        # A persistent map (a HAMT): a snapshot hands out the map itself, and the next one changes only the
        # stale apps' entries of a new map, so a snapshot costs per changed app, not per app (copying a
        # dict of 5,000 views took ~100 us per step at 100,000 pods: bench/scale.py).
        self._views: immutables.Map[AppKey, AppView] = immutables.Map()
        self._stale: set[AppKey] = set()  # apps whose view changed since the last snapshot
        # The apps whose views were rebuilt or went since the last tracked snapshot (the loop's), whoever
        # took the snapshots in between, and how many tracked snapshots were taken.
        self._changed: set[AppKey] = set()
        self._tracked = 0
        # Pods in flight per namespace, the sum of the views' counts; each app's share as last summed.
        self._in_flight: Counter[str] = Counter()
        self._counted: dict[AppKey, int] = {}
        self._gone_uids: set[str] = set()
        # sparkgate's ProvisioningRequests and PodTemplates, per app (only where the API server serves them:
        # `provisioning`, which adds their watches to what must be synced).
        self._requests: dict[AppKey, dict[str, RequestRecord]] = {}
        self._templates: dict[AppKey, set[str]] = {}
        self.synced: dict[str, bool] = {}
        self.required = ["pods", "drivers", "sources", "copies"]

    def provisioning(self) -> None:
        """The API server serves ProvisioningRequests: their watch and the PodTemplates' must be synced too."""
        self.required += ["requests", "templates"]

    # --- executor pods ----------------------------------------------------------------------------------

    def pod_event(self, kind: str, obj: Obj) -> None:
        record = pod_record(obj)
        if record is None:
            return
        out = _Out()
        with self._lock:
            changed = self._apply_pod(kind, record, out)
        if changed:
            self._emit(out, set() if self._confirmed(out) else {record.app})

    def _confirmed(self, out: _Out) -> bool:
        """One pod's change, and the allocator's own write its decisions already count (`confirms`)."""
        if self.confirms is None or out.gone or len(out.changes) != 1:
            return False
        old, new = out.changes[0]
        return old is not None and new is not None and self.confirms(old, new)

    def _apply_pod(self, kind: str, record: PodRecord, out: _Out) -> bool:
        """Apply one event's record (the lock held); False when the cache already held that very record."""
        pods = self._pods.setdefault(record.app, {})
        previous = pods.get(record.name)
        if (
            kind != "DELETED"
            and previous == record
            and (not record.deleting or record.uid in self._gone_uids)
        ):
            # Nothing the allocator reads changed: a kubelet's status update while the pod starts (its
            # conditions, IPs, a container waiting), a label the driver adds. The app keeps its view and is
            # not decided again for it.
            return False
        self._invalidate(record.app)
        if kind == "DELETED":
            pods.pop(record.name, None)
            if not pods:
                del self._pods[record.app]
            last = previous if previous and previous.uid == record.uid else record
            if record.uid not in self._gone_uids:
                out.gone.append((last, True))
            self._gone_uids.discard(record.uid)
            if previous is not None:
                out.changes.append((previous, None))
            return True
        if previous is not None and previous.uid != record.uid:
            if previous.uid not in self._gone_uids:
                out.gone.append((previous, True))  # replaced by a new pod of the same name while we were away
            out.changes.append((previous, None))
            previous = None
        pods[record.name] = record
        if previous != record:
            out.changes.append((previous, record))
        if record.deleting and record.uid not in self._gone_uids:
            self._gone_uids.add(record.uid)
            out.gone.append((record, False))
        return True

    def pods_replace(self, items: Iterable[Obj]) -> None:
        """A relist: the new state is the list; what the cache held and the list lacks was deleted. Each
        object is made a record as the list's pages come (Reflector._list), before anything changes."""
        records = [r for r in map(pod_record, items) if r is not None]
        fresh = {(r.namespace, r.name): r for r in records}
        out = _Out()
        with self._lock:
            touched = set(self._pods)
            for pods in list(self._pods.values()):
                for record in list(pods.values()):
                    if (record.namespace, record.name) not in fresh:
                        self._apply_pod("DELETED", record, out)
            for record in records:
                self._apply_pod("MODIFIED", record, out)
                touched.add(record.app)
            self.synced["pods"] = True
        self._emit(out, touched)

    def _emit(self, out: _Out, touched: set[AppKey]) -> None:
        """The callbacks of one change, outside the lock, in order."""
        for record, removed in out.gone:
            self._on_gone(record, removed)
        for old, new in out.changes:
            for observer in self.pod_observers:
                observer(old, new)
        if touched:
            self._on_change(touched)

    # --- drivers -------------------------------------------------------------------------------------

    def driver_event(self, kind: str, obj: Obj) -> None:
        record = driver_record(obj)
        if record is None:
            return
        key = AppKey(record.namespace, record.app_id)
        with self._lock:
            self._invalidate(key)
            self._driver_seen.add(key)
            if kind == "DELETED":
                current = self._drivers.get(key)
                if current is None or current.uid == record.uid:
                    self._drivers.pop(key, None)
            else:
                self._drivers[key] = record
        self._on_change({key})

    def drivers_replace(self, items: Iterable[Obj]) -> None:
        records = [r for r in map(driver_record, items) if r is not None]
        with self._lock:
            touched = set(self._drivers)
            self._drivers = {AppKey(r.namespace, r.app_id): r for r in records}
            touched |= set(self._drivers)
            self._driver_seen |= touched
            for key in touched:
                self._invalidate(key)
            self.synced["drivers"] = True
        self._on_change(touched)

    # --- config maps: sparkgate's per-app copies (any namespace) and the sources (install namespace) ----

    def config_map_event(self, kind: str, obj: Obj, *, source: bool) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        with self._lock:
            if source:
                (self._sources.discard if kind == "DELETED" else self._sources.add)(name)
                touched = set(self._pods)
                self._invalidate_all()
            else:
                app_id = (meta.get("labels") or {}).get(contract.LABEL_APP_ID)
                if not app_id:
                    return
                key = AppKey(meta.get("namespace", ""), app_id)
                names = self._config_maps.setdefault(key, set())
                (names.discard if kind == "DELETED" else names.add)(name)
                if not names:
                    del self._config_maps[key]
                self._invalidate(key)
                touched = {key}
        self._on_change(touched)

    def config_maps_replace(self, items: Iterable[Obj], *, source: bool) -> None:
        names: list[tuple[AppKey | None, str]] = []  # (the app of a copy, None for a source; its name)
        for obj in items:  # read whole before anything changes: a later page of the list may fail
            meta = obj.get("metadata") or {}
            app_id = None if source else (meta.get("labels") or {}).get(contract.LABEL_APP_ID)
            if source or app_id:
                names.append(
                    (AppKey(meta.get("namespace", ""), app_id) if app_id else None, meta.get("name", ""))
                )
        with self._lock:
            if source:
                self._sources = {name for _, name in names}
                self.synced["sources"] = True
            else:
                self._config_maps = {}
                for key, name in names:
                    assert key is not None
                    self._config_maps.setdefault(key, set()).add(name)
                self.synced["copies"] = True
            self._invalidate_all()
            touched = set(self._pods)
        self._on_change(touched)

    # --- ProvisioningRequests and their PodTemplates (labelled with their app, any namespace) ---------

    def request_event(self, kind: str, obj: Obj) -> None:
        record = request_record(obj)
        if record is None:
            return
        key = AppKey(record.namespace, record.app_id)
        with self._lock:
            requests = self._requests.setdefault(key, {})
            if kind == "DELETED":
                requests.pop(record.name, None)
            else:
                requests[record.name] = record
            if not requests:
                del self._requests[key]
            self._invalidate(key)
        self._on_change({key})

    def requests_replace(self, items: Iterable[Obj]) -> None:
        records = [r for r in map(request_record, items) if r is not None]
        with self._lock:
            touched = set(self._requests)
            self._requests = {}
            for r in records:
                self._requests.setdefault(AppKey(r.namespace, r.app_id), {})[r.name] = r
            touched |= set(self._requests)
            for key in touched:
                self._invalidate(key)
            self.synced["requests"] = True
        self._on_change(touched)

    def template_event(self, kind: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        app_id = (meta.get("labels") or {}).get(contract.LABEL_APP_ID)
        if not app_id:
            return
        key = AppKey(meta.get("namespace", ""), app_id)
        with self._lock:
            names = self._templates.setdefault(key, set())
            (names.discard if kind == "DELETED" else names.add)(meta.get("name", ""))
            if not names:
                del self._templates[key]
            self._invalidate(key)
        self._on_change({key})

    def templates_replace(self, items: Iterable[Obj]) -> None:
        found: dict[AppKey, set[str]] = {}
        for obj in items:
            meta = obj.get("metadata") or {}
            app_id = (meta.get("labels") or {}).get(contract.LABEL_APP_ID)
            if app_id:
                found.setdefault(AppKey(meta.get("namespace", ""), app_id), set()).add(meta.get("name", ""))
        with self._lock:
            touched = set(self._templates) | set(found)
            self._templates = found
            for key in touched:
                self._invalidate(key)
            self.synced["templates"] = True
        self._on_change(touched)

    # --- reading -------------------------------------------------------------------------------------

    def _invalidate(self, key: AppKey) -> None:
        self._stale.add(key)

    def _invalidate_all(self) -> None:
        self._stale = (
            self._pods.keys()
            | self._config_maps.keys()
            | self._drivers.keys()
            | self._requests.keys()
            | self._templates.keys()
            | set(self._views)
        )

    def snapshot(self, *, track: bool = False) -> Snapshot:
        """Views (and the in-flight sums) are rebuilt only for the apps that changed since the last snapshot:
        a snapshot costs per changed app, whatever the cluster's size (bench/scale.py). `track` (the loop's
        snapshot, one caller only): the snapshot says which apps changed since the last tracked one, so that
        what the loop keeps across steps (the expectations' overlay) is brought up to date per app that
        changed."""
        with self._lock:
            if self._stale:
                self._changed |= self._stale
                views = self._views.mutate()
                for key in self._stale:
                    if key in self._pods:
                        pods = tuple(self._pods[key].values())
                    elif (
                        self._config_maps.get(key)
                        or key in self._drivers
                        or key in self._requests
                        or key in self._templates
                    ):
                        # Apps whose pods are all gone but whose copies or requests remain still need cleaning up.
                        pods = ()
                    else:
                        self._driver_seen.discard(key)  # nothing of the app is left: nothing of it is kept
                        views.pop(key, None)
                        self._count(key, 0)
                        continue
                    view = views[key] = AppView(
                        key,
                        pods,
                        self._drivers.get(key),
                        key in self._driver_seen,
                        frozenset(self._config_maps.get(key, ())),
                        tuple(sorted(self._requests.get(key, {}).values(), key=lambda r: r.sequence)),
                        frozenset(self._templates.get(key, ())),
                    )
                    self._count(key, view.counts.in_flight)
                self._views = views.finish()
                self._stale = set()
            if not track:
                return Snapshot(self._views, frozenset(self._sources), dict(self._in_flight))
            self._tracked += 1
            changed, self._changed = frozenset(self._changed), set()
            return Snapshot(
                self._views, frozenset(self._sources), dict(self._in_flight), self._tracked, changed
            )

    def _count(self, key: AppKey, in_flight: int) -> None:
        change = in_flight - self._counted.get(key, 0)
        if change:
            self._in_flight[key.namespace] += change
            if not self._in_flight[key.namespace]:
                del self._in_flight[key.namespace]
        if in_flight:
            self._counted[key] = in_flight
        else:
            self._counted.pop(key, None)

    def pod(self, namespace: str, name: str, app_id: str) -> PodRecord | None:
        with self._lock:
            return self._pods.get(AppKey(namespace, app_id), {}).get(name)

    @property
    def is_synced(self) -> bool:
        return all(self.synced.get(k) for k in self.required)


@dataclass
class _Out:
    """What one cache change must report once the lock is released."""

    gone: list[tuple[PodRecord, bool]] = field(default_factory=list)
    changes: list[tuple[PodRecord | None, PodRecord | None]] = field(default_factory=list)
