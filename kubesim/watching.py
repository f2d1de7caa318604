"""One watcher of kubesim's store: the events a client of `?watch=true` sees, in resourceVersion order.

The store keeps one global ordered event log; a watcher is a cursor into it plus a filter, so every
watcher sees every change in the same order and a slow watcher costs nothing to the others. What a watcher
sees follows the API conventions (https://kubernetes.io/docs/reference/using-api/api-concepts/#watches):

- no resourceVersion, or "0": synthetic ADDED events for the current state first, then the changes;
- a resourceVersion: the changes after it, or 410 Expired at connect when it was compacted away;
- compaction while watching: one ERROR event carrying a 410 Expired Status, then the watch ends;
- selectors: like the watch cache (`cacheWatcher.convertToWatchEvent`), an object that starts matching
  arrives as ADDED and one that stops matching as DELETED, so a watcher's view stays consistent.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .errors import ApiError
from .selectors import field_selector, label_selector

if TYPE_CHECKING:
    from .store import Event, Store

Obj = dict[str, Any]
Matcher = Callable[[Obj | None], bool]


def matcher(
    namespace: str | None,
    label_text: str | None = None,
    field_text: str | None = None,
    name: str | None = None,
) -> Matcher:
    """ValueError on a selector that does not parse."""
    labels_ok = label_selector(label_text)
    fields_ok = field_selector(field_text)

    def matches(obj: Obj | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        if namespace and meta.get("namespace") != namespace:
            return False
        if name and meta.get("name") != name:
            return False
        return labels_ok(meta.get("labels") or {}) and fields_ok(obj)

    return matches


def seen_as(event: Event, matches: Matcher) -> str | None:
    """The type this watcher sees: a change into or out of its selector is an ADDED or a DELETED."""
    now_in = matches(event.obj)
    if event.type != "MODIFIED":
        return event.type if now_in else None
    was_in = matches(event.old)
    if now_in and was_in:
        return "MODIFIED"
    if now_in:
        return "ADDED"
    return "DELETED" if was_in else None


class Watch:
    """Iterate (event_type, obj); `next(timeout)` returns None when nothing came in time or it is closed."""

    def __init__(
        self,
        store: Store,
        resource: str,
        namespace: str | None,
        *,
        resource_version: str | None,
        matches: Matcher,
    ) -> None:
        self._store = store
        self._resource = resource
        self._matches = matches
        self._pending: collections.deque[tuple[str, Obj]] = collections.deque()
        self._closed = threading.Event()
        with store.changed:
            if resource_version in (None, "", "0"):
                items, rv, _ = store.list_objects(resource, namespace)
                self._cursor = rv
                self._pending.extend(("ADDED", o) for o in items if matches(o))
            else:
                try:
                    self._cursor = int(str(resource_version))
                except ValueError:
                    raise ApiError(
                        400, "BadRequest", f'invalid resource version "{resource_version}"'
                    ) from None
                store.events_after(self._cursor)  # 410 at connect when too old

    @property
    def resource_version(self) -> str:
        """The version this watcher has seen up to: what a BOOKMARK carries."""
        return str(self._cursor)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        self._closed.set()
        with self._store.changed:
            self._store.changed.notify_all()

    def next(self, timeout: float) -> tuple[str, Obj] | None:
        deadline = time.monotonic() + timeout
        while not self._pending and not self._closed.is_set():
            with self._store.changed:
                try:
                    events = self._store.events_after(self._cursor)
                except ApiError as e:
                    self._pending.append(("ERROR", e.status()))
                    self._closed.set()
                    break
                if not events:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    self._store.changed.wait(left)
                    continue
            for event in events:
                self._cursor = event.rv
                if event.resource == self._resource:
                    kind = seen_as(event, self._matches)
                    if kind is not None:
                        self._pending.append((kind, event.obj))
        return self._pending.popleft() if self._pending else None

    def __iter__(self) -> Iterator[tuple[str, Obj]]:
        while not (self._closed.is_set() and not self._pending):
            item = self.next(1.0)
            if item is not None:
                yield item
