"""The scheduler extender: kube-scheduler asks sparkgate which nodes an executor pod may go to and how much
each is worth, and sparkgate answers from what it already knows (allocator/placement.py), with no API call.

Protocol: kube-scheduler's extender v1 (k8s.io/kube-scheduler/extender/v1), configured `nodeCacheCapable`,
so node names come in and go out. kube-scheduler POSTs `ExtenderArgs` ({"Pod", "NodeNames"} or, when not
node-cache-capable, {"Pod", "Nodes"}) to `<urlPrefix>/<verb>`; filter answers `ExtenderFilterResult`
({"NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}), prioritize a `HostPriorityList`
([{"Host", "Score"}], scores 0..MaxExtenderPriority = 10, which kube-scheduler multiplies by the extender's
weight and by MaxNodeScore / MaxExtenderPriority = 10 before adding them to its own).

Filter: a node where `failuresPerApp` executors of the pod's app failed within the window is refused for
that app; a node where executors of `suspectNodeApps` apps failed within the (top-level) window is refused
for every app. The reason goes into FailedNodes, and into FailedAndUnresolvableNodes too, which
kube-scheduler gives precedence: evicting lower-priority pods (preemption) cannot make such a node fit. When
every node of the cluster would be refused, none is: a failing node is better than none (the fallback is
counted); when only the nodes that fit the pod now are, the pod waits for room on a good one.

Prioritize (docs/policy.md "Scoring"): `packing: app` gives 10 x executors of the app on the node / the most
on any node (0 on nodes without any), `spread` the complement; `driverZone: prefer` gives 10 in the driver's
zone, 0 elsewhere; both together: 6 + packing x 4/10 in the driver's zone, packing x 4/10 elsewhere, so the
zone wins while it has room. Failures lower a node's score long before the filter refuses it: when some
candidate node has recent failures (of the pod's app, or of any app), each node's risk r is the larger of
the app's failures there / failuresPerApp and the apps failed there / suspectNodeApps; a node with r = 0
scores 7 + round(preference x 3/10), one with r > 0 floor(5 x (1 - r)), so the healthy nodes win by at
least 3 (150 of kube-scheduler's points at weight 5: more than a weight-1 plugin's whole range, such as
NodeResourcesFit's; TaintToleration, weight 3, and NodeAffinity, weight 2, can give more) and a
node emptied by its failures no longer draws the next executors (issue 20: on a real cluster, seven
executors of one app were bound to an OOM-killing node before its third failure was seen).
A pod that is not a Spark executor keeps every node and scores 0 everywhere.
"""

from __future__ import annotations

import collections
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.policy import Policy, Scheduling
from sparkgate.policy_file import PolicySource

from .metrics import AllocatorMetrics
from .placement import Failure, Placement

log = logging.getLogger(__name__)

MAX_EXTENDER_PRIORITY = 10
HEALTHY_SCORE = 7  # the lowest score of a node without recent failures, while some candidate has them
FAILING_SCORE = 5  # a node with failures scores floor(5 x (1 - risk)): at most 4, 3 below any healthy node
# A healthy node's score by its preference p while some candidate has failures: 7 + round(p x 3/10).
_HEALTHY = tuple(
    HEALTHY_SCORE + round(p * (MAX_EXTENDER_PRIORITY - HEALTHY_SCORE) / MAX_EXTENDER_PRIORITY)
    for p in range(MAX_EXTENDER_PRIORITY + 1)
)
VERBS = ("filter", "prioritize")
Obj = dict[str, Any]


class BadRequest(ValueError):
    """An ExtenderArgs that cannot be read; the message says what is wrong (answered with 400)."""


@dataclass(frozen=True, slots=True)
class Exclusion:
    node: str
    scope: str  # "app": refused for this app; "node": a suspect node, refused for every app
    reason: str  # the most frequent failure category: oom_killed, evicted, exit_code, rejected
    message: str


# --- the decisions (pure) -----------------------------------------------------------------------------


