"""kubesim's storage: objects, one global resourceVersion, the event log that watches read, and the rules.

Stored objects are never changed in place: every write stores a new dict, so readers may share them
without copying (callers must treat returned objects as read-only and copy before changing). Each write
bumps the resourceVersion by one and appends one event, so an event is found by its resourceVersion; the
log keeps the last `compaction_window` events and a watch from an older version gets 410 Expired, as
etcd compaction does on a real cluster.

Admission runs on CREATE and UPDATE of the main resource from an HTTP client, outside the lock, the way
kube-apiserver calls its plugins and webhooks before it persists: `admit` (the mutating phase) before a
generated name is chosen, `validate` (the validating phase) after; ResourceQuota, the last validating
plugin, is checked under the lock with the write itself (quota.py). A dry run (`dry_run`) goes through all
of it and stores nothing. Pod rules of the real server live here: the scheduling gates may only shrink, a
gated or bound pod cannot be bound, only the mutable pod fields change, graceful deletion, finalizers, and
ownerReference garbage collection; and what controllers do at once: a namespace gets its `default`
ServiceAccount (the service-account controller), quotas their `status` (the resource-quota controller).
"""

from __future__ import annotations

import base64
import builtins
import collections
import contextlib
import dataclasses
import datetime as dt
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkgate.json_patch import PatchError, apply_patch, merge_patch

from . import apply as apply_
from . import ids, podrules, provreq, quota
from .errors import (
    STALE,
    ApiError,
    UserInfo,
    already_exists,
    bad_request,
    conflict,
    expired,
    generate_name_conflict,
    invalid,
    not_found,
)
from .jsondata import clone
from .resources import BUILT_IN, RESOURCES, SUBRESOURCES, Resource
from .selectors import field_selector, label_selector
from .strategic import strategic_merge
from .validation import check_object
from .watching import Watch, matcher

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace or "", name)
# registry/store.go: a create with generateName is tried this many times with a new name each
# (the RetryGenerateName feature, on by default since 1.32 and locked on since).
MAX_NAME_GENERATION_CREATE_ATTEMPTS = 8
# The field manager of the writes kubesim's own parts make in process (its kubelets, scheduler, set-up), which
# stand for API clients: their Update entries (apply.py `update`) carry this name.
IN_PROCESS = "kubesim"


@dataclass(frozen=True)
class AdmissionRequest:
    operation: str
    resource: str
    subresource: str
    namespace: str
    name: str
    obj: Obj | None
    old: Obj | None
    user: UserInfo
    dry_run: bool


Admit = Callable[[AdmissionRequest], "Obj | None"]
Validate = Callable[[AdmissionRequest, "Obj | None"], None]
Listener = Callable[[str, str, Obj], None]


@dataclass(frozen=True)
class Event:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    resource: str
    obj: Obj
    old: Obj | None


def rfc3339_seconds(text: str) -> float:
    """A metadata timestamp (now_rfc3339's form) as unix seconds."""
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()


