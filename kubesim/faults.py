"""What tests inject into kubesim's API server (errors, latency, dropped watches, a hang, answers lost after
the write was applied) and what they read back (the log of every request: who made it and, for a write,
where it stands in the store's commit order, and whether its answer was lost).

Thread-safe: one leaf lock each for the rules and the log; the API server's request threads consult and
append, the test's thread injects and reads.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


def _matches(pattern: str, value: str) -> bool:
    return pattern in ("*", value)


@dataclass
class _Rule:
    verb: str
    resource: str
    namespace: str | None
    code: int = 0
    seconds: float = 0.0
    remaining: int | None = None
    retry_after: int | None = None

    def applies(self, verb: str, resource: str, namespace: str | None) -> bool:
        return (
            _matches(self.verb, verb)
            and _matches(self.resource, resource)
            and (self.namespace is None or self.namespace == namespace)
            and (self.remaining is None or self.remaining > 0)
        )


@dataclass(frozen=True)
class Injected:
    code: int
    retry_after: int | None


@dataclass
class _Loss:
    verb: str
    resource: str
    namespace: str | None
    answer: int  # what the client gets instead: 0 (the connection dropped), 500, 502 or 504
    one_in: int  # every one_in-th matching write loses its answer
    remaining: int | None  # answers still to lose (None: no end)
    seen: int = 0

    def takes(self, verb: str, resource: str, namespace: str | None) -> bool:
        """Counts a matching write; True when it is the one whose answer is lost."""
        if not (_matches(self.verb, verb) and _matches(self.resource, resource)):
            return False
        if self.namespace is not None and self.namespace != namespace:
            return False
        if self.remaining is not None and self.remaining <= 0:
            return False
        self.seen += 1
        if self.seen % self.one_in:
            return False
        if self.remaining is not None:
            self.remaining -= 1
        return True


class Faults:
    """verb: get|list|watch|create|update|patch|delete|deletecollection; resource: plural or `pods/binding`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._errors: list[_Rule] = []
        self._delays: list[_Rule] = []
        self._watches: dict[int, tuple[str, Callable[[], None], float]] = {}  # (resource, close, opened)
        self._watch_ids = itertools.count()
        self._hangs: list[_Rule] = []
        self._resumed = threading.Event()
        self._holding = 0
        self._losses: list[_Loss] = []

    def fail(
        self,
        verb: str,
        resource: str,
        code: int,
        *,
        count: int | None = 1,
        namespace: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        with self._lock:
            self._errors.append(
                _Rule(verb, resource, namespace, code=code, remaining=count, retry_after=retry_after)
            )

    def delay(self, verb: str, resource: str, seconds: float, *, count: int | None = None) -> None:
        with self._lock:
            self._delays.append(_Rule(verb, resource, None, seconds=seconds, remaining=count))

    def lose(
        self,
        verb: str,
        resource: str,
        *,
        answer: int = 0,
        one_in: int = 1,
        count: int | None = None,
        namespace: str | None = None,
    ) -> None:
        """From now, every `one_in`-th matching write that the API server applies (committed, its watch event
        sent) loses its answer, `count` times (None: for good): the client gets `answer` instead of the
        object. 0: the connection is closed with no answer at all, as when the API server or a proxy between
        dies or resets it after the commit; 504: kube-apiserver's own answer when the handler overran the
        request timeout while the write went on (staging/src/k8s.io/apiserver/pkg/server/filters/timeout.go,
        `apierrors.NewTimeoutError(..., 0)`: no Retry-After, "Clients may retry, but the operation may still
        complete"), or a proxy's; 500 and 502: a proxy that lost the upstream's answer. A write that fails
        (a 4xx, an injected error) answers as it would."""
        if answer not in (0, 500, 502, 504):
            raise ValueError(f"a lost answer is 0 (none), 500, 502 or 504, not {answer}")
        if one_in < 1:
            raise ValueError(f"one_in: at least 1, not {one_in}")
        with self._lock:
            self._losses.append(_Loss(verb, resource, namespace, answer, one_in, count))

    def lost(self, verb: str, resource: str, namespace: str | None) -> int | None:
        """Called by the API server once a write was applied: the answer to give instead (0: none), or None."""
        with self._lock:
            for loss in self._losses:
                if loss.takes(verb, resource, namespace):
                    return loss.answer
            return None

    def hang(self, verb: str = "*", resource: str = "*") -> None:
        """From now until `resume()`, matching requests get no answer: they hang (the connection stays
        open, nothing is refused), then each is dropped unanswered, its connection closed and nothing
        applied, like an API server that stopped answering (wedged, or partitioned from its clients).
        Requests already being served, and open watch streams, are not affected. Whether a real
        kube-apiserver that hangs on etcd applies a write its client has given up on cannot be told from
        the client: kubesim never does."""
        with self._lock:
            if not self._hangs:
                self._resumed = threading.Event()
            self._hangs.append(_Rule(verb, resource, None))

    def resume(self) -> None:
        """Ends every hang: the hung requests are dropped unanswered; new requests are served again."""
        with self._lock:
            self._hangs.clear()
            self._resumed.set()

    def hold(self, verb: str, resource: str, namespace: str | None) -> bool:
        """Called by the API server for each request: when a hang matches, waits until `resume()` and
        returns True (the request must then be dropped unanswered); else returns False at once."""
        with self._lock:
            if not any(rule.applies(verb, resource, namespace) for rule in self._hangs):
                return False
            resumed = self._resumed
            self._holding += 1
        resumed.wait()
        with self._lock:
            self._holding -= 1
        return True

    def holding(self) -> int:
        """How many requests a hang holds now."""
        with self._lock:
            return self._holding

    def register_watch(self, resource: str, close: Callable[[], None]) -> Callable[[], None]:
        """The HTTP layer's open watch streams, so that `drop_watches` can end them; returns unregister."""
        with self._lock:
            key = next(self._watch_ids)
            self._watches[key] = (resource, close, time.monotonic())

        def unregister() -> None:
            with self._lock:
                self._watches.pop(key, None)

        return unregister

    def drop_watches(self, resource: str = "*", *, min_age: float = 0.0) -> int:
        """Ends the open watch streams of `resource` ("*": all) now, those open for `min_age` seconds or
        more (a client backs off after a watch cut within a second of opening: sparkgate/kube.py
        `Reflector`); returns how many."""
        oldest = time.monotonic() - min_age
        with self._lock:
            dropped = [
                (key, close)
                for key, (r, close, opened) in self._watches.items()
                if _matches(resource, r) and opened <= oldest
            ]
            for key, _ in dropped:
                del self._watches[key]
        for _, close in dropped:
            close()
        return len(dropped)

    def clear(self, *, keep_namespace: str | None = None) -> None:
        """Drops every rule, or every rule but the errors confined to `keep_namespace` (in one step, so that
        no request of that namespace slips through between a clear and their re-injection)."""
        with self._lock:
            self._errors = [
                r for r in self._errors if keep_namespace is not None and r.namespace == keep_namespace
            ]
            self._delays.clear()
            self._hangs.clear()
            self._losses.clear()
            self._resumed.set()

    def consult(self, verb: str, resource: str, namespace: str | None) -> tuple[float, Injected | None]:
        """(seconds to delay, an error to answer with) for one request; consumes counted rules."""
        with self._lock:
            seconds = 0.0
            for rule in self._delays:
                if rule.applies(verb, resource, namespace):
                    seconds += rule.seconds
                    if rule.remaining is not None:
                        rule.remaining -= 1
            for rule in self._errors:
                if rule.applies(verb, resource, namespace):
                    if rule.remaining is not None:
                        rule.remaining -= 1
                    return seconds, Injected(rule.code, rule.retry_after)
            return seconds, None


WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the API server answered it. `time`: when the answer was ready (after a write was
    committed); `code` 0: no answer was sent (a hang). `pod`: the pod the caller's service account token
    is bound to (`authentication.kubernetes.io/pod-name`), "" for other users. `resource_version`: for a
    write that went through, the resourceVersion the store committed it at (the object's, in the answer),
    so writes are ordered exactly as applied, whatever the threads' timing; 0 otherwise. `user` is who
    authenticated (audit's `user`), `impersonated` whom it acted as (audit's `impersonatedUser`), "" if no one.
    `lost_as`: for a write applied whose answer was lost (`Faults.lose`), what the client got instead (0: no
    answer); `code` is then what the API server did."""

    time: float
    user: str
    verb: str
    resource: str
    namespace: str | None
    name: str | None
    code: int
    path: str
    query: str = field(default="")
    subresource: str = field(default="")
    pod: str = field(default="")
    resource_version: int = field(default=0)
    impersonated: str = field(default="")
    lost_as: int | None = field(default=None)

    @property
    def identity(self) -> str:
        """Who wrote: the pod for a bound service account token, else the user."""
        return self.pod or self.user

    @property
    def applied_write(self) -> bool:
        """A write that went through and was not a dry run."""
        return self.verb in WRITES and 200 <= self.code < 300 and "dryRun=" not in self.query


class RequestLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[LoggedRequest] = []

    def add(self, entry: LoggedRequest) -> None:
        with self._lock:
            self._entries.append(entry)

    def entries(self) -> list[LoggedRequest]:
        with self._lock:
            return list(self._entries)

    def count(self, *, verb: str | None = None, resource: str | None = None, user: str | None = None) -> int:
        return sum(
            1
            for e in self.entries()
            if (verb is None or e.verb == verb)
            and (resource is None or e.resource == resource)
            and (user is None or e.user == user)
        )

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