def duration(seconds: float) -> str:
    """600 -> "10m", 3600 -> "1h", 90 -> "90s": how the FailedNodes message says the window."""
    whole = round(seconds)
    if whole >= 3600 and whole % 3600 == 0:
        return f"{whole // 3600}h"
    if whole >= 60 and whole % 60 == 0:
        return f"{whole // 60}m"
    return f"{whole}s"


def short_app(app: AppKey) -> str:
    return f"{app.namespace}/{app.app_id[:12]}…" if len(app.app_id) > 13 else str(app)


def _kinds(failures: Sequence[Failure]) -> str:
    counts = collections.Counter(f.kind for f in failures).most_common()
    return ", ".join(kind if n == 1 else f"{kind} \u00d7{n}" for kind, n in counts)


def _category(failures: Sequence[Failure]) -> str:
    kind = collections.Counter(f.kind for f in failures).most_common(1)[0][0]
    if kind == "OOMKilled":
        return "oom_killed"
    if kind == "Evicted":
        return "evicted"
    return "exit_code" if kind.startswith("exit ") else "rejected"


def suspect_nodes(
    failures: Mapping[str, Sequence[Failure]], cluster: Scheduling, now: float
) -> tuple[dict[str, Exclusion], dict[str, int], float]:
    """The nodes refused to every app (`cluster`: the top-level settings; `failures` by node, `now` on their
    monotonic clock), how many apps failed on each node within the window, and until when that answer holds
    if no failure comes: when the oldest one leaves the window."""
    out: dict[str, Exclusion] = {}
    counts: dict[str, int] = {}
    since = now - cluster.failure_window_seconds
    oldest = now
    for node, seen in failures.items():
        recent = [f for f in seen if f.at >= since]
        if not recent:
            continue
        oldest = min(oldest, recent[0].at)
        apps = counts[node] = len({f.app for f in recent})
        if apps >= cluster.suspect_node_apps:
            out[node] = Exclusion(
                node,
                "node",
                _category(recent),
                f"sparkgate: executors of {apps} apps failed here in the last "
                f"{duration(cluster.failure_window_seconds)} (suspect node: {_kinds(recent)})",
            )
    return out, counts, oldest + cluster.failure_window_seconds


def _own_by_node(own: Sequence[Failure], settings: Scheduling, now: float) -> dict[str, list[Failure]]:
    """The app's own failures (`own`) within its window, by node."""
    since = now - settings.failure_window_seconds
    by_node: dict[str, list[Failure]] = {}
    for f in own:
        if f.at >= since:
            by_node.setdefault(f.node, []).append(f)
    return by_node


def exclusions(
    own: Sequence[Failure], app: AppKey, settings: Scheduling, suspect: Mapping[str, Exclusion], now: float
) -> dict[str, Exclusion]:
    """The nodes refused to an executor of `app`: where `settings.failures_per_app` of its own failures
    (`own`) happened within its window, then the suspect nodes."""
    out = dict(suspect)
    for node, failed in _own_by_node(own, settings, now).items():
        if len(failed) >= settings.failures_per_app:
            out[node] = Exclusion(
                node,
                "app",
                _category(failed),
                f"sparkgate: {len(failed)} executors of {short_app(app)} failed here in the last "
                f"{duration(settings.failure_window_seconds)} ({_kinds(failed)})",
            )
    return out


def failing_scores(
    own: Sequence[Failure],
    apps: Mapping[str, int],
    settings: Scheduling,
    cluster: Scheduling,
    now: float,
) -> dict[str, int]:
    """The score of each node with recent failures, floor(5 x (1 - r)) (module docstring), r the larger of
    the app's own failures there / `failuresPerApp` (its profile's window) and the apps failed there (`apps`,
    from suspect_nodes) / `suspectNodeApps` (the top-level window); r is at most 1, where the filter refuses
    the node. In integers: min over both of 5 x (N - k) // N."""

    def score(k: int, n: int) -> int:
        return FAILING_SCORE * (n - min(k, n)) // n

    out = {node: score(k, cluster.suspect_node_apps) for node, k in apps.items()}
    for node, failed in _own_by_node(own, settings, now).items():
        mine = score(len(failed), settings.failures_per_app)
        out[node] = min(out.get(node, mine), mine)
    return out