def now_rfc3339(clock: Callable[[], float]) -> str:
    return dt.datetime.fromtimestamp(clock(), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Store:
    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        compaction_window: int = 100_000,
        admit: Admit | None = None,
        validate: Validate | None = None,
    ) -> None:
        self.clock = clock
        self.admit = admit
        self.validate = validate
        self._lock = threading.RLock()
        self._objects: dict[str, dict[Key, Obj]] = {plural: {} for plural in RESOURCES}
        self._served = set(BUILT_IN)  # grows by `install` (a CRD); read by the API server's routing
        self._rv = 1
        self._log: collections.deque[Event] = collections.deque(maxlen=compaction_window)
        self._floor = 2  # the oldest resourceVersion whose event is still in the log (or the next one)
        self._undelivered: builtins.list[Event] = []  # compacted before the listeners got them
        self._listeners: list[Listener] = []
        self._dispatched = 1
        self._dispatch_lock = threading.Lock()
        # The open watches of each resource, under the lock (the committing thread offers them each event).
        self._watchers: dict[str, builtins.list[Watch]] = collections.defaultdict(builtins.list)
        # Each owner uid's dependents, (resource, key) of the objects naming it in their ownerReferences, kept
        # by `_commit` under the lock, as kube-controller-manager's garbage collector keeps its graph of
        # owners and dependents (pkg/controller/garbagecollector/graph_builder.go `uidToNode`): a deletion
        # finds its dependents without walking every object.
        self._dependents: dict[str, set[tuple[str, Key]]] = {}

    # --- serving -----------------------------------------------------------------------------------

    @property
    def served(self) -> frozenset[str]:
        return frozenset(self._served)

    def install(self, plural: str) -> None:
        """Serve a CRD's resource from now on (as applying its CustomResourceDefinition does)."""
        if plural not in RESOURCES or not RESOURCES[plural].crd:
            raise ValueError(f"{plural} is not a CRD kubesim knows")
        self._served.add(plural)

    def _resource(self, plural: str) -> Resource:
        if plural not in self._served:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({plural})")
        return RESOURCES[plural]

    # --- reading -----------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    @property
    def dispatched(self) -> int:
        """The resourceVersion up to which the in-process listeners were handed the events."""
        return self._dispatched

    @property
    def floor(self) -> int:
        return self._floor

    def get(self, resource: str, namespace: str | None, name: str) -> Obj:
        r = self._resource(resource)
        with self._lock:
            obj = self._objects[resource].get((namespace or "" if r.namespaced else "", name))
        if obj is None:
            raise not_found(resource, name)
        return obj

    def list_objects(
        self,
        resource: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_after: Key | None = None,
    ) -> tuple[list[Obj], int, Key | None]:
        """(items sorted by namespace/name, list resourceVersion, the last key when `limit` cut the list)."""
        self._resource(resource)
        labels_ok = _label_filter(label_selector)
        fields_ok = _field_filter(field_selector)
        with self._lock:
            rv = self._rv
            keys = sorted(self._objects[resource])
            objects = self._objects[resource]
            items: list[Obj] = []
            last: Key | None = None
            for key in keys:
                if continue_after is not None and key <= continue_after:
                    continue
                if namespace and key[0] != namespace:
                    continue
                obj = objects[key]
                if not labels_ok((obj.get("metadata") or {}).get("labels") or {}) or not fields_ok(obj):
                    continue
                if limit and len(items) == limit:
                    return items, rv, last
                items.append(obj)
                last = key
        return items, rv, None

    def list(
        self,
        resource: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> tuple[list[Obj], str, str | None]:
        """(items, the list's resourceVersion, a continue token when `limit` cut the list).

        The token carries the resourceVersion of the first page; once compacted away it is 410 Expired.
        """
        after = None
        if continue_token:
            after = _decode_continue(continue_token, self._floor)
        items, rv, last = self.list_objects(
            resource,
            namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            limit=limit,
            continue_after=after[1] if after else None,
        )
        if after is not None:
            rv = after[0]
        token = _encode_continue(rv, last) if last is not None else None
        return items, str(rv), token

    def watch(
        self,
        resource: str,
        namespace: str | None = None,
        *,
        resource_version: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        name: str | None = None,
    ) -> Watch:
        """ApiError 410 Expired when `resource_version` was compacted away, 400 on a bad selector."""
        self._resource(resource)
        try:
            matches = matcher(namespace, label_selector, field_selector, name)
        except ValueError as e:
            raise bad_request(str(e)) from None
        initial: builtins.list[Obj] = []
        backlog: builtins.list[Event] = []
        with self._lock:
            if resource_version in (None, "", "0"):
                items, cursor, _ = self.list_objects(resource, namespace)
                initial = [o for o in items if matches(o)]
            else:
                try:
                    cursor = int(str(resource_version))
                except ValueError:
                    raise bad_request(f'invalid resource version "{resource_version}"') from None
                backlog = self._events_after(cursor)  # 410 at connect when too old
            stream = Watch(
                resource,
                cursor,
                matches,
                initial=initial,
                backlog=backlog,
                window=self._log.maxlen or 0,
                unregister=self._unregister,
            )
            self._watchers[resource].append(stream)
        return stream

    def _unregister(self, stream: Watch) -> None:
        with self._lock:
            watchers = self._watchers[stream.resource]
            if stream in watchers:
                watchers.remove(stream)

    def close_watches(self) -> None:
        """End every open watch (the API server stops)."""
        with self._lock:
            streams = [w for watchers in self._watchers.values() for w in watchers]
        for stream in streams:
            stream.close()

    def events_after(self, rv: int) -> builtins.list[Event]:
        """Events with resourceVersion > rv; ApiError 410 when some of them were compacted away."""
        with self._lock:
            return self._events_after(rv)

    def _events_after(self, rv: int) -> builtins.list[Event]:
        if rv < self._floor - 1:
            raise expired(f"too old resource version: {rv} ({self._floor - 1})")
        if not self._log or rv >= self._rv:
            return []
        start = max(rv + 1 - self._log[0].rv, 0)
        return [self._log[i] for i in range(start, len(self._log))]

    def compact(self) -> None:
        """Forced compaction: every version up to now becomes too old (410) for watches and list tokens.
        In-process listeners still get every event (compaction is etcd's history, not a lost change)."""
        with self._lock:
            self._undelivered += [e for e in self._log if e.rv > self._dispatched]
            self._rv += 1  # the compaction's own revision: a list now returns a version still served
            self._floor = self._rv + 1
            self._log.clear()
            for watchers in self._watchers.values():
                for stream in watchers:
                    stream.end()  # their versions are gone: each ends, and its next watch gets 410
                watchers.clear()
        self._dispatch()

    # --- in-process listeners -------------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """fn(event_type, resource, obj) after each committed change, in order, outside the store lock."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def _dispatch(self) -> None:
        # One thread at a time delivers, in resourceVersion order; whoever committed last drains the rest.
        while True:
            with self._lock:
                if self._dispatched >= self._rv:
                    return
                if not self._dispatch_lock.acquire(blocking=False):
                    return
            try:
                with self._lock:
                    start = max(self._dispatched, self._floor - 1)
                    pending = self._undelivered + (self._events_after(start) if start < self._rv else [])
                    self._undelivered = []
                    self._dispatched = self._rv
                    listeners = list(self._listeners)
                for event in pending:
                    for listener in listeners:
                        listener(event.type, event.resource, event.obj)
            finally:
                self._dispatch_lock.release()

    # --- writing --------------------------------------------------------------------------------------

    def _commit(self, resource: str, key: Key, obj: Obj | None, event_type: str, old: Obj | None) -> Obj:
        """Store (or remove, when obj is None) under the lock; returns what the event carries."""
        self._rv += 1
        if obj is None:
            assert old is not None
            gone = clone(old)
            gone["metadata"]["resourceVersion"] = str(self._rv)
            del self._objects[resource][key]
            stored = gone
        else:
            if resource == "resourcequotas":
                hard = dict((obj.get("spec") or {}).get("hard") or {})
                obj["status"] = {"hard": hard, "used": quota.used(obj, self._pods(key[0]))}
            obj["metadata"]["resourceVersion"] = str(self._rv)
            self._objects[resource][key] = obj
            stored = obj
        self._index_owners(resource, key, old, obj)
        event = Event(self._rv, event_type, resource, stored, old)
        self._log.append(event)
        self._floor = self._log[0].rv
        watchers = self._watchers.get(resource)
        if watchers:
            self._watchers[resource] = [w for w in watchers if w.offer(event)]
        if resource == "pods":
            self._refresh_quotas(key[0])
        return stored

    def _index_owners(self, resource: str, key: Key, old: Obj | None, new: Obj | None) -> None:
        before, after = _owner_uids(old), _owner_uids(new)
        if before == after:
            return
        entry = (resource, key)
        for uid in before - after:
            dependents = self._dependents.get(uid)
            if dependents is not None:
                dependents.discard(entry)
                if not dependents:
                    del self._dependents[uid]
        for uid in after - before:
            self._dependents.setdefault(uid, set()).add(entry)

    def _pods(self, namespace: str) -> builtins.list[Obj]:
        return [obj for (ns, _), obj in self._objects["pods"].items() if ns == namespace]

    def _quotas(self, namespace: str) -> builtins.list[Obj]:
        return [obj for (ns, _), obj in self._objects["resourcequotas"].items() if ns == namespace]

    def _refresh_quotas(self, namespace: str) -> None:
        """The resource-quota controller: status.used follows every pod change (under the lock)."""
        for q in self._quotas(namespace):
            used = quota.used(q, self._pods(namespace))
            if used != (q.get("status") or {}).get("used"):
                updated = {**clone(q), "status": {**(q.get("status") or {}), "used": used}}
                self._commit("resourcequotas", (namespace, q["metadata"]["name"]), updated, "MODIFIED", q)

    def _admit(
        self,
        operation: str,
        resource: str,
        obj: Obj | None,
        old: Obj | None,
        user: UserInfo | None,
        dry_run: bool,
    ) -> tuple[AdmissionRequest | None, Obj | None]:
        """The mutating phase: (the request, for the validating phase; the admitted object)."""
        if user is None:
            return None, obj
        meta = (obj or old or {}).get("metadata") or {}
        request = AdmissionRequest(
            operation, resource, "", meta.get("namespace", ""), meta.get("name", ""), obj, old, user, dry_run
        )
        admitted = self.admit(request) if self.admit is not None else None
        return request, obj if admitted is None else admitted

    def _validate(self, request: AdmissionRequest | None, obj: Obj) -> None:
        if request is not None and self.validate is not None:
            name = obj["metadata"].get("name", "")
            self.validate(dataclasses.replace(request, name=name, obj=obj), obj)

    def create(
        self,
        resource: str,
        obj: Obj,
        *,
        namespace: str | None = None,
        user: UserInfo | None = None,
        dry_run: bool = False,
        manager: str | None = IN_PROCESS,
    ) -> Obj:
        """`manager`: the Update entry's (apply.py `update`); None: none (an apply's create records its own)."""
        r = self._resource(resource)
        if not isinstance(obj, dict):
            raise bad_request("the body is not an object")
        obj = clone(obj)
        meta = obj.setdefault("metadata", {})
        if r.namespaced:
            body_ns = meta.get("namespace")
            if namespace and body_ns and body_ns != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace or body_ns or "default"
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and not meta.get("generateName"):
            raise invalid(r.kind, "", [("metadata.name", "Required value: name or generateName is required")])
        obj["apiVersion"], obj["kind"] = r.api_version, r.kind
        if resource == "pods":
            podrules.default_pod(obj)
        elif resource == "priorityclasses":
            obj.setdefault("preemptionPolicy", "PreemptLowerPriority")  # scheduling/v1 defaulting
        with self._lock:  # NamespaceLifecycle, the first plugin: before any other admission
            self._check_namespace(r, meta.get("namespace", ""), meta.get("name", ""))
        if manager is not None:  # handlers/create.go: the field manager before mutating admission
            obj = apply_.update(
                None, obj, manager, kind=r.kind, api_version=r.api_version, now=now_rfc3339(self.clock)
            )
        request, admitted = self._admit("CREATE", resource, obj, None, user, dry_run)
        given, ns = meta.get("name"), meta.get("namespace", "")
        obj = admitted if admitted is not None else obj
        obj.setdefault("metadata", {})
        # registry/store.go `Create`: with generateName and no name, up to 8 attempts
        # (maxNameGenerationCreateAttempts), each choosing a new name (BeforeCreate, between the mutating and
        # the validating phase) and validated again; only a name already taken is retried, and the last one
        # taken answers rest.CheckGeneratedNameError's conflict. Mutating admission is not run again.
        attempts = 1 if given else MAX_NAME_GENERATION_CREATE_ATTEMPTS
        for attempt in range(1, attempts + 1):
            name = given or meta["generateName"] + ids.suffix(5, ids.NAME_CHARS)
            obj["metadata"]["name"] = name
            if r.namespaced:
                obj["metadata"]["namespace"] = ns
            if resource == "pods":
                podrules.prepare_for_create(obj, now_rfc3339(self.clock))
            elif (resource, "status") in SUBRESOURCES:  # a CRD with a status subresource: PrepareForCreate
                obj.pop("status", None)
            if resource == "provisioningrequests":
                provreq.validate(obj, None)
            check_object(resource, r.kind, obj)
            self._validate(request, obj)
            with self._lock:
                self._check_namespace(r, ns, name)
                if (ns, name) in self._objects[resource]:
                    if given:
                        raise already_exists(resource, name)
                    if attempt == attempts:
                        raise generate_name_conflict(resource, name)
                    continue
                stored = self._store_new(resource, r, ns, name, obj, request, dry_run)
            break
        if not dry_run:
            self._dispatch()
            if resource == "namespaces":
                self.create("serviceaccounts", {"metadata": {"name": "default"}}, namespace=name)
        return stored

    def _store_new(
        self,
        resource: str,
        r: Resource,
        ns: str,
        name: str,
        obj: Obj,
        request: AdmissionRequest | None,
        dry_run: bool,
    ) -> Obj:
        """A created object stored (the lock held, its name free): its system fields, the quota check."""
        obj["metadata"].update(uid=ids.uid(), creationTimestamp=now_rfc3339(self.clock), generation=1)
        obj["metadata"].pop("resourceVersion", None)
        if resource == "namespaces":
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
            obj.setdefault("status", {"phase": "Active"})
        if resource == "pods" and request is not None:
            for q in self._quotas(ns):
                quota.check(q, obj)
        if dry_run:
            obj["metadata"]["resourceVersion"] = str(self._rv)
            return obj
        return self._commit(resource, (ns, name), obj, "ADDED", None)

    def _check_namespace(self, r: Resource, ns: str, name: str) -> None:
        """NamespaceLifecycle: no content in a namespace that does not exist or is being terminated."""
        if not r.namespaced:
            return
        namespace = self._objects["namespaces"].get(("", ns))
        if namespace is None:
            raise not_found("namespaces", ns)
        if namespace["metadata"].get("deletionTimestamp"):
            # k8s.io/apiserver plugin/namespace/lifecycle/admission.go `Admit`: admission.NewForbidden, and the
            # cause NamespaceTerminating (v1.NamespaceTerminatingCause) appended to its details.
            raise ApiError(
                403,
                "Forbidden",
                f'{r.plural} "{name}" is forbidden: unable to create new content in namespace {ns} '
                "because it is being terminated",
                {
                    "name": name,
                    "kind": r.plural,
                    "causes": [
                        {
                            "reason": "NamespaceTerminating",
                            "message": f"namespace {ns} is being terminated",
                            "field": "metadata.namespace",
                        }
                    ],
                },
            )

    def replace(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        obj: Obj,
        *,
        subresource: str = "",
        user: UserInfo | None = None,
        dry_run: bool = False,
        manager: str = IN_PROCESS,
    ) -> Obj:
        """PUT: a stale metadata.resourceVersion is a 409 Conflict."""
        if not isinstance(obj, dict):
            raise bad_request("the body is not an object")
        wanted_rv = (obj.get("metadata") or {}).get("resourceVersion")
        return self._update(
            resource,
            namespace,
            name,
            lambda current: clone(obj),
            subresource,
            user,
            wanted_rv,
            dry_run,
            manager,
        )

    def patch(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        body: Any,
        content_type: str,
        *,
        subresource: str = "",
        user: UserInfo | None = None,
        dry_run: bool = False,
        manager: str = IN_PROCESS,
    ) -> Obj:
        kind = content_type.split(";")[0].strip()

        def patched(current: Obj) -> Obj:
            try:
                if kind == "application/json-patch+json":
                    result: Obj = apply_patch(current, body)
                    return result
                if kind == "application/merge-patch+json":
                    merged: Obj = clone(merge_patch(current, body))
                    return merged
                if kind == "application/strategic-merge-patch+json":
                    strategic: Obj = strategic_merge(current, body)
                    return strategic
            except PatchError as e:
                # kube-apiserver's own message carries no detail (NewGenericServerResponse(422, ...));
                # kubesim adds the reason as a cause, for whoever debugs a test.
                raise ApiError(
                    422,
                    "Invalid",
                    "the server rejected our request due to an error in our request",
                    {"causes": [{"field": "patch", "message": str(e)}]},
                ) from None
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {kind})",
            )

        return self._update(resource, namespace, name, patched, subresource, user, None, dry_run, manager)

    def apply(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        config: Any,
        manager: str,
        *,
        force: bool = False,
        user: UserInfo | None = None,
        dry_run: bool = False,
    ) -> tuple[Obj, bool]:
        """Server-side apply (patch.go `applyPatcher`, apply.py): (the object, whether the apply created it).
        An apply to a missing object creates it (CREATE admission); one that changes nothing writes nothing."""
        r = self._resource(resource)
        config = apply_.check_request(config, api_version=r.api_version, name=name, manager=manager)
        key = (namespace or "" if r.namespaced else "", name)

        def applied(current: Obj | None) -> Obj:
            now = now_rfc3339(self.clock)
            return apply_.apply(current, config, manager, force=force, kind=r.kind, now=now)

        while True:
            with self._lock:
                exists = key in self._objects[resource]
            if exists:
                return self._update(resource, namespace, name, applied, "", user, None, dry_run, None), False
            try:
                return self.create(
                    resource, applied(None), namespace=namespace, user=user, dry_run=dry_run, manager=None
                ), True
            except ApiError as e:
                if e.reason != "AlreadyExists":
                    raise

    def _update(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        change: Callable[[Obj], Obj],
        subresource: str,
        user: UserInfo | None,
        wanted_rv: str | None,
        dry_run: bool = False,
        manager: str | None = IN_PROCESS,
    ) -> Obj:
        r = self._resource(resource)
        key = (namespace or "" if r.namespaced else "", name)
        for _ in range(20):  # GuaranteedUpdate: retry a PATCH on a concurrent change
            with self._lock:
                current = self._objects[resource].get(key)
                if current is None:
                    raise not_found(resource, name)
                seen_rv = current["metadata"]["resourceVersion"]
            if wanted_rv and wanted_rv != seen_rv:
                raise conflict(resource, name, STALE)
            new = change(current)
            if not isinstance(new, dict):
                raise bad_request("the result is not an object")
            # registry/store.go Update: a resourceVersion in the updated object (a PATCH that sets one too)
            # must be the stored one; a PATCH that sets none is retried on a concurrent change instead.
            carried = (new.get("metadata") or {}).get("resourceVersion")
            if carried and carried != seen_rv:
                raise conflict(resource, name, STALE)
            new = _keep_identity(current, new, r)
            if resource == "pods":
                new = podrules.check_update(current, new, subresource)
            elif subresource == "status":
                # A CRD's status strategy (apiextensions-apiserver customresource/status_strategy.go
                # `PrepareForUpdate`): the old object with the new status, metadata changes dropped.
                new = {**clone(current), "status": new.get("status")}
            elif (resource, "status") in SUBRESOURCES:
                # ... and its main strategy keeps the old status (customresource/strategy.go).
                new = {**new, "status": clone(current.get("status"))}
                if new["status"] is None:
                    del new["status"]
            if resource == "provisioningrequests":
                provreq.validate(new, current)
            if manager is not None:  # handlers/update.go, patch.go: the field manager before admission
                now = now_rfc3339(self.clock)
                new = apply_.update(
                    current,
                    new,
                    manager,
                    kind=r.kind,
                    api_version=r.api_version,
                    now=now,
                    subresource=subresource,
                )
            request = None
            if not subresource:
                request, admitted = self._admit("UPDATE", resource, new, current, user, dry_run)
                if admitted is not None:  # made from `new`, the store's own copy
                    new = _keep_identity(current, admitted, r, owned=True)
            elif user is not None:
                # kube-apiserver admits a subresource's update as well, with the subresource in the request
                # (handlers/patch.go, update.go: admission.NewAttributesRecord), after the status strategy
                # (registry/store.go Update: BeforeUpdate, then the validating admission): only what matches
                # `pods/status` sees it (a ValidatingAdmissionPolicy on it). Nothing here mutates a status.
                meta = new.get("metadata") or {}
                request = AdmissionRequest(
                    "UPDATE",
                    resource,
                    subresource,
                    meta.get("namespace", ""),
                    name,
                    new,
                    current,
                    user,
                    dry_run,
                )
            check_object(resource, r.kind, new)
            self._validate(request, new)
            with self._lock:
                latest = self._objects[resource].get(key)
                if latest is None:
                    raise not_found(resource, name)
                if latest["metadata"]["resourceVersion"] != seen_rv:
                    if wanted_rv:
                        raise conflict(resource, name, STALE)
                    continue
                if _same_content(latest, new):
                    return latest
                if new.get("spec") != latest.get("spec"):
                    new["metadata"]["generation"] = int(latest["metadata"].get("generation", 1)) + 1
                if dry_run:
                    new["metadata"]["resourceVersion"] = seen_rv
                    return new
                finalized = new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers")
                stored = self._commit(
                    resource, key, None if finalized else new, "DELETED" if finalized else "MODIFIED", latest
                )
            self._dispatch()
            if finalized:
                self._collect_dependents(stored)
            return stored
        raise conflict(resource, name, STALE)

    def bind(self, namespace: str, name: str, node_name: str, *, user: UserInfo | None = None) -> Obj:
        """pods/binding: refused for a gated pod and for a pod already bound (409, the real message)."""
        key = (namespace, name)
        with self._lock:
            pod = self._objects["pods"].get(key)
            if pod is None:
                raise not_found("pods", name)
            if pod["metadata"].get("deletionTimestamp"):
                raise conflict(
                    "pods/binding", name, f"pod {name} is being deleted, cannot be assigned to a host"
                )
            if pod["spec"].get("nodeName"):
                raise conflict(
                    "pods/binding",
                    name,
                    f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"',
                )
            if pod["spec"].get("schedulingGates"):
                raise conflict("pods/binding", name, f"pod {name} has non-empty .spec.schedulingGates")
            new = clone(pod)
            new["spec"]["nodeName"] = node_name
            node = self._objects["nodes"].get(("", node_name))
            copied = podrules.topology_labels(node) if node is not None else {}
            if copied:  # PodTopologyLabels: the node's zone and region labels, at binding
                new["metadata"].setdefault("labels", {}).update(copied)
            conditions = [c for c in new["status"].get("conditions", []) if c.get("type") != "PodScheduled"]
            conditions.append(
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339(self.clock)}
            )
            new["status"]["conditions"] = conditions
            stored = self._commit("pods", key, new, "MODIFIED", pod)
        self._dispatch()
        return stored

    def delete(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        *,
        grace_period_seconds: int | None = None,
        preconditions: dict[str, Any] | None = None,
        propagation_policy: str | None = None,
        user: UserInfo | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """`dry_run` (dryRun=All): validated as the deletion would be, the object answered as it would be
        (being deleted, or gone), nothing stored."""
        r = self._resource(resource)
        if resource == "namespaces":
            return self._delete_namespace(name, preconditions)
        key = (namespace or "" if r.namespaced else "", name)
        if user is not None and self.validate is not None:
            self._validate_delete(
                resource, r.kind, key, name, grace_period_seconds, preconditions, user, dry_run
            )
        with self._lock:
            current = self._objects[resource].get(key)
            if current is None:
                raise not_found(resource, name)
            meta = current["metadata"]
            _check_preconditions(r.kind, name, meta, preconditions)
            if _pending_graceful(meta, grace_period_seconds):
                return current  # a graceful deletion is pending: nothing changes
            old_grace = meta.get("deletionGracePeriodSeconds")
            if resource != "pods":
                grace = 0
            elif meta.get("deletionTimestamp") and old_grace:
                assert grace_period_seconds is not None  # none asked: pending (above)
                grace = _period(grace_period_seconds)  # a shorter one, as asked
            else:
                grace = podrules.grace_period(current, grace_period_seconds)
            removed = False
            if resource == "pods" or meta.get("finalizers"):
                # registry/rest/delete.go BeforeDelete and registry/store.go Delete: a pod (a graceful
                # strategy) is first updated with its deletionTimestamp and deletionGracePeriodSeconds, grace 0
                # included ("The deletion operation happens in two phases"), then deleted from storage if its
                # grace is 0 and it has no finalizer; one already being deleted may only have its grace
                # shortened, its deletionTimestamp moved by the difference.
                new = clone(current)
                if meta.get("deletionTimestamp") and old_grace:
                    start = rfc3339_seconds(meta["deletionTimestamp"]) - int(old_grace)
                    new["metadata"]["deletionTimestamp"] = now_rfc3339(lambda: start + grace)
                elif not meta.get("deletionTimestamp"):
                    new["metadata"]["deletionTimestamp"] = now_rfc3339(lambda: self.clock() + grace)
                    if meta.get("generation"):
                        new["metadata"]["generation"] = int(meta["generation"]) + 1
                new["metadata"]["deletionGracePeriodSeconds"] = grace
                if new != current:
                    current = new if dry_run else self._commit(resource, key, new, "MODIFIED", current)
                stored = current
            if grace == 0 and not current["metadata"].get("finalizers"):
                if dry_run:
                    return current
                stored = self._commit(resource, key, None, "DELETED", current)
                removed = True
        self._dispatch()
        if removed and propagation_policy == "Orphan":
            self._orphan_dependents(stored)
        elif removed:
            self._collect_dependents(stored)
        if removed and r.namespaced:
            self._finish_namespace(key[0])
        return stored

    def _validate_delete(
        self,
        resource: str,
        kind: str,
        key: tuple[str, str],
        name: str,
        grace_period_seconds: int | None,
        preconditions: dict[str, Any] | None,
        user: UserInfo,
        dry_run: bool,
    ) -> None:
        """The validating admission of a DELETE (ValidatingAdmissionPolicies and webhooks that match it), as
        k8s.io/apiserver's handlers/delete.go gives it (rest.AdmissionToValidateObjectDeleteFunc): no object,
        the object being deleted as `oldObject`; checked after the preconditions (etcd3 store's Delete), and
        not for a pod whose graceful deletion is already pending (registry/store.go: BeforeDelete's
        pendingGraceful returns before any validation). kube-apiserver validates inside the storage
        transaction, on the latest object; here on the object as read just before (a change in between is
        not validated again)."""
        with self._lock:
            current = self._objects[resource].get(key)
        if current is None:
            raise not_found(resource, name)
        meta = current["metadata"]
        _check_preconditions(kind, name, meta, preconditions)
        if _pending_graceful(meta, grace_period_seconds):
            return
        request = AdmissionRequest("DELETE", resource, "", key[0], name, None, current, user, dry_run)
        assert self.validate is not None
        self.validate(request, None)

    def _delete_namespace(self, name: str, preconditions: dict[str, Any] | None) -> Obj:
        """Namespace deletion as kube-apiserver and the namespace controller do it: the namespace turns
        Terminating (no new content: 403), everything in it is deleted (pods gracefully), and it goes when
        the last object has gone. Returns the Terminating namespace."""
        if name in ("default", "kube-system", "kube-public"):
            raise ApiError(
                403,
                "Forbidden",
                f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                {"name": name, "kind": "namespaces"},
            )
        with self._lock:
            namespace = self._objects["namespaces"].get(("", name))
            if namespace is None:
                raise not_found("namespaces", name)
            _check_preconditions("Namespace", name, namespace["metadata"], preconditions)
            if namespace["metadata"].get("deletionTimestamp"):
                return namespace
            new = clone(namespace)
            new["metadata"]["deletionTimestamp"] = now_rfc3339(self.clock)
            new["spec"] = {"finalizers": ["kubernetes"]}
            new["status"] = {"phase": "Terminating"}
            stored = self._commit("namespaces", ("", name), new, "MODIFIED", namespace)
            contents = [
                (plural, key[1])
                for plural, r in RESOURCES.items()
                if r.namespaced
                for key in self._objects[plural]
                if key[0] == name
            ]
        self._dispatch()
        for plural, obj_name in contents:
            with contextlib.suppress(ApiError):
                self.delete(plural, name, obj_name)
        self._finish_namespace(name)
        return stored

    def _finish_namespace(self, name: str) -> None:
        with self._lock:
            namespace = self._objects["namespaces"].get(("", name))
            if namespace is None or not namespace["metadata"].get("deletionTimestamp"):
                return
            for plural, r in RESOURCES.items():
                if r.namespaced and any(key[0] == name for key in self._objects[plural]):
                    return
            self._commit("namespaces", ("", name), None, "DELETED", namespace)
        self._dispatch()

    def _dependents_of(self, uid: str | None) -> builtins.list[tuple[str, Key]]:
        """The objects naming `uid` as an owner, in a stable order (the lock held)."""
        return sorted(self._dependents.get(uid or "", ()))

    def _orphan_dependents(self, owner: Obj) -> None:
        """propagationPolicy Orphan: the dependents stay, without their reference to the deleted owner."""
        uid = owner["metadata"].get("uid")
        with self._lock:
            dependents = [
                (plural, key, self._objects[plural][key]) for plural, key in self._dependents_of(uid)
            ]
        for plural, (ns, name), obj in dependents:
            refs = [ref for ref in obj["metadata"]["ownerReferences"] if ref.get("uid") != uid]
            with contextlib.suppress(ApiError):
                self.patch(
                    plural,
                    ns or None,
                    name,
                    {"metadata": {"ownerReferences": refs or None}},
                    "application/merge-patch+json",
                )

    def _collect_dependents(self, owner: Obj) -> None:
        """Background garbage collection: whatever names `owner` in its ownerReferences goes too."""
        uid = owner["metadata"].get("uid")
        with self._lock:
            dependents = self._dependents_of(uid)
        for plural, (ns, name) in dependents:
            with contextlib.suppress(ApiError):  # already gone
                self.delete(plural, ns or None, name)

    def delete_collection(
        self,
        resource: str,
        namespace: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> builtins.list[Obj]:
        items, _, _ = self.list_objects(
            resource, namespace, label_selector=label_selector, field_selector=field_selector
        )
        out = []
        for obj in items:
            with contextlib.suppress(ApiError):
                out.append(self.delete(resource, obj["metadata"].get("namespace"), obj["metadata"]["name"]))
        return out


def _owner_uids(obj: Obj | None) -> frozenset[str]:
    if obj is None:
        return frozenset()
    return frozenset(ref["uid"] for ref in obj["metadata"].get("ownerReferences") or () if ref.get("uid"))


# registry/rest/delete.go `BeforeDelete`: the preconditions are checked against the object read, and the
# conflict names the kind, not the resource (schema.GroupResource{Resource: gvk.Kind}).
_PRECONDITION_FAILED = {
    "uid": "the UID in the precondition ({want}) does not match the UID in record ({have}). The object might "
    "have been deleted and then recreated",
    "resourceVersion": "the ResourceVersion in the precondition ({want}) does not match the ResourceVersion in "
    "record ({have}). The object might have been modified",
}


def _period(requested: int) -> int:
    """A requested grace period: a negative one is 1 s on the delete path (registry/rest/delete.go)."""
    return 1 if requested < 0 else requested


def _pending_graceful(meta: Obj, requested: int | None) -> bool:
    """registry/rest/delete.go BeforeDelete: an object already being deleted with a grace period keeps it
    unless a shorter one is asked for ("graceful deletion is pending, do nothing"); no period asked is none
    shorter (the pod's terminationGracePeriodSeconds is not read again)."""
    old = meta.get("deletionGracePeriodSeconds")
    if not meta.get("deletionTimestamp") or not old:
        return False
    return requested is None or _period(requested) >= int(old)


def _check_preconditions(
    kind: str, name: str, meta: dict[str, Any], preconditions: dict[str, Any] | None
) -> None:
    for field, why in _PRECONDITION_FAILED.items():
        want = (preconditions or {}).get(field)
        if want and want != meta.get(field):
            raise conflict(kind, name, why.format(want=want, have=meta.get(field)))


def _encode_continue(rv: int, last: Key) -> str:
    return base64.urlsafe_b64encode(json.dumps({"rv": rv, "after": list(last)}).encode()).decode()


def _decode_continue(token: str, floor: int) -> tuple[int, Key]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        rv, after = int(data["rv"]), (str(data["after"][0]), str(data["after"][1]))
    except (ValueError, KeyError, IndexError, TypeError):
        raise bad_request("continue key is not valid") from None
    if rv < floor - 1:
        raise expired(
            "The provided continue parameter is too old to display a consistent list result. "
            "You can start a new list without the continue parameter."
        )
    return rv, after


def _label_filter(text: str | None) -> Callable[[dict[str, str]], bool]:
    try:
        return label_selector(text)
    except ValueError as e:
        raise bad_request(f"unable to parse requirement: {e}") from None


def _field_filter(text: str | None) -> Callable[[Obj], bool]:
    try:
        return field_selector(text)
    except ValueError as e:
        raise bad_request(str(e)) from None


def _keep_identity(current: Obj, new: Obj, r: Resource, *, owned: bool = False) -> Obj:
    """Fields a client cannot change with an update: identity, timestamps, the deletion state. A copy that
    shares nothing with `new`, unless `owned` (the store's own object, which it changes in place)."""
    new = dict(new)
    meta = dict(new.get("metadata") or {})
    old_meta = current["metadata"]
    for field in (
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "generation",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ):
        if field in old_meta:
            meta[field] = old_meta[field]
        else:
            meta.pop(field, None)
    meta.pop("resourceVersion", None)
    if "managedFields" not in meta and old_meta.get("managedFields"):  # an update without them keeps them
        meta["managedFields"] = old_meta["managedFields"]
    new["metadata"] = meta
    new["apiVersion"], new["kind"] = r.api_version, r.kind
    return new if owned else clone(new)


def _same_content(a: Obj, b: Obj) -> bool:
    def strip(o: Obj) -> Obj:
        return {**o, "metadata": {k: v for k, v in o["metadata"].items() if k != "resourceVersion"}}

    return strip(a) == strip(b)
