"""sparkgate's cap invariant, defined once: the tests on kubesim, the scale benchmark (bench/scale.py) and the
soak (bench/months.py, tests/allocator/test_soak.py) all check it with this `CapChecker`, fed every change of
an executor pod in the order the API server commits them.

The invariant (docs/architecture.md, "The allocator's rule"). A pod is *in flight* while it is released (it
carries no sparkgate gate), Pending and not being deleted, whether bound or not, pods admitted without
sparkgate (bypassed) included. Then, after every removal of a pod's gate:
- the pods in flight of its app are at most `per_app`, of its namespace at most `per_namespace`, of the
  cluster at most `cluster`;
- with `unbound` set (fixed pacing: an app's next batch only once the last is bound), its app's pods in
  flight and not bound are at most `unbound`;
- that pod's gate was not removed before (a pod is released once).
Only a gate removal is judged: it is what sparkgate does. A pod admitted without the gate still counts, but
its arrival is not sparkgate's doing, and neither is a count left above a limit that a policy edit lowered.

Not thread-safe: the caller feeds it under its own lock (a kubesim store listener is called from the
committing threads). `change` costs a few dict operations, whatever the number of pods.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from sparkgate import contract


@dataclass(frozen=True)
class Caps:
    per_app: int
    per_namespace: int
    cluster: int
    unbound: int | None = None  # released and unbound pods per app; None: not checked (adaptive pacing)


@dataclass(frozen=True, slots=True)
class PodState:
    """What the invariant reads of one executor pod."""

    namespace: str
    app: str  # its spark-app-selector
    gated: bool  # carries sparkgate's gate
    bound: bool  # spec.nodeName set
    pending: bool  # phase Pending and not being deleted

    @property
    def in_flight(self) -> bool:
        return not self.gated and self.pending


def state_of(obj: dict[str, Any]) -> PodState | None:
    """The state of a pod object as the API server holds it; None when it is not a Spark executor."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(contract.LABEL_ROLE) != contract.ROLE_EXECUTOR:
        return None
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    return PodState(
        meta.get("namespace", ""),
        labels.get(contract.LABEL_APP_ID, ""),
        contract.gate_index(obj) is not None,
        bool(spec.get("nodeName")),
        (status.get("phase") or "Pending") == "Pending" and not meta.get("deletionTimestamp"),
    )


class CapChecker:
    """Counts in flight by app id, "ns:<namespace>" and "cluster" (and unbound by app id), kept up to date at
    each `change`; `violations` lists each broken rule, prefixed with `phase` (the caller's label for the
    moment); `max_in_flight` and `max_unbound` the peaks; `releases` the gate removals of each pod (uid)."""

    def __init__(self, caps: Caps) -> None:
        self.caps = caps  # replaceable (a test widens `unbound` across a hand-over)
        self.phase = "start"
        self.pods: dict[str, PodState] = {}  # uid -> its state
        self.in_flight: Counter[str] = Counter()
        self.unbound: Counter[str] = Counter()
        self.max_in_flight: Counter[str] = Counter()
        self.max_unbound: Counter[str] = Counter()
        self.releases: Counter[str] = Counter()
        self.violations: list[str] = []

    def change(self, uid: str, new: PodState | None) -> bool:
        """A pod changed (`new` None: it is gone). True when the change removed its gate (a release)."""
        old = self.pods.pop(uid, None)
        if new is not None:
            self.pods[uid] = new
        for state, n in ((old, -1), (new, 1)):
            if state is not None and state.in_flight:
                for key in (state.app, f"ns:{state.namespace}", "cluster"):
                    self.in_flight[key] += n
                    self.max_in_flight[key] = max(self.max_in_flight[key], self.in_flight[key])
                if not state.bound:
                    self.unbound[state.app] += n
                    self.max_unbound[state.app] = max(self.max_unbound[state.app], self.unbound[state.app])
        released = old is not None and new is not None and old.gated and not new.gated
        if released:
            assert new is not None
            self._released(uid, new)
        return released

    def _released(self, uid: str, pod: PodState) -> None:
        self.releases[uid] += 1
        if self.releases[uid] > 1:
            self.violations.append(f"{self.phase}: pod {uid} of app {pod.app} released twice")
        caps = self.caps
        for key, what, limit in (
            (pod.app, f"app {pod.app}", caps.per_app),
            (f"ns:{pod.namespace}", f"namespace {pod.namespace}", caps.per_namespace),
            ("cluster", "cluster", caps.cluster),
        ):
            if self.in_flight[key] > limit:
                self.violations.append(f"{self.phase}: {what}: {self.in_flight[key]} in flight > {limit}")
        if caps.unbound is not None and self.unbound[pod.app] > caps.unbound:
            self.violations.append(
                f"{self.phase}: app {pod.app}: {self.unbound[pod.app]} released and unbound > {caps.unbound}"
            )