def filter_nodes(
    names: Sequence[str], excluded: Mapping[str, Exclusion], cluster: frozenset[str]
) -> tuple[list[str], dict[str, str], bool]:
    """(nodes kept, failed node -> message, fell back).

    kube-scheduler sends only the nodes that fit the pod; when all of those are refused the pod waits for
    room on a good node (FailedScheduling says why). But when every node of the `cluster` is refused, none
    is: the executors run somewhere rather than nowhere."""
    if not excluded:
        return list(names), {}, False
    refused = excluded.keys()
    if cluster <= refused and refused >= set(names):
        return list(names), {}, True
    kept = [n for n in names if n not in refused]
    if len(kept) == len(names):
        return kept, {}, False
    return kept, {n: excluded[n].message for n in names if n in refused}, False


def scores(
    names: Iterable[str],
    settings: Scheduling,
    executors: Mapping[str, int],
    zones: Mapping[str, str],
    driver_zone: str | None,
    failing: Mapping[str, int] | None = None,
) -> list[tuple[str, int]]:
    """Each node's score, 0..10 (module docstring). Only the few nodes that run the app's executors have a
    score of their own; every other node scores by its zone alone. When some candidate has recent failures
    (`failing`: their scores, from failing_scores), the healthy nodes score 7 to 10 by that preference."""
    preferred = _preferences(names, settings, executors, zones, driver_zone)
    if not failing or failing.keys().isdisjoint(n for n, _ in preferred):
        return preferred
    return [(n, failing[n] if n in failing else _HEALTHY[p]) for n, p in preferred]


def _preferences(
    names: Iterable[str],
    settings: Scheduling,
    executors: Mapping[str, int],
    zones: Mapping[str, str],
    driver_zone: str | None,
) -> list[tuple[str, int]]:
    """Each node's score by the profile's preferences alone (packing, driverZone)."""
    names = list(names)
    packing = settings.packing != "none"
    zone = settings.driver_zone == "prefer" and driver_zone is not None
    if not packing and not zone:
        return [(n, 0) for n in names]
    candidates = set(names)
    most = max((k for n, k in executors.items() if n in candidates), default=0) if packing else 0

    def score(executors_here: int, in_zone: bool) -> int:
        p = 0
        if packing:
            share = executors_here / most if most else 0.0
            p = round(MAX_EXTENDER_PRIORITY * (share if settings.packing == "app" else 1 - share))
        if not zone:
            return p
        if packing:
            return (6 if in_zone else 0) + round(p * 4 / MAX_EXTENDER_PRIORITY)
        return MAX_EXTENDER_PRIORITY if in_zone else 0

    own = {n: score(k, zones.get(n) == driver_zone) for n, k in executors.items() if n in candidates}
    inside, outside = score(0, True), score(0, False)
    if not zone or inside == outside:
        return [(n, own.get(n, outside)) for n in names]
    return [(n, own.get(n, inside if zones.get(n) == driver_zone else outside)) for n in names]


# --- the protocol ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Args:
    pod: Obj
    names: list[str]
    nodes: list[Obj] | None  # the node objects when kube-scheduler sent them (not nodeCacheCapable)

    @property
    def app(self) -> AppKey | None:
        meta = self.pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if not contract.is_executor(labels):
            return None
        return AppKey(meta.get("namespace") or "", labels[contract.LABEL_APP_ID])

    @property
    def profile(self) -> str | None:
        annotations = (self.pod.get("metadata") or {}).get("annotations") or {}
        value = annotations.get(contract.ANNOTATION_PROFILE)
        return value if isinstance(value, str) else None


def _object_meta(document: Obj, where: str) -> Obj:
    """A pod's or node's metadata as Go decodes ObjectMeta: an object, its name and namespace strings, its
    labels and annotations maps of strings (anything else fails the decoding: 400)."""
    meta = document.get("metadata")
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise BadRequest(f"{where}.metadata: expected an object")
    for name in ("name", "namespace"):
        if not isinstance(meta.get(name, ""), str | None):
            raise BadRequest(f"{where}.metadata.{name}: expected a string")
    for name in ("labels", "annotations"):
        values = meta.get(name)
        if values is not None and (
            not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values())
        ):
            raise BadRequest(f"{where}.metadata.{name}: expected a map of strings")
    return meta


