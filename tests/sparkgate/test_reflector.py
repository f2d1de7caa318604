"""sparkgate/kube.py `Reflector` with a scripted API (a stand-in for `Kube.list`/`Kube.watch`) and
simulated time: reconnects after a watch that closes at once are bounded by a jittered exponential
backoff, and only a 410 (or the start) lists again; a normal close re-watches from the last
resourceVersion at once. (Against kubesim over HTTP the reflector runs in tests/allocator/.)"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, cast

from sparkgate.kube import Gone, Kube, Reflector

Obj = dict[str, Any]
Watch = Callable[[], Iterator[tuple[str, Obj]]]


class Time:
    """Simulated time: `wait` moves it on (no real sleep) and stops the reflector at `end`."""

    def __init__(self, stop: threading.Event, end: float) -> None:
        self.now, self.stop, self.end = 0.0, stop, end
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        if self.now >= self.end:
            self.stop.set()
        return self.stop.is_set()


class ScriptedApi:
    """`list` answers (items, resourceVersion "1"), then "7"...; `watch` plays `watches` in turn, then the
    last one forever. Every call is recorded; a runaway loop is stopped after `limit` watches."""

    def __init__(self, stop: threading.Event, watches: list[Watch], limit: int = 10_000) -> None:
        self.stop, self.watches, self.limit = stop, watches, limit
        self.lists: list[str] = []
        self.watched_from: list[str] = []
        self.list_versions = iter(["1", "7", "9"])

    def list(self, path: str, *, label_selector: str | None = None) -> tuple[list[Obj], str]:
        rv = next(self.list_versions)
        self.lists.append(rv)
        return [], rv

    def list_pages(
        self, path: str, *, label_selector: str | None = None, **_: Any
    ) -> tuple[Iterator[Obj], str]:
        items, rv = self.list(path, label_selector=label_selector)
        return iter(items), rv

    def watch(self, path: str, *, resource_version: str, **_: Any) -> Iterator[tuple[str, Obj]]:
        self.watched_from.append(resource_version)
        if len(self.watched_from) >= self.limit:
            self.stop.set()
        script = self.watches[min(len(self.watched_from), len(self.watches)) - 1]
        return script()


def closes_at_once() -> Iterator[tuple[str, Obj]]:
    return iter(())


def reflector(api: ScriptedApi, time: Time, stop: threading.Event, restarts: list[str]) -> Reflector:
    return Reflector(
        cast(Kube, api),
        "pods",
        "/api/v1/pods",
        None,
        lambda kind, obj: None,
        lambda items: None,
        stop=stop,
        on_restart=lambda name, cause: restarts.append(cause),
        backoff_base=0.2,
        backoff_cap=10.0,
        rand=lambda: 0.0,  # the shortest wait the jitter allows: the highest reconnect rate
        monotonic=time.monotonic,
        wait=time.wait,
    )


def test_a_watch_that_closes_at_once_reconnects_at_a_bounded_rate() -> None:
    """client-go's reflector calls a watch that ends within a second without an event "very short" and
    backs off; without that, a server closing every watch at once got 1.3 M reconnects a second."""
    stop = threading.Event()
    time = Time(stop, end=600.0)
    api = ScriptedApi(stop, [closes_at_once])
    restarts: list[str] = []
    reflector(api, time, stop, restarts).run()
    attempts = len(api.watched_from)
    assert time.now >= 600.0, "the reflector waited out simulated time instead of spinning"
    # Steps 0.4, 0.8, ... 6.4 s, then the 10 s cap: at least half of each step is waited.
    assert attempts <= 600 / 5 + 10, attempts
    assert attempts >= 600 / 10, "it keeps trying"
    assert set(restarts) == {"short"} and api.lists == ["1"], "a close is not a reason to list again"
    assert set(api.watched_from) == {"1"}
    assert min(time.waits) >= 0.2 and max(time.waits) == 5.0


def test_410_relists_a_normal_close_re_watches_from_the_last_version() -> None:
    stop = threading.Event()
    time = Time(stop, end=1e9)
    api: ScriptedApi

    def one_event_then_close() -> Iterator[tuple[str, Obj]]:
        yield "ADDED", {"metadata": {"name": "p", "resourceVersion": "5"}}

    def quiet_for_two_seconds() -> Iterator[tuple[str, Obj]]:
        time.now += 2.0  # no event, but not "very short": the server's timeout ended it
        return
        yield

    def expired() -> Iterator[tuple[str, Obj]]:
        raise Gone(410, "Expired", "too old resource version")
        yield

    def then_stop() -> Iterator[tuple[str, Obj]]:
        stop.set()
        return iter(())

    api = ScriptedApi(stop, [one_event_then_close, quiet_for_two_seconds, expired, then_stop])
    restarts: list[str] = []
    reflector(api, time, stop, restarts).run()
    assert api.lists == ["1", "7"], "listed at the start and after the 410 only"
    assert api.watched_from == ["1", "5", "5", "7"]
    assert restarts == ["timeout", "timeout", "expired"]
    assert len(time.waits) == 1, "only the 410 backed off (once); the normal closes re-watched at once"


def test_the_listed_objects_are_freed_once_handled_not_held_through_the_watch() -> None:
    """A list of 100,000 pods is ~6.5 GB of parsed objects (bench/scale.py): the reflector must not keep them
    while it watches (it did, until its next relist)."""

    class Listed(dict[str, Any]):  # a dict that a weak reference can follow
        pass

    stop = threading.Event()
    time = Time(stop, end=1e9)
    listed: list[weakref.ref[Listed]] = []
    alive_while_watching: list[bool] = []

    class Api(ScriptedApi):
        def list(self, path: str, *, label_selector: str | None = None) -> tuple[list[Obj], str]:
            items = [Listed(metadata={"name": f"p{i}"}) for i in range(3)]
            listed.extend(weakref.ref(item) for item in items)
            return list(items), "1"

    def watching() -> Iterator[tuple[str, Obj]]:
        gc.collect()
        alive_while_watching.append(any(ref() is not None for ref in listed))
        stop.set()
        return
        yield

    Reflector(
        cast(Kube, Api(stop, [watching])),
        "pods",
        "/api/v1/pods",
        None,
        lambda kind, obj: None,
        lambda items: None,
        stop=stop,
        monotonic=time.monotonic,
        wait=time.wait,
    ).run()
    assert len(listed) == 3 and alive_while_watching == [False]
