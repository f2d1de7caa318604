"""The life of each application: the one rule that says when an app is over.

- Cluster mode (a driver pod was seen): over when its driver finished, or was seen and is gone
  (`AppView.finished`).
- Client mode (no driver pod ever seen: a notebook, `spark-shell`, a driver outside the cluster): Spark gives no
  end signal when its JVM dies (its executor pods stay, gated ones forever), so the app is over when it showed
  no sign of life for `client_grace` seconds. A sign of life is a pod of the app that is released and live
  (Running, or Pending and not refused by the scheduler for its `unschedulableSeconds`: a killed notebook's
  executors that can never be placed stay Pending for good), a pod newer than any seen before, or sparkgate
  holding the app (the last decision's `AppSettings.holds`: its gated pods wait for the budgets it shares
  with other apps or for its pacing; Kueue never evicts a workload for inactivity while it waits for quota
  either). The grace starts when the registry first sees the app (so after a restart every client-mode app
  gets a whole grace again).

An app that is over is `ended` until the cache no longer holds anything of it (its terminated pods may stay in
the cluster until the pod garbage collector takes them). An app of which the cluster holds nothing any more
(a client-mode app that stopped cleanly: Spark deleted its executors and the copies) is over once the grace
has passed since its last sign of life. The loop calls `observe` for the apps of each step and for every app at each tick
(Controller.step) and, for each app it returns, `Controller.end` once: that removes everything sparkgate
keeps of the app. An ended client-mode app in which a newer pod appears lives again, and keeps its place in
line: `end` hands the registry the app's `waiting_since` (`keep_place`), kept for `client_grace` seconds at
most and for `PLACES` apps at most, the oldest dropped first; the loop takes it back (`place`) when it makes
the app's memory again.

Every duration here is on the monotonic clock (`Now.monotonic`); `ended` says when each app ended in wall time
(`Now.wall`): the deletion histories record it, shown to users and kept across leaders.

Owned by the loop thread: not thread-safe; other threads read `ended` only through the copy the loop
publishes (`Controller.ended`, replaced, never mutated), never this object.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sparkgate.contract import AppKey

from .decision import AppSettings
from .model import AppView, Now, Snapshot

PLACES = 10_000  # ended client-mode apps whose place in line is kept, at most


@dataclass(slots=True)
class _Life:
    view: AppView  # the view last examined (the cache hands out the same object until the app changes)
    last_alive: float  # monotonic time of the last sign of life
    newest_pod: float  # the newest creationTimestamp of its pods seen so far
    seen: float | None  # monotonic time the app first appeared; None: there at the registry's first look


def _newest(view: AppView) -> float:
    return max((p.created for p in view.pods), default=0.0)


def _alive(view: AppView, settings: AppSettings | None) -> bool:
    """A sign of life in the view itself or in sparkgate's hold on the app (module docstring)."""
    counts = view.counts
    if settings is None:
        return counts.alive
    return counts.running > 0 or counts.in_flight > settings.overdue or settings.holds


class AppRegistry:
    def __init__(self, client_grace: float) -> None:
        self.client_grace = client_grace
        self._lives: dict[AppKey, _Life] = {}
        self._looked = False  # the registry has looked at every app once
        self.ended: dict[
            AppKey, float
        ] = {}  # app -> when it ended (wall); kept while the cache holds the app
        self.version = 0  # changes with `ended` (so the loop republishes it only then)
        # Ended client-mode apps that lived again since the loop last took this set (`take_revived`): their
        # deletion histories must not expire while they run.
        self._revived: set[AppKey] = set()
        # app -> (its place in line, monotonic; until when it is kept), in the order kept (so by expiry).
        self._places: dict[AppKey, tuple[float, float]] = {}

    def observe(
        self,
        snapshot: Snapshot,
        now: Now,
        apps: Iterable[AppKey] | None = None,
        settings: Mapping[AppKey, AppSettings] | None = None,
    ) -> set[AppKey]:
        """The apps whose life ended at this observation, of `apps` (those that changed: a step's) or, when
        None, of every app the registry or the snapshot knows (the loop's tick: the client-mode grace is
        measured there, so its end is seen within a tick). `settings`: the last decision's, per app."""
        ended: set[AppKey] = set()
        settings = settings or {}
        mono = now.monotonic
        keys = set(snapshot.apps).union(self._lives) if apps is None else apps
        for key in keys:
            view = snapshot.apps.get(key)
            if view is None:
                if key in self._lives:
                    self._gone(key, mono, ended)
                continue
            life = self._lives.get(key)
            if life is None:
                life = self._lives[key] = _Life(view, mono, _newest(view), mono if self._looked else None)
            elif life.view is not view:
                newest = _newest(view)
                if newest > life.newest_pod and key in self.ended and not view.finished:
                    del self.ended[key]  # a client-mode app that went on after all
                    self.version += 1
                    self._revived.add(key)
                    life.last_alive = mono
                life.view = view
                if newest > life.newest_pod:
                    life.newest_pod, life.last_alive = newest, mono
            if _alive(view, settings.get(key)):
                life.last_alive = mono
            if key in self.ended:
                continue
            if view.finished or (not view.driver_seen and mono - life.last_alive >= self.client_grace):
                self.ended[key] = now.wall
                self.version += 1
                ended.add(key)
        if apps is None:
            self._looked = True
            self._expire_places(mono)
        return ended

    def tracks(self, key: AppKey) -> bool:
        """Whether the registry follows the app's life (it will say when it is over)."""
        return key in self._lives

    def seen(self, key: AppKey) -> float | None:
        """When the app first appeared (monotonic), None when it was there at the registry's first look."""
        life = self._lives.get(key)
        return None if life is None else life.seen

    def take_revived(self) -> set[AppKey]:
        """The ended apps that lived again since the last call."""
        revived, self._revived = self._revived, set()
        return revived

    def keep_place(self, key: AppKey, waiting_since: float | None, now: float) -> None:
        """An ended client-mode app's place in line (`waiting_since`, monotonic), kept in case it lives again
        (a driver that was alive after all, whose gated pods sparkgate deleted: Spark creates them again)."""
        self._places.pop(key, None)
        if waiting_since is None:
            return
        self._places[key] = (waiting_since, now + self.client_grace)
        if len(self._places) > PLACES:
            del self._places[next(iter(self._places))]

    def place(self, key: AppKey) -> float | None:
        """The kept place in line of an app that lives again (taken: asked once, when its memory is made)."""
        kept = self._places.pop(key, None)
        return None if kept is None else kept[0]

    def _expire_places(self, now: float) -> None:
        places = self._places
        while places:
            first = next(iter(places))
            if places[first][1] > now:
                return
            del places[first]

    def _gone(self, key: AppKey, now: float, ended: set[AppKey]) -> None:
        """The cluster holds nothing of the app any more: over if it was, or once the grace has passed (a
        client-mode app that stopped cleanly: Spark deleted its executors and copies; or scaled to no pod a
        while)."""
        if key in self.ended:
            del self._lives[key], self.ended[key]
            self.version += 1
        elif now - self._lives[key].last_alive >= self.client_grace:
            del self._lives[key]
            ended.add(key)