def parse_args(body: bytes) -> Args:
    """ExtenderArgs; Go's decoder matches field names case-insensitively, and so does this."""
    try:
        document = json.loads(body)
    except ValueError as e:
        raise BadRequest(f"the body is not JSON: {e}") from None
    except RecursionError:
        raise BadRequest("the body is nested too deeply") from None
    if not isinstance(document, dict):
        raise BadRequest("expected an ExtenderArgs object")
    fields = {str(k).lower(): v for k, v in document.items()}
    pod = fields.get("pod")
    if not isinstance(pod, dict):
        raise BadRequest("Pod: expected the pod object")
    _object_meta(pod, "Pod")
    names, nodes = fields.get("nodenames"), fields.get("nodes")
    if names is not None:
        if not isinstance(names, list) or not set(map(type, names)) <= {str}:
            raise BadRequest("NodeNames: expected a list of node names")
        return Args(pod, names, None)
    if isinstance(nodes, dict) and isinstance(nodes.get("items"), list):
        items = nodes["items"]
        if not all(isinstance(n, dict) for n in items):
            raise BadRequest("Nodes.items: expected node objects")
        return Args(
            pod, [_object_meta(n, f"Nodes.items[{i}]").get("name") or "" for i, n in enumerate(items)], items
        )
    raise BadRequest("expected NodeNames (nodeCacheCapable: true) or Nodes (a NodeList)")


