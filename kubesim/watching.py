"""One watcher of kubesim's store: the events a client of `?watch=true` sees, in resourceVersion order.

The store keeps one global ordered event log for watches that start from a resourceVersion, and registers
each open watcher: every committed event of the watched resource is offered to each watcher of that resource
under the store lock, in order, as the watch cache's `dispatchEvent` hands each event to every
`cacheWatcher` (staging/src/k8s.io/apiserver/pkg/storage/cacher/cacher.go). The watcher's filter decides
there and then; only an event it sees is queued and wakes it. So a watcher never takes the store lock to wait
or to read, and a change wakes only the watchers that deliver it (with one lock for every watcher, each
commit woke them all and they queued on the lock that every request needs). What a watcher sees follows the
API conventions (https://kubernetes.io/docs/reference/using-api/api-concepts/#watches):

- no resourceVersion, or "0": synthetic ADDED events for the current state first, then the changes;
- a resourceVersion: the changes after it, or 410 Expired at connect when it was compacted away (the HTTP
  layer answers it as the cacher does: 200 and one ERROR event, apiserver.py);
- compaction while watching, or more than the store's compaction window of events queued and not read: the
  stream ends, with no ERROR event and what was queued dropped, as the cacher ends a watcher it cannot
  keep (cache_watcher.go `add`: an unresponsive watcher is closed when its dispatch budget runs out;
  `terminateAllWatchers` when the watch cache starts again). The client resumes from the last version it
  saw, which is by then too old: the ERROR 410 comes at that watch;
- selectors: like the watch cache (`cacheWatcher.convertToWatchEvent`), an object that starts matching
  arrives as ADDED and one that stops matching as DELETED, so a watcher's view stays consistent.

Threading: `offer` runs in the writing thread under the store lock: it appends to `_queue`, sets `_latest`
and `_woken`; the watcher's own thread (the HTTP handler serving the watch) pops `_queue`, clears `_woken`
before it waits, and owns `_cursor`.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .jsondata import clone
from .selectors import field_selector, label_selector

if TYPE_CHECKING:
    from .store import Event

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


def _as_seen(event: Event, kind: str) -> Obj:
    """The object this watcher gets: an object that left its selector is gone with what it held before, at
    the event's resourceVersion (cacher/cache_watcher.go `convertToWatchEvent`: "return a delete event with
    the previous object content, but with the event's resource version")."""
    if kind != "DELETED" or event.type != "MODIFIED" or event.old is None:
        return event.obj
    gone = clone(event.old)
    gone["metadata"]["resourceVersion"] = str(event.rv)
    return gone


Delivery = tuple[int, str, Obj]  # (resourceVersion, the type this watcher sees, the object)


class Watch:
    """Iterate (event_type, obj); `next(timeout)` returns None when nothing came in time or it is closed.
    Made by `Store.watch`, which registers it and offers it every later event of its resource."""

    def __init__(
        self,
        resource: str,
        cursor: int,
        matches: Matcher,
        *,
        initial: list[Obj],
        backlog: list[Event],
        window: int,
        unregister: Callable[[Watch], None],
    ) -> None:
        self.resource = resource
        self._matches = matches
        self._cursor = cursor  # the resourceVersion of the last event returned (of the list, at first)
        self._latest = cursor  # the resourceVersion of the last event offered, seen or not
        self._window = window
        self._unregister = unregister
        self._queue: collections.deque[Delivery] = collections.deque((cursor, "ADDED", o) for o in initial)
        # A wake-up token when the queue grows while the watcher may wait, and at close: SimpleQueue's put
        # never blocks, where Event.set takes the waiter's lock (under the store lock, at every commit).
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._woken = False
        self._closed = threading.Event()
        self.ended = False  # by the store (`end`), not dropped by the client or the faults (`close`)
        for event in backlog:
            if event.resource == resource:
                self.offer(event)

    @property
    def resource_version(self) -> str:
        """The version this watcher has seen up to, what a BOOKMARK carries (read by the watcher's thread):
        just before its first unread event, else the latest offered, past the events it does not see."""
        latest = self._latest  # read before the queue: an event offered meanwhile is queued first
        if self._queue:
            return str(self._queue[0][0] - 1)
        return str(max(self._cursor, latest))

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def offer(self, event: Event) -> bool:
        """The store, under its lock: one more event of this resource. Only an event this watcher sees is
        queued and wakes it. False when the watcher leaves the store's list: `window` events are queued and
        not read, and its stream ends (`end`)."""
        kind = seen_as(event, self._matches)
        if kind is None:
            self._latest = event.rv
            return True
        if len(self._queue) < self._window:
            self._queue.append((event.rv, kind, _as_seen(event, kind)))
            self._latest = event.rv
            self._notify()
            return True
        self.end()
        return False

    def end(self) -> None:
        """The server ends the stream (the store, under its lock; it drops the watcher from its list itself):
        nothing more is returned, what is queued is dropped; the stream ends as a finished response."""
        self.ended = True
        self._closed.set()
        self._wake.put(None)

    def _notify(self) -> None:
        # After the append: a watcher that cleared `_woken` checks the queue after clearing it.
        if not self._woken:
            self._woken = True
            self._wake.put(None)

    def close(self) -> None:
        """Nothing more is returned (an event still queued is dropped, as with a broken connection)."""
        self._closed.set()
        self._wake.put(None)
        self._unregister(self)

    def next(self, timeout: float) -> tuple[str, Obj] | None:
        deadline = time.monotonic() + timeout
        while not self._closed.is_set():
            if self._queue:
                self._cursor, kind, obj = self._queue.popleft()
                return kind, obj
            self._woken = False
            if self._queue or self._closed.is_set():  # came between the check and the clear
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            with contextlib.suppress(queue.Empty):
                self._wake.get(timeout=left)  # a token may be stale: the loop checks again
        return None

    def __iter__(self) -> Iterator[tuple[str, Obj]]:
        while not self._closed.is_set():
            item = self.next(1.0)
            if item is not None:
                yield item
