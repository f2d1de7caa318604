"""The admin's policy: one YAML document, loaded strictly into frozen objects.

Both the webhook (profiles: template, labels, config maps) and the allocator (allocation settings and
limits) read the same document. Loading refuses anything it does not understand and says exactly where
(`profiles[2].configMaps[0].mountPath: required`), so a typo never silently changes what the cluster does;
the caller keeps the last good policy in force. docs/policy.md is the reference for the format.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import pydantic
import yaml
from kubernetes.client import V1Pod

from sparkgate import contract

API_VERSION = "sparkgate.io/v1alpha1"
KIND = "Policy"
ALWAYS_EXCLUDED = ("kube-system",)

MAX_BATCH = 10_000
MAX_PENDING = 1_000_000
MAX_DELAY_SECONDS = 3600.0
PACING = ("adaptive", "fixed")  # docs/policy.md "Pacing"; allocator/pacing.py is the rule
# docs/policy.md "Autoscaled clusters": whether the pods sparkgate holds are shown to the cluster autoscaler
# (allocator/demand.py), and whether an app's held pods are asked for through a ProvisioningRequest of one
# of cluster-autoscaler's classes (allocator/provisioning.py).
AUTOSCALER_DEMAND = ("held", "released")
PROVISIONING = ("none", "check-capacity", "best-effort-atomic-scale-up")


class PolicyError(ValueError):
    """A policy document that cannot be used; `errors` holds one "place: problem" line each."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class Allocation:
    """How one application's gated pods are released."""

    batch_size: int
    batch_delay_seconds: float
    max_pending_per_app: int
    pacing: str = "fixed"  # "adaptive": the window grows while the scheduler binds at once (pacing.py)
    max_batch_size: int = 500  # the adaptive window's ceiling
    slow_bind_seconds: float = 5.0  # a released pod unbound this long makes adaptive pacing fall back
    # A released pod the scheduler refused this long holds its app back (allocator/pacing.py `refused_hold`)
    # and is no sign of life for a client-mode app (allocator/registry.py).
    unschedulable_seconds: float = 60.0
    autoscaler_demand: str = "held"  # "released": the autoscaler sees only the pods sparkgate released
    provisioning: str = "none"  # or a ProvisioningRequest class's short name (PROVISIONING)

    def with_override(self, o: AllocationOverride) -> Allocation:
        return replace(self, **{k: v for k, v in vars(o).items() if v is not None})


@dataclass(frozen=True)
class AllocationOverride:
    """A profile's changes to the defaults; None keeps the default."""

    batch_size: int | None = None
    batch_delay_seconds: float | None = None
    max_pending_per_app: int | None = None
    pacing: str | None = None
    max_batch_size: int | None = None
    slow_bind_seconds: float | None = None
    unschedulable_seconds: float | None = None
    autoscaler_demand: str | None = None
    provisioning: str | None = None


@dataclass(frozen=True)
class Caps:
    """Hard ceilings that no profile or user annotation can exceed."""

    batch_size: int
    max_pending_per_app: int


@dataclass(frozen=True)
class ConfigMapMount:
    """A source ConfigMap (install namespace), copied per app and mounted into Spark's container."""

    source: str
    mount_path: str


