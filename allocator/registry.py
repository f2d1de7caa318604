"""The life of each application: the one rule that says when an app is over.

- Cluster mode (a driver pod was seen): over when its driver finished, or was seen and is gone
  (`AppView.finished`).
- Client mode (no driver pod ever seen: a notebook, `spark-shell`, a driver outside the cluster): Spark gives no
  end signal when its JVM dies (its executor pods stay, gated ones forever), so the app is over when it showed
  no sign of life for `client_grace` seconds. A sign of life is a pod of the app that is released and live
  (Pending or Running, not being deleted) or a pod newer than any seen before. The grace starts when the
  registry first sees the app (so after a restart every client-mode app gets a whole grace again).

An app that is over is `ended` until the cache no longer holds anything of it (its terminated pods may stay in
the cluster until the pod garbage collector takes them). An app of which the cluster holds nothing any more
(a client-mode app that stopped cleanly: Spark deleted its executors and the copies) is over once the grace
has passed since its last sign of life. The loop calls `observe` for the apps of each step and for every app at each tick
(Controller.step) and, for each app it returns, `Controller.end` once: that removes everything sparkgate
keeps of the app. An ended client-mode app in which a newer pod appears lives again.

Owned by the loop thread: not thread-safe; other threads read `ended` only through the copy the loop
publishes (`Controller.ended`, replaced, never mutated), never this object.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sparkgate.contract import AppKey

from .model import AppView, Snapshot


@dataclass(slots=True)
class _Life:
    view: AppView  # the view last examined (the cache hands out the same object until the app changes)
    last_alive: float  # clock time of the last sign of life
    newest_pod: float  # the newest creationTimestamp of its pods seen so far
    alive: bool  # the view has a released live pod


def _newest(view: AppView) -> float:
    return max((p.created for p in view.pods), default=0.0)


class AppRegistry:
    def __init__(self, client_grace: float) -> None:
        self.client_grace = client_grace
        self._lives: dict[AppKey, _Life] = {}
        self.ended: dict[AppKey, float] = {}  # app -> when it ended; kept while the cache holds the app
        self.version = 0  # changes with `ended` (so the loop republishes it only then)
        # Ended client-mode apps that lived again since the loop last took this set (`take_revived`): their
        # deletion histories must not expire while they run.
        self._revived: set[AppKey] = set()

    def observe(self, snapshot: Snapshot, now: float, apps: Iterable[AppKey] | None = None) -> set[AppKey]:
        """The apps whose life ended at this observation, of `apps` (those that changed: a step's) or, when
        None, of every app the registry or the snapshot knows (the loop's tick: the client-mode grace is
        measured there, so its end is seen within a tick)."""
        ended: set[AppKey] = set()
        keys = set(snapshot.apps).union(self._lives) if apps is None else apps
        for key in keys:
            view = snapshot.apps.get(key)
            if view is None:
                if key in self._lives:
                    self._gone(key, now, ended)
                continue
            life = self._lives.get(key)
            if life is None:
                life = self._lives[key] = _Life(view, now, _newest(view), view.counts.alive)
            elif life.view is not view:
                newest = _newest(view)
                if newest > life.newest_pod and key in self.ended and not view.finished:
                    del self.ended[key]  # a client-mode app that went on after all
                    self.version += 1
                    self._revived.add(key)
                    life.last_alive = now
                life.view, life.alive = view, view.counts.alive
                if newest > life.newest_pod:
                    life.newest_pod, life.last_alive = newest, now
            if life.alive:
                life.last_alive = now
            if key in self.ended:
                continue
            if view.finished or (not view.driver_seen and now - life.last_alive >= self.client_grace):
                self.ended[key] = now
                self.version += 1
                ended.add(key)
        return ended

    def tracks(self, key: AppKey) -> bool:
        """Whether the registry follows the app's life (it will say when it is over)."""
        return key in self._lives

    def take_revived(self) -> set[AppKey]:
        """The ended apps that lived again since the last call."""
        revived, self._revived = self._revived, set()
        return revived

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