class Extender:
    """Answers /scheduler/<verb> on the allocator's HTTP listener (every replica: followers' caches are warm).

    The suspect nodes do not depend on the pod: they are computed once and kept until a failure comes (the
    placement's version changes) or the oldest one leaves the window."""

    def __init__(
        self,
        placement: Placement,
        policy: PolicySource,
        metrics: AllocatorMetrics,
        *,
        synced: Callable[[], bool] = lambda: True,
        perf_counter: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.placement = placement
        self.policy = policy
        self.metrics = metrics
        # Whether the watches the placement comes from have listed (a replica that just started knows no
        # failure and no node yet: it answers as for a pod it does not manage, counted `not_synced`).
        self.synced = synced
        self.perf_counter = perf_counter
        # (placement version and top-level settings, valid until, suspect nodes, apps failed per node)
        self._suspect: tuple[tuple[int, Scheduling], float, dict[str, Exclusion], dict[str, int]] | None = (
            None
        )
        self._hosts: dict[str, str] = {}  # node name -> the start of its HostPriority in JSON

    def handle(self, verb: str, body: bytes) -> tuple[int, bytes]:
        """(HTTP status, JSON answer) for a POST to /scheduler/<verb>."""
        started = self.perf_counter()
        outcome = "ok"
        try:
            args = parse_args(body)
            policy = self.policy.current()
            app = args.app
            synced = self.synced()
            if app is None or policy is None or not synced:
                outcome = "not_executor" if app is None else "no_policy" if policy is None else "not_synced"
                if verb == "filter":
                    return 200, json.dumps(_filter_result(args, args.names, {})).encode()
                return 200, self._priorities((n, 0) for n in args.names)
            if verb == "filter":
                document, fell_back = self.filter(args, app, policy)
                outcome = "fallback" if fell_back else "ok"
                return 200, json.dumps(document).encode()
            return 200, self._priorities(self.prioritize(args, app, policy))
        except BadRequest as e:
            outcome = "bad_request"
            return 400, json.dumps({"Error": f"sparkgate: {e}"}).encode()
        except Exception as e:  # a defect: answered (kube-scheduler reads it as the extender's error), logged
            log.exception("extender %s failed", verb)
            outcome = "error"
            return 500, json.dumps({"Error": f"sparkgate: internal error: {type(e).__name__}: {e}"}).encode()
        finally:
            self.metrics.extender_requests.labels(verb, outcome).inc()
            self.metrics.extender_seconds.labels(verb).observe(self.perf_counter() - started)

    def _priorities(self, scored: Iterable[tuple[str, int]]) -> bytes:
        """A HostPriorityList, written by hand: a thousand dicts through json.dumps cost a third of a
        millisecond more."""
        hosts = self._hosts
        if len(hosts) > 100_000:  # names come from requests: keep the cache bounded
            hosts = self._hosts = {}  # a new one: another request may be reading the old
        scored = list(scored)
        for name, _ in scored:
            if name not in hosts:
                hosts[name] = '{"Host":' + encode_basestring(name) + ',"Score":'
        return ("[" + ",".join([hosts[n] + _SCORES[s] for n, s in scored]) + "]").encode()

    def suspect(self, policy: Policy) -> tuple[dict[str, Exclusion], dict[str, int]]:
        """The suspect nodes and how many apps failed on each node (suspect_nodes), cached."""
        cluster = policy.scheduling
        key = (self.placement.version, cluster)
        cached = self._suspect
        now = self.placement.monotonic()
        if cached is not None and cached[0] == key and now < cached[1]:
            return cached[2], cached[3]
        found, apps, valid_until = suspect_nodes(
            self.placement.failures(cluster.failure_window_seconds), cluster, now
        )
        self._suspect = (key, valid_until, found, apps)
        return found, apps

    def own_failures(self, app: AppKey, settings: Scheduling) -> list[Failure]:
        return self.placement.app_failures(app, settings.failure_window_seconds)

    def excluded(self, app: AppKey, profile: str | None, policy: Policy) -> dict[str, Exclusion]:
        settings = policy.scheduling_for(profile)
        own = self.own_failures(app, settings)
        return exclusions(own, app, settings, self.suspect(policy)[0], self.placement.monotonic())

    def filter(self, args: Args, app: AppKey, policy: Policy) -> tuple[Obj, bool]:
        excluded = self.excluded(app, args.profile, policy)
        kept, failed, fell_back = filter_nodes(args.names, excluded, self.placement.nodes())
        if fell_back:
            self.metrics.extender_fallbacks.inc()
        counts = collections.Counter((excluded[n].scope, excluded[n].reason) for n in failed)
        for (scope, reason), n in counts.items():
            self.metrics.extender_excluded.labels(scope, reason).inc(n)
        return _filter_result(args, kept, failed), fell_back

    def prioritize(self, args: Args, app: AppKey, policy: Policy) -> list[tuple[str, int]]:
        settings = policy.scheduling_for(args.profile)
        zone = self.placement.driver_zone(app) if settings.driver_zone == "prefer" else None
        executors = self.placement.executors(app) if settings.packing != "none" else {}
        own = self.own_failures(app, settings)
        now = self.placement.monotonic()
        failing = failing_scores(own, self.suspect(policy)[1], settings, policy.scheduling, now)
        return scores(args.names, settings, executors, self.placement.zones(), zone, failing)

    def app_document(self, app: AppKey, profile: str | None) -> list[Obj]:
        """The app's refused nodes and why, for /apps and /apps/<namespace>/<app id>."""
        policy = self.policy.current()
        if policy is None:
            return []
        return [
            {"node": e.node, "scope": e.scope, "reason": e.reason, "message": e.message}
            for e in sorted(self.excluded(app, profile, policy).values(), key=lambda e: e.node)
        ]


_SCORES = tuple(f"{i}}}" for i in range(MAX_EXTENDER_PRIORITY + 1))


def _filter_result(args: Args, kept: list[str], failed: dict[str, str]) -> Obj:
    result: Obj = {
        "NodeNames": kept,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": failed,
        "Error": "",
    }
    if args.nodes is not None:  # not nodeCacheCapable: kube-scheduler reads the node objects back
        keep = set(kept)
        result["NodeNames"] = None
        result["Nodes"] = {
            "kind": "NodeList",
            "apiVersion": "v1",
            "items": [n for n in args.nodes if (n.get("metadata") or {}).get("name") in keep],
        }
    return result