@dataclass(frozen=True)
class Match:
    """Which executor pods a profile applies to; every given criterion must hold."""

    namespaces: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)

    def namespace_allowed(self, namespace: str) -> bool:
        return not self.namespaces or any(fnmatch.fnmatchcase(namespace, g) for g in self.namespaces)

    def matches(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return self.namespace_allowed(namespace) and all(labels.get(k) == v for k, v in self.labels.items())


@dataclass(frozen=True)
class Profile:
    name: str
    match: Match
    template: Mapping[str, Any]
    overrides: tuple[tuple[str, ...], ...]
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    config_maps: tuple[ConfigMapMount, ...]
    allocation: AllocationOverride
    scheduling: SchedulingOverride = field(default_factory=lambda: SchedulingOverride())


@dataclass(frozen=True)
class Policy:
    allocation: Allocation
    max_pending_per_namespace: int
    max_pending_cluster: int
    caps: Caps
    excluded_namespaces: tuple[str, ...]
    profiles: tuple[Profile, ...]
    digest: str
    scheduling: Scheduling = field(default_factory=lambda: Scheduling())
    # allocation_for's answers, by (profile, batch-size annotation, max-pending annotation): the same for
    # every app of a profile, asked at every decision (bench/scale.py). The policy is immutable.
    _allocations: dict[tuple[str | None, str | None, str | None], tuple[Allocation, tuple[str, ...]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    # is_excluded's answers by namespace (asked per app decided and per namespace scraped).
    _excluded: dict[str, bool] = field(default_factory=dict, init=False, repr=False, compare=False)
    _longest_window: list[float] = field(default_factory=list, init=False, repr=False, compare=False)

    def is_excluded(self, namespace: str) -> bool:
        excluded = self._excluded.get(namespace)
        if excluded is None:
            if len(self._excluded) > 100_000:  # namespaces come and go over months: a bounded memo
                self._excluded.clear()
            excluded = self._excluded[namespace] = any(
                fnmatch.fnmatchcase(namespace, g) for g in self.excluded_namespaces
            )
        return excluded

    def profile_for(
        self, namespace: str, labels: Mapping[str, str], annotations: Mapping[str, str]
    ) -> Profile | None:
        """The profile for an executor pod.

        A profile named by the pod's `sparkgate.io/profile` annotation wins when its namespaces allow it
        (a pod cannot pick a profile meant for another namespace); otherwise the first profile whose
        match holds. The webhook writes the chosen name back into the same annotation, so mutating an
        already-mutated pod picks the same profile again.
        """
        requested = annotations.get(contract.ANNOTATION_PROFILE)
        if requested:
            for profile in self.profiles:
                if profile.name == requested and profile.match.namespace_allowed(namespace):
                    return profile
        for profile in self.profiles:
            if profile.match.matches(namespace, labels):
                return profile
        return None

    def profile_named(self, name: str) -> Profile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def scheduling_for(self, profile: str | None) -> Scheduling:
        """The extender's settings for an executor of this profile (by name): defaults, then the profile."""
        found = self.profile_named(profile) if profile else None
        return self.scheduling if found is None else self.scheduling.with_override(found.scheduling)

    def longest_failure_window(self) -> float:
        """The longest failureWindowSeconds in force, the defaults' or a profile's: how long the extender
        must keep a failure (asked at each failure and each extender request: worked out once)."""
        if not self._longest_window:
            windows = [self.scheduling_for(p.name).failure_window_seconds for p in self.profiles]
            self._longest_window.append(float(max([self.scheduling.failure_window_seconds, *windows])))
        return self._longest_window[0]

    def allocation_for(
        self, profile: Profile | None, annotations: Mapping[str, str]
    ) -> tuple[Allocation, list[str]]:
        """The settings in force for an app: defaults, then the profile, then the user's annotations.

        Annotations are clamped to [1, cap]. A malformed annotation is ignored; the returned list says
        which and why, for a Warning event.
        """
        key = (
            None if profile is None else profile.name,
            annotations.get(contract.ANNOTATION_BATCH_SIZE),
            annotations.get(contract.ANNOTATION_MAX_PENDING),
        )
        known = self._allocations.get(key)
        if known is None:
            allocation, problems = self._allocation_for(profile, annotations)
            known = self._allocations[key] = (allocation, tuple(problems))
        return known[0], list(known[1])

    def _allocation_for(
        self, profile: Profile | None, annotations: Mapping[str, str]
    ) -> tuple[Allocation, list[str]]:
        base = self.allocation if profile is None else self.allocation.with_override(profile.allocation)
        problems: list[str] = []

        def annotated(key: str, cap: int) -> int | None:
            raw = annotations.get(key)
            if raw is None:
                return None
            text = raw.strip()
            if not text.isdecimal() or int(text) < 1:
                problems.append(f"annotation {key}={raw!r} ignored: expected a whole number >= 1")
                return None
            return min(int(text), cap)

        batch = annotated(contract.ANNOTATION_BATCH_SIZE, self.caps.batch_size)
        pending = annotated(contract.ANNOTATION_MAX_PENDING, self.caps.max_pending_per_app)
        if batch is not None:
            base = replace(base, batch_size=batch)
        if pending is not None:
            base = replace(base, max_pending_per_app=pending)
        return base, problems


# --- loading -------------------------------------------------------------------------------------


class _Reader:
    """Walks the document, collecting every error with the exact place it was found."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self._path: list[str] = []

    @property
    def here(self) -> str:
        return "".join(self._path).lstrip(".") or "(document)"

    def error(self, message: str, at: str | None = None) -> None:
        place = self.here if at is None else f"{self.here}.{at}".removeprefix("(document).")
        self.errors.append(f"{place}: {message}")

    @contextmanager
    def at(self, step: str) -> Iterator[None]:
        self._path.append(step if step.startswith("[") else f".{step}")
        try:
            yield
        finally:
            self._path.pop()

    def mapping(
        self, value: object, keys: set[str], required: frozenset[str] = frozenset()
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.error(f"expected a mapping, got {_kind(value)}")
            return {}
        for key in value:
            if key not in keys:
                self.error(f"unknown key (expected one of: {', '.join(sorted(keys))})", at=str(key))
        for key in sorted(required - value.keys()):
            self.error("required", at=key)
        return value

    def child(
        self, parent: dict[str, Any], key: str, read: Callable[[object], Any], default: Any = None
    ) -> Any:
        if key not in parent:
            return default
        with self.at(key):
            return read(parent[key])

    def integer(self, low: int, high: int) -> Callable[[object], int | None]:
        def read(value: object) -> int | None:
            if isinstance(value, bool) or not isinstance(value, int):
                self.error(f"expected a whole number, got {_kind(value)}")
                return None
            if not low <= value <= high:
                self.error(f"must be between {low} and {high}, got {value}")
                return None
            return value

        return read

    def seconds(self, value: object) -> float | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.error(f"expected a number of seconds, got {_kind(value)}")
            return None
        if not 0 <= value <= MAX_DELAY_SECONDS:
            self.error(f"must be between 0 and {MAX_DELAY_SECONDS:g}, got {value}")
            return None
        return float(value)

    def string(self, value: object) -> str | None:
        if not isinstance(value, str) or not value:
            self.error(f"expected a non-empty string, got {_kind(value)}")
            return None
        return value

    def strings(self, value: object) -> tuple[str, ...]:
        if not isinstance(value, list):
            self.error(f"expected a list of strings, got {_kind(value)}")
            return ()
        out = []
        for i, item in enumerate(value):
            with self.at(f"[{i}]"):
                text = self.string(item)
                if text is not None:
                    out.append(text)
        return tuple(out)

    def string_map(self, value: object) -> dict[str, str]:
        if not isinstance(value, dict):
            self.error(f"expected a mapping of strings, got {_kind(value)}")
            return {}
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or not isinstance(v, str):
                self.error(f"expected a string value, got {_kind(v)}", at=str(k))
            else:
                out[k] = v
        return out


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), f"a {type(value).__name__}"
    )


_ALLOCATION_KEYS = {
    "batchSize",
    "batchDelaySeconds",
    "maxPendingPerApp",
    "pacing",
    "maxBatchSize",
    "slowBindSeconds",
    "unschedulableSeconds",
    "autoscalerDemand",
    "provisioning",
}
_CLUSTER_KEYS = _ALLOCATION_KEYS | {"maxPendingPerNamespace", "maxPendingCluster"}
_PROFILE_KEYS = {
    "name",
    "match",
    "template",
    "overrides",
    "labels",
    "annotations",
    "configMaps",
    "allocation",
    "scheduling",
}
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_PATH_SEGMENT = re.compile(r"^([A-Za-z][A-Za-z0-9]*)(?:\[([^\[\]]+)\])?$")

DEFAULT_ALLOCATION: dict[str, Any] = {
    "batchSize": 10,
    "batchDelaySeconds": 1,
    "maxPendingPerApp": 50,
    "maxPendingPerNamespace": 200,
    "maxPendingCluster": 500,
    "pacing": Allocation.pacing,
    "maxBatchSize": Allocation.max_batch_size,
    "slowBindSeconds": Allocation.slow_bind_seconds,
    "unschedulableSeconds": Allocation.unschedulable_seconds,
    "autoscalerDemand": Allocation.autoscaler_demand,
    "provisioning": Allocation.provisioning,
}


def load_policy(text: str, install_namespace: str = contract.INSTALL_NAMESPACE) -> Policy:
    """Parse and validate a policy document, or raise PolicyError listing every problem."""
    try:
        loader = yaml.SafeLoader(text)  # refuses a control character at once (ReaderError)
    except yaml.YAMLError as exc:
        raise PolicyError([f"(document): not valid YAML: {exc}"]) from None
    try:
        document = loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "(document)"
        raise PolicyError([f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}"]) from None
    except RecursionError:  # PyYAML composes nested collections recursively
        mark = loader.get_mark()
        raise PolicyError([f"line {mark.line + 1}, column {mark.column + 1}: nested too deeply"]) from None
    finally:
        loader.dispose()
    if document is None:
        document = {}
    r = _Reader()
    top = r.mapping(
        document,
        {"apiVersion", "kind", "allocation", "caps", "excludedNamespaces", "profiles", "scheduling"},
        required=frozenset({"apiVersion", "kind"}),
    )
    if top.get("apiVersion", API_VERSION) != API_VERSION:
        r.error(f"expected {API_VERSION}", at="apiVersion")
    if top.get("kind", KIND) != KIND:
        r.error(f"expected {KIND}", at="kind")

    cluster = dict(DEFAULT_ALLOCATION)
    if "allocation" in top:
        with r.at("allocation"):
            cluster.update(_read_allocation(r, r.mapping(top["allocation"], _CLUSTER_KEYS)))
    caps_raw: dict[str, float | int] = {
        "batchSize": max(100, int(cluster["batchSize"])),
        "maxPendingPerApp": cluster["maxPendingCluster"],
    }
    if "caps" in top:
        with r.at("caps"):
            caps_raw.update(_read_allocation(r, r.mapping(top["caps"], {"batchSize", "maxPendingPerApp"})))
    caps = Caps(batch_size=int(caps_raw["batchSize"]), max_pending_per_app=int(caps_raw["maxPendingPerApp"]))
    allocation = Allocation(
        batch_size=int(cluster["batchSize"]),
        batch_delay_seconds=float(cluster["batchDelaySeconds"]),
        max_pending_per_app=int(cluster["maxPendingPerApp"]),
        pacing=str(cluster["pacing"]),
        max_batch_size=int(cluster["maxBatchSize"]),
        slow_bind_seconds=float(cluster["slowBindSeconds"]),
        unschedulable_seconds=float(cluster["unschedulableSeconds"]),
        autoscaler_demand=str(cluster["autoscalerDemand"]),
        provisioning=str(cluster["provisioning"]),
    )
    _check_within_caps(r, "allocation", allocation.batch_size, allocation.max_pending_per_app, caps)
    _check_window(r, "allocation", allocation)

    excluded = r.child(top, "excludedNamespaces", r.strings, ())
    scheduling = Scheduling().with_override(
        r.child(top, "scheduling", lambda v: _read_scheduling(r, v, True), None)
    )
    profiles: list[Profile] = []
    raw_profiles = top.get("profiles", [])
    with r.at("profiles"):
        if not isinstance(raw_profiles, list):
            r.error(f"expected a list of profiles, got {_kind(raw_profiles)}")
            raw_profiles = []
    for i, raw in enumerate(raw_profiles):
        with r.at(f"profiles[{i}]"):
            profile = _read_profile(r, raw, caps, allocation)
        if profile is not None:
            if any(p.name == profile.name for p in profiles):
                r.error(f"duplicate profile name {profile.name!r}", at=f"profiles[{i}].name")
            profiles.append(profile)

    if r.errors:
        raise PolicyError(r.errors)
    return Policy(
        allocation=allocation,
        max_pending_per_namespace=int(cluster["maxPendingPerNamespace"]),
        max_pending_cluster=int(cluster["maxPendingCluster"]),
        caps=caps,
        excluded_namespaces=tuple(dict.fromkeys((*ALWAYS_EXCLUDED, install_namespace, *excluded))),
        profiles=tuple(profiles),
        digest=hashlib.sha256(text.encode()).hexdigest()[:12],
        scheduling=scheduling,
    )


def _read_allocation(r: _Reader, raw: dict[str, Any]) -> dict[str, Any]:
    def choice(options: tuple[str, ...], what: str = "") -> Callable[[object], str | None]:
        def read(value: object) -> str | None:
            if value not in options:
                r.error(f"expected one of {', '.join(options)}{f' ({what})' if what else ''}, got {value!r}")
                return None
            return str(value)

        return read

    def bound(value: object) -> float | None:
        seconds = r.seconds(value)
        if seconds == 0:
            r.error("must be more than 0 (a pod is never bound at the instant it is released)")
            return None
        return seconds

    readers: dict[str, Callable[[object], Any]] = {
        "batchSize": r.integer(1, MAX_BATCH),
        "batchDelaySeconds": r.seconds,
        "maxPendingPerApp": r.integer(1, MAX_PENDING),
        "maxPendingPerNamespace": r.integer(1, MAX_PENDING),
        "maxPendingCluster": r.integer(1, MAX_PENDING),
        "pacing": choice(PACING),
        "autoscalerDemand": choice(
            AUTOSCALER_DEMAND, "whether the cluster autoscaler sees the executor pods sparkgate holds"
        ),
        "provisioning": choice(
            PROVISIONING, "the ProvisioningRequest class an app's held executors are asked for with"
        ),
        "maxBatchSize": r.integer(1, MAX_BATCH),
        "slowBindSeconds": bound,
        "unschedulableSeconds": r.seconds,
    }
    out = {}
    for key in raw:
        if key in readers:
            value = r.child(raw, key, readers[key])
            if value is not None:
                out[key] = value
    return out


def _check_window(r: _Reader, where: str, allocation: Allocation) -> None:
    """The adaptive window starts at batchSize and grows up to maxBatchSize: a ceiling below the start is a
    contradiction, refused rather than silently raised."""
    if allocation.max_batch_size < allocation.batch_size:
        r.errors.append(
            f"{where}.maxBatchSize: {allocation.max_batch_size} is below batchSize ({allocation.batch_size}); "
            "the adaptive window starts at batchSize and grows up to maxBatchSize"
        )


def _check_within_caps(r: _Reader, where: str, batch: int | None, pending: int | None, caps: Caps) -> None:
    if batch is not None and batch > caps.batch_size:
        r.errors.append(f"{where}.batchSize: {batch} is above caps.batchSize ({caps.batch_size})")
    if pending is not None and pending > caps.max_pending_per_app:
        r.errors.append(
            f"{where}.maxPendingPerApp: {pending} is above caps.maxPendingPerApp ({caps.max_pending_per_app})"
        )


def _read_profile(r: _Reader, raw: object, caps: Caps, defaults: Allocation) -> Profile | None:
    errors_before = len(r.errors)
    p = r.mapping(raw, _PROFILE_KEYS, required=frozenset({"name"}))
    name = r.child(p, "name", r.string)
    if name is not None and (not _NAME.match(name) or len(name) > 63 or name == contract.NO_PROFILE):
        r.error(
            f"{name!r} is not a valid profile name (lower-case DNS label, not {contract.NO_PROFILE!r})",
            at="name",
        )
    match = Match()
    if "match" in p:
        with r.at("match"):
            m = r.mapping(p["match"], {"namespaces", "labels"})
            match = Match(
                namespaces=r.child(m, "namespaces", r.strings, ()),
                labels=r.child(m, "labels", r.string_map, {}),
            )
    template: dict[str, Any] = r.child(p, "template", lambda v: _read_template(r, v), {})
    overrides = r.child(p, "overrides", lambda v: _read_overrides(r, v, template), ())
    labels: dict[str, str] = r.child(p, "labels", r.string_map, {})
    for key in sorted(contract.SPARK_LABELS & labels.keys()):
        r.error("Spark's own label cannot be set by a profile", at=f"labels.{key}")
    for key in sorted(REFUSED_LABELS.keys() & labels.keys()):
        r.error(f"a profile may not set this label: {REFUSED_LABELS[key]}", at=f"labels.{key}")
    annotations: dict[str, str] = r.child(p, "annotations", r.string_map, {})
    if contract.ANNOTATION_PROFILE in annotations:
        r.error("set by sparkgate itself", at=f"annotations.{contract.ANNOTATION_PROFILE}")
    config_maps = r.child(p, "configMaps", lambda v: _read_config_maps(r, v), ())
    allocation = AllocationOverride()
    if "allocation" in p:
        with r.at("allocation"):
            numbers = _read_allocation(r, r.mapping(p["allocation"], _ALLOCATION_KEYS))
            allocation = AllocationOverride(
                batch_size=_opt_int(numbers.get("batchSize")),
                batch_delay_seconds=_opt_float(numbers.get("batchDelaySeconds")),
                max_pending_per_app=_opt_int(numbers.get("maxPendingPerApp")),
                pacing=numbers.get("pacing"),
                max_batch_size=_opt_int(numbers.get("maxBatchSize")),
                slow_bind_seconds=_opt_float(numbers.get("slowBindSeconds")),
                unschedulable_seconds=_opt_float(numbers.get("unschedulableSeconds")),
                autoscaler_demand=numbers.get("autoscalerDemand"),
                provisioning=numbers.get("provisioning"),
            )
            _check_within_caps(r, r.here, allocation.batch_size, allocation.max_pending_per_app, caps)
            _check_window(r, r.here, defaults.with_override(allocation))
    scheduling = r.child(p, "scheduling", lambda v: _read_scheduling(r, v, False), SchedulingOverride())
    if len(r.errors) > errors_before or name is None:
        return None
    return Profile(
        name=name,
        match=match,
        template=template,
        overrides=overrides,
        labels=labels,
        annotations=annotations,
        config_maps=config_maps,
        allocation=allocation,
        scheduling=scheduling,
    )


def _opt_int(value: float | int | None) -> int | None:
    return None if value is None else int(value)


def _opt_float(value: float | int | None) -> float | None:
    return None if value is None else float(value)


def _read_template(r: _Reader, value: object) -> dict[str, Any]:
    """A pod, in the form of Spark's `spark.kubernetes.executor.podTemplateFile`.

    Checked against the Kubernetes Pod schema (the official client's models forbid unknown fields), so a
    misspelt field is reported where it is, rather than dropped by the API server later.
    """
    if not isinstance(value, dict):
        r.error(f"expected a pod (a mapping), got {_kind(value)}")
        return {}
    if value.get("kind", "Pod") != "Pod" or value.get("apiVersion", "v1") != "v1":
        r.error("expected a pod (apiVersion v1, kind Pod)")
        return {}
    try:
        V1Pod.model_validate(value)
    except pydantic.ValidationError as exc:
        for err in exc.errors():
            loc = err["loc"]
            if err["type"] == "missing" and loc[-1:] == ("containers",):
                continue  # a template may leave the containers to Spark
            if err["type"] == "string_type" and _is_quantity(loc, err.get("input")):
                continue  # quantities may be written as numbers, as kubectl accepts
            r.error(err["msg"].lower() if err["type"] != "extra_forbidden" else "unknown field", at=_loc(loc))
    for path, reason in REFUSED_TEMPLATE_FIELDS.items():
        if resolve(value, path)[0]:
            r.error(f"a template may not set this: {reason}", at=".".join(path))
    labels = resolve(value, ("metadata", "labels"))[1]
    if isinstance(labels, dict):  # anything else is reported above, against the Pod schema
        for key in sorted(REFUSED_LABELS.keys() & labels.keys()):
            r.error(f"a template may not set this label: {REFUSED_LABELS[key]}", at=f"metadata.labels.{key}")
    _check_finite(r, value)
    return value


def _check_finite(r: _Reader, value: object) -> None:
    """YAML's .nan and .inf are floats that JSON cannot carry: in a patch, the API server refuses it whole."""
    if isinstance(value, float) and not math.isfinite(value):
        r.error(f"expected a finite number, got {value}")
    elif isinstance(value, dict):
        for key, item in value.items():
            with r.at(str(key)):
                _check_finite(r, item)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            with r.at(f"[{i}]"):
                _check_finite(r, item)


# --- what a template must never set ----------------------------------------------------------------
# The API server's admission plugins refuse these in a pod, or they would take the pod out of sparkgate's
# hands or move it between quotas behind the admin's back. docs/policy.md ("Admission plugins") has the
# table of every plugin that touches pods; sparkgate/mutation/derived.py handles the fields a template may
# change.

REFUSED_TEMPLATE_FIELDS: dict[tuple[str, ...], str] = {
    ("spec", "nodeName"): (
        "it binds the pod to a node, bypassing the scheduler and sparkgate's gate (the API server refuses "
        "a gated pod with a node name); use spec.nodeSelector or spec.affinity"
    ),
    ("spec", "priority"): (
        "the Priority admission plugin computes it from the PriorityClass and refuses a pod that gives "
        "another number; set spec.priorityClassName"
    ),
    ("spec", "preemptionPolicy"): (
        "the Priority admission plugin takes it from the PriorityClass and refuses a pod that gives "
        "another one; set spec.priorityClassName"
    ),
    ("spec", "overhead"): (
        "the RuntimeClass admission plugin takes it from the RuntimeClass and refuses a pod whose overhead "
        "differs; set spec.runtimeClassName"
    ),
    ("spec", "serviceAccount"): (
        "a deprecated alias that the API server ignores whenever serviceAccountName is set (always, once "
        "the ServiceAccount plugin ran); set spec.serviceAccountName"
    ),
    ("spec", "schedulingGates"): (
        "sparkgate's gate is the only one on executor pods: the allocator counts a pod it released as in "
        "flight, and another gate would hold it back from the scheduler with nobody to remove it"
    ),
    ("spec", "ephemeralContainers"): (
        "the API server refuses ephemeral containers in a pod creation (they are added later, through the "
        "ephemeralcontainers subresource)"
    ),
    ("spec", "activeDeadlineSeconds"): (
        "it kills every executor after that many seconds (Spark counts each as an executor failure) and "
        "moves the pods into ResourceQuota's Terminating scope"
    ),
}
REFUSED_LABELS: dict[str, str] = {
    key: "the PodTopologyLabels admission plugin copies the node's value onto the pod when it is bound"
    for key in ("topology.kubernetes.io/zone", "topology.kubernetes.io/region")
}


def _is_quantity(loc: tuple[int | str, ...], value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and any(part in ("limits", "requests", "overhead") for part in loc)
    )


def _loc(loc: tuple[int | str, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def parse_field_path(text: str) -> tuple[str, ...] | None:
    """`spec.containers[NAME].securityContext` → ("spec", "containers", "[NAME]", "securityContext")."""
    segments: list[str] = []
    for part in text.split("."):
        m = _PATH_SEGMENT.match(part)
        if not m:
            return None
        segments.append(m.group(1))
        if m.group(2) is not None:
            segments.append(f"[{m.group(2)}]")
    return tuple(segments) if segments and segments[0] in ("metadata", "spec") else None


def resolve(obj: Any, path: tuple[str, ...]) -> tuple[bool, Any]:
    """Follow a parsed field path; list elements are selected by their `name`. (found?, value)."""
    for segment in path:
        if segment.startswith("["):
            if not isinstance(obj, list):
                return False, None
            obj = next((x for x in obj if isinstance(x, dict) and x.get("name") == segment[1:-1]), None)
            if obj is None:
                return False, None
        elif isinstance(obj, dict) and segment in obj:
            obj = obj[segment]
        else:
            return False, None
    return True, obj


def _read_overrides(r: _Reader, value: object, template: dict[str, Any]) -> tuple[tuple[str, ...], ...]:
    out = []
    for i, text in enumerate(r.strings(value)):
        with r.at(f"[{i}]"):
            path = parse_field_path(text)
            if path is None:
                r.error(
                    f"{text!r} is not a field path like spec.tolerations or spec.containers[NAME].resources"
                )
            elif path[:2] == ("metadata", "labels") and len(path) > 2 and path[2] in contract.SPARK_LABELS:
                r.error(f"{text}: Spark's own labels are never changed")
            elif not resolve(template, path)[0]:
                r.error(f"{text} is not set in the template, so there is nothing to override with")
            else:
                out.append(path)
    return tuple(out)


def _read_config_maps(r: _Reader, value: object) -> tuple[ConfigMapMount, ...]:
    if not isinstance(value, list):
        r.error(f"expected a list, got {_kind(value)}")
        return ()
    out: list[ConfigMapMount] = []
    for i, raw in enumerate(value):
        with r.at(f"[{i}]"):
            m = r.mapping(raw, {"source", "mountPath"}, required=frozenset({"source", "mountPath"}))
            source = r.child(m, "source", r.string)
            mount_path = r.child(m, "mountPath", r.string)
            if source is not None and not (_SUBDOMAIN.match(source) and len(source) <= 253):
                r.error(f"{source!r} is not a valid ConfigMap name", at="source")
            elif source is not None and any(c.source == source for c in out):
                r.error(f"config map {source!r} listed twice", at="source")
            if mount_path is not None and not mount_path.startswith("/"):
                r.error("must be an absolute path", at="mountPath")
            elif mount_path is not None and any(c.mount_path == mount_path for c in out):
                r.error(f"{mount_path} mounted twice", at="mountPath")
            if source is not None and mount_path is not None:
                out.append(ConfigMapMount(source=source, mount_path=mount_path))
    return tuple(out)


# --- scheduling: the scheduler extender's settings (docs/policy.md "Scheduling") -----------------------

PACKING = ("none", "app", "spread")
DRIVER_ZONE = ("ignore", "prefer")
MAX_FAILURE_WINDOW_SECONDS = 86_400.0


@dataclass(frozen=True)
class SchedulingOverride:
    """A profile's changes to the scheduling defaults (or, top level, to the built-in ones); None keeps them."""

    failures_per_app: int | None = None
    suspect_node_apps: int | None = None  # top level only: a suspect node is one for every app
    failure_window_seconds: float | None = None
    packing: str | None = None
    driver_zone: str | None = None
    scheduler_name: str | None = None  # profiles only: the webhook sets it as the executors' schedulerName


@dataclass(frozen=True)
class Scheduling:
    """What the extender does for an app's executors.

    A node where `failures_per_app` executors of the app failed within the window is filtered out for
    that app; one where executors of `suspect_node_apps` different apps failed, for every app."""

    failures_per_app: int = 3
    suspect_node_apps: int = 3
    failure_window_seconds: float = 600.0
    packing: str = "none"  # "app": fewest nodes per app; "spread": as many as possible
    driver_zone: str = "ignore"  # "prefer": nodes in the driver's zone first
    scheduler_name: str | None = None

    def with_override(self, o: SchedulingOverride | None) -> Scheduling:
        if o is None:
            return self
        changes = {k: v for k, v in vars(o).items() if v is not None}
        return replace(self, **changes)


def _read_scheduling(r: _Reader, value: object, top: bool) -> SchedulingOverride:
    keys = {"failuresPerApp", "failureWindowSeconds", "packing", "driverZone"}
    keys |= {"suspectNodeApps"} if top else {"schedulerName"}
    m = r.mapping(value, keys)

    def window(v: object) -> float | None:
        if isinstance(v, bool) or not isinstance(v, int | float) or not 1 <= v <= MAX_FAILURE_WINDOW_SECONDS:
            r.error(f"expected seconds between 1 and {MAX_FAILURE_WINDOW_SECONDS:g}, got {v!r}")
            return None
        return float(v)

    def choice(options: tuple[str, ...]) -> Callable[[object], str | None]:
        def read(v: object) -> str | None:
            if v not in options:
                r.error(f"expected one of {', '.join(options)}, got {v!r}")
                return None
            return str(v)

        return read

    def scheduler_name(v: object) -> str | None:
        text = r.string(v)
        if text is not None and not (_SUBDOMAIN.match(text) and len(text) <= 253):
            r.error(f"{text!r} is not a valid scheduler name (a DNS subdomain)")
            return None
        return text

    return SchedulingOverride(
        failures_per_app=r.child(m, "failuresPerApp", r.integer(1, 1000)),
        suspect_node_apps=r.child(m, "suspectNodeApps", r.integer(1, 1000)),
        failure_window_seconds=r.child(m, "failureWindowSeconds", window),
        packing=r.child(m, "packing", choice(PACKING)),
        driver_zone=r.child(m, "driverZone", choice(DRIVER_ZONE)),
        scheduler_name=r.child(m, "schedulerName", scheduler_name),
    )
