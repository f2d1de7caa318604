"""sparkgate's policy as a MutatingAdmissionPolicy: the webhook's `mutate`, written in CEL for the API server.

`render(policy)` returns one `MutatingAdmissionPolicy` and its `MutatingAdmissionPolicyBinding`
(admissionregistration.k8s.io/v1, GA in Kubernetes 1.36): with them installed the API server shapes and
gates executor pods itself, with no webhook, certificate or timeout in the admission path. The rendered
pod must equal the pod after `sparkgate.mutation.mutate` field by field (tests/sparkgate/
test_render_parity.py is the oracle; docs/policy.md lists what cannot be equal and why).

Why one policy with a branch per profile rather than one policy per profile: the API server evaluates
every bound policy's match conditions on every executor pod, and a profile's policy must prove that no
earlier profile matched, so N policies cost O(N²) per pod; one policy picks the profile once
(`variables.profile`, O(N)) and runs only the chosen branch (a CEL conditional evaluates one side). The
branches are spread over a few mutations (`_mutations`) to stay within cel-go's parser limits.

How the webhook's rules become CEL (docs/real-cluster-facts.md, "Admission policies in the API server"):

- JSONPatch only, never ApplyConfiguration (it depends on the server's schema); values are plain literals
  (sparkgate/cel.py), never typed `Object{}` values, whose lists panicked a v1.36.2 server.
- Every operation is conditional on the pod not already being as wanted, so that a re-run (the API server
  re-runs policies after the built-in plugins re-ran) changes nothing: the mutation is idempotent.
- Every condition and path is computed from the pod as received (`object`), as the webhook computes its
  patch from the review: operations on a list append at its end or change elements in place, and the
  few removals (the derived fields) come last, so the original indexes stay right.
- The template merge (sparkgate/mutation/merge.py) is unrolled over the template, which is known here:
  a field the pod lacks is added whole, a map is merged key by key, a list with a merge key is merged by
  that key (into the last element of a name, as the webhook's index keeps the last) and other lists by
  value; Spark's container is `variables.spark` (sparkgate.contract.spark_container_index).
- The derived fields (sparkgate/mutation/derived.py, RULES) are dropped under the same conditions.

Pure functions of the policy; no state.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from sparkgate import cel, contract
from sparkgate.cel import NO_OPS, Expr, Pointer, concat, has, literal, ops, patch, quote, when
from sparkgate.mutation import DEFAULT_SCHEDULER
from sparkgate.mutation.derived import (
    NOT_READY,
    RULES,
    TOKEN_VOLUME_PREFIX,
    UNREACHABLE,
    covers,
    default_toleration,
)
from sparkgate.mutation.merge import SPARK_CONTAINER, list_key
from sparkgate.policy import ALWAYS_EXCLUDED, Policy, PolicyError, Profile
from sparkgate.probe import MATCH_CONDITION

API_VERSION = "admissionregistration.k8s.io/v1"
POLICY_NAME = "sparkgate"  # the MutatingAdmissionPolicy and its binding
MANAGED_LABEL = {contract.LABEL_MANAGED_BY: contract.MANAGED_BY}
# cel-go's parser refuses an expression longer than this many code points (parser.go, the default
# ExpressionSizeCodePointLimit, which kube-apiserver does not change).
EXPRESSION_SIZE_LIMIT = 100_000
MAX_BRANCH_CHARACTERS = 60_000  # one mutation's profiles together, leaving room for the rest
PROFILES_PER_MUTATION = 8  # each profile nests one conditional deeper; cel-go's parser stops at 250 levels
# etcd's default --max-request-bytes (1.5 MiB): the largest object the API server can store.
MAX_OBJECT_BYTES = 1_572_864
DERIVED_RULES_RENDERED = ("Priority", "RuntimeClass", "ServiceAccount", "DefaultTolerationSeconds")

POD = "object"
SPEC = "object.spec"
LABELS = "object.metadata.labels"
ANNOTATIONS = "object.metadata.annotations"
APP_ID = f"{LABELS}[{quote(contract.LABEL_APP_ID)}]"
# A namespace's name (a DNS-1123 label), which is also a valid label value for the namespaceSelector.
_NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class RenderError(PolicyError):
    """A policy that cannot be rendered or whose rendering exceeds a limit; one "place: problem" line each."""


@dataclass(frozen=True)
class Rendering:
    objects: list[dict[str, Any]]  # the MutatingAdmissionPolicy, then its binding
    costs: dict[str, int] = field(default_factory=dict)  # worst-case cost of each expression, by its place

    @property
    def total_cost(self) -> int:
        return sum(self.costs.values())

    @property
    def size(self) -> int:
        return len(json.dumps(self.objects[0], separators=(",", ":")))


def render(policy: Policy, install_namespace: str = contract.INSTALL_NAMESPACE) -> Rendering:
    """The policy and binding for `policy`, or RenderError saying what cannot be rendered or is too big."""
    errors = [f"profiles[{i}] ({p.name}): {e}" for i, p in enumerate(policy.profiles) for e in _refused(p)]
    if errors:
        raise RenderError(errors)
    exact, guard = _exclusions(policy, install_namespace)
    mutations, positions = _mutations(policy)
    # No matchConditions: kube-apiserver converts the whole pod to CEL values for them on each admission and
    # again on the reinvocation pass (dispatcher.go evaluates them before it asks whether to reinvoke), which
    # cost more than the mutation's own CEL; the selectors and a guard on each mutation decide the same.
    mutations = [when(guard, m) for m in mutations]
    variables = {**_variables(policy), **positions}
    costs = {f"variables[{name}]": v.cost for name, v in variables.items()}
    costs.update({f"mutations[{i}]": m.cost for i, m in enumerate(mutations)})
    spec: dict[str, Any] = {
        "paramKind": None,
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["pods"],
                    "scope": "Namespaced",
                }
            ],
            "objectSelector": {
                "matchLabels": {contract.LABEL_ROLE: contract.ROLE_EXECUTOR},
                "matchExpressions": [{"key": contract.LABEL_APP_ID, "operator": "Exists"}],
            },
            "namespaceSelector": {
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": exact}
                ]
            },
            "matchPolicy": "Equivalent",
        },
        "variables": [{"name": n, "expression": v.text} for n, v in variables.items()],
        "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": m.text}} for m in mutations],
        "failurePolicy": "Ignore",
        # As the webhook's configuration: the API server re-runs its own plugins after the policy changed
        # the pod, and they need nothing more from it; re-running the policy would double its cost.
        "reinvocationPolicy": "Never",
    }
    del spec["paramKind"]
    meta = {
        "name": POLICY_NAME,
        "labels": dict(MANAGED_LABEL),
        "annotations": {"sparkgate.io/policy-digest": policy.digest},
    }
    rendered = Rendering(
        [
            {"apiVersion": API_VERSION, "kind": "MutatingAdmissionPolicy", "metadata": meta, "spec": spec},
            {
                "apiVersion": API_VERSION,
                "kind": "MutatingAdmissionPolicyBinding",
                "metadata": {"name": POLICY_NAME, "labels": dict(MANAGED_LABEL)},
                "spec": {"policyName": POLICY_NAME},
            },
        ],
        costs,
    )
    limits = check_limits(rendered)
    if limits:
        raise RenderError(limits)
    return rendered


def _mutations(policy: Policy) -> tuple[list[Expr], dict[str, Expr]]:
    """The profiles' branches, a few profiles per mutation so that each expression stays within cel-go's
    parser limits (EXPRESSION_SIZE_LIMIT code points, nesting depth), the `none` branch and the gate in the
    last one; and the variables the branches read (`_ProfileOps.positions`).

    The API server runs a policy's mutations in order, each on the previous one's result, and re-evaluates
    the variables for each: the mutation holding the chosen profile applies it to the pod as received
    (the ones before change nothing), and the ones after it pick the same profile again (the pod now names
    it in `sparkgate.io/profile`), which none of their branches is. A branch never touches the scheduling
    gates (a template may not set them), so the gate's operations, computed from the pod as received, still
    hold after the branch's: a policy of up to PROFILES_PER_MUTATION profiles is one mutation, and the API
    server converts, patches and defaults the pod once (each mutation is a JSON round trip of the pod)."""
    chunks: list[list[tuple[str, Expr]]] = [[]]
    positions: dict[str, Expr] = {}
    size = 0
    for i, p in enumerate(policy.profiles):
        ops = _ProfileOps(p, f"p{i}")
        branch = ops.render()
        positions.update(ops.positions)
        if len(branch.text) > MAX_BRANCH_CHARACTERS:
            raise RenderError(
                [
                    f"profile {p.name}: its operations take {len(branch.text):,} characters of CEL, above the "
                    f"{MAX_BRANCH_CHARACTERS:,} that keep one mutation within cel-go's limit of "
                    f"{EXPRESSION_SIZE_LIMIT:,} code points per expression"
                ]
            )
        if chunks[-1] and (
            size + len(branch.text) > MAX_BRANCH_CHARACTERS or len(chunks[-1]) >= PROFILES_PER_MUTATION
        ):
            chunks.append([])
            size = 0
        chunks[-1].append((p.name, branch))
        size += len(branch.text)
    none = _metadata_ops({contract.ANNOTATION_PROFILE: (contract.NO_PROFILE, False)}, {})
    last = concat([when(Expr(f"variables.profile == {quote(contract.NO_PROFILE)}", 2), none), _gate()])
    out = []
    for chunk in chunks:
        mutation = NO_OPS
        for name, branch in reversed(chunk):
            mutation = when(Expr(f"variables.profile == {quote(name)}", 2), branch, mutation)
        if mutation is not NO_OPS:
            out.append(mutation)
    return [*out[:-1], concat([*out[-1:], last])], positions


def check_limits(rendered: Rendering) -> list[str]:
    """The API server's limits that the rendering would break (each with the limit's source)."""
    out = [
        f"{place}: a CEL cost of up to {cost:,} on an executor pod within the assumed bounds is above the API "
        f"server's per-expression limit of {cel.PER_CALL_LIMIT:,} (PerCallLimit, apis/cel/config.go)"
        for place, cost in rendered.costs.items()
        if cost > cel.PER_CALL_LIMIT
    ]
    if rendered.total_cost > cel.RUNTIME_BUDGET:
        out.append(
            f"the policy's expressions cost up to {rendered.total_cost:,} together, above the API server's "
            f"budget of {cel.RUNTIME_BUDGET:,} per policy evaluation (RuntimeCELCostBudget, apis/cel/config.go)"
        )
    spec = rendered.objects[0]["spec"]
    expressions = {
        **{f"variables[{v['name']}]": v["expression"] for v in spec["variables"]},
        **{f"mutations[{i}]": m["jsonPatch"]["expression"] for i, m in enumerate(spec["mutations"])},
    }
    out += [
        f"{place}: {len(text):,} code points, above cel-go's limit of {EXPRESSION_SIZE_LIMIT:,} per expression"
        for place, text in expressions.items()
        if len(text) > EXPRESSION_SIZE_LIMIT
    ]
    if rendered.size > MAX_OBJECT_BYTES:
        out.append(
            f"the MutatingAdmissionPolicy is {rendered.size:,} bytes, above the {MAX_OBJECT_BYTES:,} bytes that "
            "etcd stores by default (--max-request-bytes)"
        )
    return out


def _refused(profile: Profile) -> list[str]:
    """Overrides that replace Spark's own container or the whole spec: a patch computed from the pod as
    received cannot address what they leave, and they break the executor anyway."""
    out = []
    for path in profile.overrides:
        if path in (("spec",), ("spec", "containers"), ("spec", "containers", f"[{SPARK_CONTAINER}]")):
            out.append(
                f"overrides: {_path_text(path)} replaces Spark's own container; the admission-policy mode "
                "does not render it (name the fields to override instead)"
            )
    return out


def position(items: str, var: str, test: str, *, last: bool = False) -> str:
    """CEL for the index of the first (or last) element of the list `items` for which `test` (over `var`)
    holds, -1 if none. Written with the strings extension (`map` to "1"/"0", `join`, `indexOf`), which
    kube-apiserver and kubesim both have; the lists library's `indexOf` is not in kubesim."""
    find = "lastIndexOf" if last else "indexOf"
    return f'{items}.map({var}, {test} ? "1" : "0").join().{find}("1")'


def _path_text(path: tuple[str, ...]) -> str:
    """A parsed field path as the policy writes it: `spec.containers[NAME].resources`."""
    return "".join(s if s.startswith("[") else f".{s}" for s in path).lstrip(".")


def _exclusions(policy: Policy, install_namespace: str) -> tuple[list[str], Expr]:
    """What the webhook's configuration and `Policy.excluded` leave out, split between the selectors, which
    the API server checks before any CEL, and a guard for the rest: the excluded namespaces named exactly
    (the namespaceSelector's NotIn), and in CEL an empty application id (the objectSelector only says the
    label exists), the namespaces excluded by a pattern, and the policy probe's dry runs (probe.py)."""
    exact = {*ALWAYS_EXCLUDED, install_namespace}
    patterns = []
    for g in policy.excluded_namespaces:
        if _NAMESPACE_NAME.fullmatch(g):
            exact.add(g)
        else:
            patterns.append(cel.glob("request.namespace", g))
    tests = [Expr(f'{APP_ID} != ""', 2)]
    if patterns:
        tests.append(
            Expr("!(" + " || ".join(m.text for m in patterns) + ")", sum(m.cost for m in patterns) + 1)
        )
    tests.append(Expr(MATCH_CONDITION["expression"], 8))
    return sorted(exact), Expr(" && ".join(t.text for t in tests), sum(t.cost for t in tests))


def _variables(policy: Policy) -> dict[str, Expr]:
    """Named expressions, each evaluated at most once per pod and only when used."""
    requested = Expr(
        f"{has(POD + '.metadata', 'annotations')} && {has(ANNOTATIONS, contract.ANNOTATION_PROFILE)} ? "
        f'{ANNOTATIONS}[{quote(contract.ANNOTATION_PROFILE)}] : ""',
        4,
    )
    # Flat lists of tests rather than a chain of conditionals, whose nesting would grow with the profiles
    # (cel-go's parser stops at 250 levels): the first profile whose test holds, by its index.
    names = literal([p.name for p in policy.profiles])
    chosen, matching, cost = [], [], 0
    for p in policy.profiles:
        ns = _namespace_allowed(p)
        labels = [
            f"{has(LABELS, k)} && {LABELS}[{quote(k)}] == {quote(v)}" for k, v in p.match.labels.items()
        ]
        chosen.append(
            f"variables.requested == {quote(p.name)}" + ("" if ns.text == "true" else f" && ({ns.text})")
        )
        matching.append(" && ".join([*([f"({ns.text})"] if ns.text != "true" else []), *labels]) or "true")
        cost += 2 * ns.cost + 3 * len(labels) + 8
    # Most executors name no profile: no list of tests to build for them.
    requested_index = Expr(
        'variables.requested == "" ? -1 : '
        + position("[" + ", ".join(f"({t})" for t in chosen) + "]", "m", "m"),
        cost + 3,
    )
    match_index = Expr(position("[" + ", ".join(f"({t})" for t in matching) + "]", "m", "m"), cost)
    none = quote(contract.NO_PROFILE)
    choice = (
        Expr(
            f"variables.requestedIndex >= 0 ? {names}[variables.requestedIndex] : "
            f"variables.matchIndex >= 0 ? {names}[variables.matchIndex] : {none}",
            6,
        )
        if policy.profiles
        else Expr(none, 0)
    )
    by_env = position(
        f"{SPEC}.containers",
        "c",
        f"has(c.env) && c.env.exists(e, e.name == {quote(contract.SPARK_CONTAINER_ENV)})",
    )
    by_name = position(f"{SPEC}.containers", "c", f"c.name == {quote(contract.SPARK_CONTAINER_NAME)}")
    n_containers, n_env = cel.bound("containers"), cel.bound("env")
    token = (
        f"{has(SPEC, 'volumes')} ? "
        + position(
            f"{SPEC}.volumes", "v", f"v.name.startsWith({quote(TOKEN_VOLUME_PREFIX)}) && has(v.projected)"
        )
        + " : -1"
    )
    return {
        "requested": requested,
        **({"requestedIndex": requested_index, "matchIndex": match_index} if policy.profiles else {}),
        "profile": choice,
        "sparkByEnv": Expr(by_env, n_containers * (n_env * 3 + 3) + n_containers),
        "sparkByName": Expr(by_name, n_containers * 3 + n_containers),
        # A pod of one container (Spark's own, without a template) needs no search: it is that one.
        "spark": Expr(
            f"size({SPEC}.containers) == 1 ? 0 : variables.sparkByEnv >= 0 ? variables.sparkByEnv : "
            "variables.sparkByName >= 0 ? variables.sparkByName : 0",
            8,
        ),
        "sparkContainer": Expr(f"{SPEC}.containers[variables.spark]", 3),
        "tokenVolume": Expr(token, cel.bound("volumes") * 4 + cel.bound("volumes")),
        "tokenName": Expr(f"{SPEC}.volumes[variables.tokenVolume].name", 3),
    }


def _namespace_allowed(p: Profile) -> Expr:
    if not p.match.namespaces:
        return Expr("true", 0)
    matches = [cel.glob("request.namespace", g) for g in p.match.namespaces]
    return Expr(" || ".join(m.text for m in matches), sum(m.cost for m in matches))


def _gate() -> Expr:
    gate = literal({"name": contract.GATE})
    gates = Pointer(("spec", "schedulingGates"))
    present = Expr(
        f"{SPEC}.schedulingGates.exists(g, has(g.name) && g.name == {quote(contract.GATE)})", 4 * 16
    )
    return when(
        Expr(has(SPEC, "schedulingGates"), 0),
        when(present, NO_OPS, ops(patch("add", gates.append(), gate, 2))),
        ops(patch("add", gates, f"[{gate}]", 3)),
    )


def _metadata_ops(annotations: dict[str, tuple[str, bool]], labels: dict[str, tuple[str, bool]]) -> Expr:
    """Set each key to its value (value, only_if_absent); the annotations map is created whole if absent."""
    anns = _key_ops(ANNOTATIONS, Pointer(("metadata", "annotations")), annotations)
    whole = ops(
        patch(
            "add",
            Pointer(("metadata", "annotations")),
            literal({k: v for k, (v, _) in annotations.items()}),
            len(annotations),
        )
    )
    return concat(
        [
            _key_ops(LABELS, Pointer(("metadata", "labels")), labels),
            when(Expr(has(POD + ".metadata", "annotations"), 0), anns, whole),
        ]
    )


def _key_ops(ref: str, at: Pointer, wanted: dict[str, tuple[str, bool]]) -> Expr:
    chunks = []
    for key, (value, only_if_absent) in wanted.items():
        absent = f"!({has(ref, key)})"
        test = absent if only_if_absent else f"{absent} || {ref}[{quote(key)}] != {quote(value)}"
        chunks.append(when(Expr(test, 3), ops(patch("add", at.key(key), quote(value), 1))))
    return concat(chunks)


@dataclass(frozen=True)
class _Here:
    """A place in the pod: its JSON Pointer, the CEL that reads it, and what reading it costs."""

    ptr: Pointer
    ref: str
    cost: int = 1

    def key(self, key: str) -> _Here:
        return _Here(self.ptr.key(key), cel.field(self.ref, key), self.cost + 1)

    def index(self, index: Expr) -> _Here:
        return _Here(self.ptr.index(index), f"{self.ref}[{index.text}]", self.cost + index.cost + 1)


# Spark's container: written at its index, read through a variable (one resolution of the path per pod).
SPARK = _Here(
    Pointer(("spec", "containers")).index(Expr("variables.spark", 1)), "variables.sparkContainer", 2
)


class _ProfileOps:
    """The operations of one profile's branch, in the webhook's order (sparkgate/mutation/__init__.py,
    desired_pod): labels and annotations, the template merge, the derived fields, config maps, the
    scheduler name. The gate is common to every branch."""

    def __init__(self, profile: Profile, prefix: str) -> None:
        self.profile = profile
        self.prefix = prefix
        # Variables of what the branch reads more than once (the elements of a name in a list merged by its
        # key, and their position): computed once per mutation, and only when read (variables are lazy).
        self.positions: dict[str, Expr] = {}
        self.overrides = frozenset(profile.overrides)
        self.template = profile.template
        self.tspec: dict[str, Any] = dict(self.template.get("spec") or {})

    def render(self) -> Expr:
        return concat(
            [
                self._metadata(),
                self._merge_map(self.tspec, _Here(Pointer(("spec",)), SPEC), ("spec",)),
                self._derived(),
                self._config_maps(),
                self._scheduler_name(),
            ]
        )

    # --- metadata (mutation._fill, then the profile's labels and annotations, Spark's labels kept) ---

    def _metadata(self) -> Expr:
        meta = self.template.get("metadata") or {}
        labels = self._filled(meta.get("labels") or {}, ("metadata", "labels"), contract.SPARK_LABELS)
        labels.update({k: (v, False) for k, v in self.profile.labels.items()})
        annotations = self._filled(meta.get("annotations") or {}, ("metadata", "annotations"), frozenset())
        annotations.update({k: (v, False) for k, v in self.profile.annotations.items()})
        annotations[contract.ANNOTATION_PROFILE] = (self.profile.name, False)
        return _metadata_ops(annotations, labels)

    def _filled(
        self, template: dict[str, str], at: tuple[str, ...], kept: frozenset[str]
    ) -> dict[str, tuple[str, bool]]:
        return {
            k: (v, k in kept or not (at in self.overrides or (*at, k) in self.overrides))
            for k, v in template.items()
        }

    # --- the template merge (sparkgate/mutation/merge.py) ---

    def _merge(self, template: Any, here: _Here, path: tuple[str, ...]) -> Expr:
        """The pod's value at `here` exists; merge `template` into it."""
        if path in self.overrides:
            differs = Expr(f"{here.ref} != {literal(template)}", here.cost + cel.size(template))
            return when(differs, ops(patch("replace", here.ptr, literal(template), cel.size(template))))
        if isinstance(template, dict):
            return self._merge_map(template, here, path)
        if isinstance(template, list):
            return self._merge_list(template, here, path)
        return NO_OPS

    def _merge_map(self, template: dict[str, Any], here: _Here, path: tuple[str, ...]) -> Expr:
        chunks = []
        for key, value in template.items():
            child, child_path = here.key(key), (*path, key)
            add = ops(patch("add", child.ptr, literal(value), cel.size(value)))
            absent = f"!({has(here.ref, key)})"
            if child_path in self.overrides:
                test = Expr(f"{absent} || {child.ref} != {literal(value)}", child.cost + cel.size(value))
                chunks.append(when(test, add))
            else:
                chunks.append(when(Expr(absent, here.cost), add, self._merge(value, child, child_path)))
        return concat(chunks)

    def _merge_list(self, template: list[Any], here: _Here, path: tuple[str, ...]) -> Expr:
        name_of = list_key(path[-1])
        n = cel.bound(path[-1])
        var = f"x{len(path)}"
        chunks: list[Expr] = []
        if name_of is None:
            seen: list[Any] = []
            for value in template:
                if value in seen:
                    continue
                seen.append(value)
                found = Expr(
                    f"{here.ref}.exists({var}, {var} == {literal(value)})",
                    here.cost + n * (cel.size(value) + 2),
                )
                chunks.append(
                    when(found, NO_OPS, ops(patch("add", here.ptr.append(), literal(value), cel.size(value))))
                )
            return concat(chunks)
        for value in template:
            append = ops(patch("add", here.ptr.append(), literal(value), cel.size(value)))
            name = value.get(name_of) if isinstance(value, dict) else None
            if name is None:
                chunks.append(append)
                continue
            if path == ("spec", "containers") and name == SPARK_CONTAINER:
                found = Expr(f"size({here.ref}) > 0", here.cost + 2)
                element = SPARK
            else:
                # Read through the elements of that name (a filter, one list of references), and find the
                # last one's index only for a write: a string per element (`position`) cost the example
                # policy's executor more than all its other CEL (docs/performance.md). The last element of
                # the list is tried first: where it has the name it is the one merged, with no scan.
                def key_test(x: str, name: Any = name, name_of: str = name_of) -> str:
                    return f"{has(x, name_of)} && {cel.field(x, name_of)} == {literal(name)}"

                last = f"{here.ref}[size({here.ref}) - 1]"
                is_last = f"size({here.ref}) > 0 && {key_test(last)}"
                named = self._variable(
                    "e",
                    Expr(
                        f"{is_last} ? [{last}] : {here.ref}.filter({var}, {key_test(var)})",
                        3 * here.cost + 8 + n * 6,
                    ),
                )
                index = self._variable(
                    "i",
                    Expr(
                        f"{is_last} ? size({here.ref}) - 1 : {position(here.ref, var, key_test(var), last=True)}",
                        3 * here.cost + 8 + n * 20,
                    ),
                )
                found = Expr(f"size({named.text}) > 0", named.cost + 1)
                element = _Here(
                    here.ptr.index(index), f"{named.text}[size({named.text}) - 1]", named.cost + 3
                )
            chunks.append(when(found, self._merge(value, element, (*path, f"[{name}]")), append))
        return concat(chunks)

    def _variable(self, kind: str, value: Expr) -> Expr:
        name = f"{self.prefix}{kind}{len(self.positions)}"
        self.positions[name] = value
        return Expr(f"variables.{name}", 2)

    # --- the derived fields (sparkgate/mutation/derived.py) ---

    def _changed(self, *fields: str) -> Expr | None:
        """Whether the merge changes any of these spec fields (scalars: the pod wins unless overridden)."""
        tests = []
        for name in fields:
            if name not in self.tspec:
                continue
            absent = f"!({has(SPEC, name)})"
            if ("spec", name) in self.overrides:
                tests.append(f"{absent} || {cel.field(SPEC, name)} != {literal(self.tspec[name])}")
            else:
                tests.append(absent)
        if not tests:
            return None
        return Expr(" || ".join(f"({t})" for t in tests), 3 * len(tests))

    def _remove_if_present(self, *fields: str) -> Expr:
        return concat(when(Expr(has(SPEC, f), 0), ops(patch("remove", Pointer(("spec", f))))) for f in fields)

    def _derived(self) -> Expr:
        chunks = []
        for rule in RULES:
            if rule.plugin == "DefaultTolerationSeconds":
                continue  # both keys at once below: their removals must go in descending index order
            changed = self._changed(*rule.sources)
            if changed is None:
                continue
            if rule.plugin == "Priority":
                chunks.append(when(changed, self._remove_if_present("priority", "preemptionPolicy")))
            elif rule.plugin == "RuntimeClass":
                chunks.append(when(changed, self._remove_if_present("overhead")))
            elif rule.plugin == "ServiceAccount":
                chunks.append(
                    when(changed, concat([self._remove_if_present("serviceAccount"), self._token()]))
                )
            else:  # pragma: no cover - tests/sparkgate/test_render.py checks every rule is rendered
                raise AssertionError(f"derived rule {rule.plugin} has no rendering")
        chunks.append(self._default_tolerations())
        return concat(chunks)

    def _token(self) -> Expr:
        """The projected token volume and its mounts (the first such volume: the plugin adds one)."""
        if ("spec", "volumes") in self.overrides:
            return NO_OPS
        chunks = []
        for key in ("initContainers", "containers"):
            if ("spec", key) in self.overrides:
                continue
            keep = [f"c.name != {quote(n)}" for n in self._replaced_elements(key)]
            if key == "containers" and self._replaced_spark_mounts():
                keep.append(f"{position(f'{SPEC}.containers', 'n', 'n.name == c.name')} != variables.spark")
            mounted = "has(c.volumeMounts) && c.volumeMounts.exists(m, m.name == variables.tokenName)"
            index = position(f"{SPEC}.{key}", "n", "n.name == c.name")
            mount = position("c.volumeMounts", "m", "m.name == variables.tokenName")
            remove = (
                f'JSONPatch{{op: "remove", path: "/spec/{key}/" + string({index}) + "/volumeMounts/" + '
                f"string({mount})}}"
            )
            n = cel.bound(key)
            chunks.append(
                Expr(
                    f"{has(SPEC, key)} ? {SPEC}.{key}.filter(c, {' && '.join([*keep, mounted])}).map(c, {remove}) : []",
                    n * (cel.bound("volumeMounts") * 3 + 4) + n * (n + cel.bound("volumeMounts") * 2 + 6),
                )
            )
        chunks.append(
            ops(patch("remove", Pointer(("spec", "volumes")).index(Expr("variables.tokenVolume", 1))))
        )
        return when(Expr("variables.tokenVolume >= 0", 1 + cel.bound("volumes") * 5), concat(chunks))

    def _replaced_elements(self, key: str) -> list[str]:
        """Elements of spec.<key> that an override replaces whole, or whose volumeMounts it replaces."""
        out = []
        for value in self.tspec.get(key) or ():
            name = value.get("name") if isinstance(value, dict) else None
            if name is None or name == SPARK_CONTAINER:
                continue
            element = ("spec", key, f"[{name}]")
            if element in self.overrides or (*element, "volumeMounts") in self.overrides:
                out.append(name)
        return out

    def _replaced_spark_mounts(self) -> bool:
        return ("spec", "containers", f"[{SPARK_CONTAINER}]", "volumeMounts") in self.overrides

    def _default_tolerations(self) -> Expr:
        """DefaultTolerationSeconds' toleration of a key goes when the template adds one covering it."""
        template = self.tspec.get("tolerations")
        if not isinstance(template, list):
            return NO_OPS
        stale: dict[str, Expr] = {}
        tols = f"{SPEC}.tolerations"
        for key in (NOT_READY, UNREACHABLE):
            covering = [v for i, v in enumerate(template) if covers(v, key) and v not in template[:i]]
            if not covering:
                continue
            default = literal(default_toleration(key))
            added = " || ".join(f"!{tols}.exists(t, t == {literal(v)})" for v in covering)
            stale[key] = Expr(
                f"{has(SPEC, 'tolerations')} && {tols}.exists(t, t == {default}) && ({added})",
                cel.bound("tolerations") * 8 * (len(covering) + 1),
            )
        if not stale:
            return NO_OPS
        at = Pointer(("spec", "tolerations"))
        if ("spec", "tolerations") in self.overrides:
            # The merge wrote the template's list; without the stale defaults when they are in it.
            relevant = [k for k in stale if default_toleration(k) in template]
            out = NO_OPS
            for subset in sorted(_subsets(relevant), key=len):
                dropped = [default_toleration(k) for k in subset]
                kept = [t for t in template if t not in dropped]
                test = Expr(
                    " && ".join(f"({stale[k].text})" for k in subset), sum(stale[k].cost for k in subset)
                )
                out = when(test, ops(patch("add", at, literal(kept), cel.size(kept))), out)
            return out
        index = {
            k: Expr(
                position(tols, "t", f"t == {literal(default_toleration(k))}"), 10 * cel.bound("tolerations")
            )
            for k in stale
        }
        removals = {k: ops(patch("remove", at.index(index[k]))) for k in stale}
        if len(stale) == 1:
            ((key, test),) = stale.items()
            return when(test, removals[key])
        a, b = stale[NOT_READY], stale[UNREACHABLE]
        ra, rb = removals[NOT_READY], removals[UNREACHABLE]
        both = when(
            Expr(f"{index[NOT_READY].text} > {index[UNREACHABLE].text}", 2 * 8 * 64),
            concat([ra, rb]),
            concat([rb, ra]),
        )
        return when(Expr(f"({a.text}) && ({b.text})", a.cost + b.cost), both, when(a, ra, when(b, rb)))

    # --- config maps (mutation._mount_config_maps) and the scheduler (mutation._scheduler_name) ---

    def _config_maps(self) -> Expr:
        if not self.profile.config_maps:
            return NO_OPS
        digest_names = {cm.source: contract.source_digest(cm.source) for cm in self.profile.config_maps}
        plain = Expr(
            f"{APP_ID}.matches({quote(contract.PLAIN_APP_ID.pattern)}) && size({APP_ID}) <= {contract.PLAIN_APP_ID_MAX}",
            2 + cel.STRING_BOUND,
        )
        volumes = Pointer(("spec", "volumes"))
        template_volumes = self.tspec.get("volumes")
        replaced = ("spec", "volumes") in self.overrides
        static_names = {v.get("name") for v in template_volumes or () if isinstance(v, dict)}

        def volume(source: str) -> str:
            copy = f'"sg-" + {APP_ID} + "-{digest_names[source]}"'
            return f'{{"name": dyn({quote(contract.configmap_volume_name(source))}), "configMap": dyn({{"name": {copy}}})}}'

        def missing(source: str) -> Expr:
            name = contract.configmap_volume_name(source)
            if name in static_names:
                return Expr("false", 0)
            if replaced:
                return Expr("true", 0)
            return Expr(
                f"!({has(SPEC, 'volumes')} && {SPEC}.volumes.exists(v, v.name == {quote(name)}))",
                cel.bound("volumes") * 3,
            )

        appends = concat(
            when(missing(cm.source), ops(patch("add", volumes.append(), volume(cm.source), 4)))
            for cm in self.profile.config_maps
        )
        if template_volumes is not None:
            vol_ops = appends
        else:
            whole = ops(
                patch(
                    "add",
                    volumes,
                    "[" + ", ".join(volume(cm.source) for cm in self.profile.config_maps) + "]",
                    4,
                )
            )
            vol_ops = when(Expr(has(SPEC, "volumes"), 0), appends, whole)
        return when(plain, concat([vol_ops, self._mounts()]))

    def _mounts(self) -> Expr:
        spark_template = next(
            (
                c
                for c in self.tspec.get("containers") or ()
                if isinstance(c, dict) and c.get("name") == SPARK_CONTAINER
            ),
            None,
        )
        template_mounts = spark_template.get("volumeMounts") if spark_template is not None else None
        static_paths = {m.get("mountPath") for m in template_mounts or () if isinstance(m, dict)}
        replaced = self._replaced_spark_mounts()
        container = SPARK
        mounts = container.key("volumeMounts")
        chunks = []
        whole = []
        for cm in self.profile.config_maps:
            mount = {
                "name": contract.configmap_volume_name(cm.source),
                "mountPath": cm.mount_path,
                "readOnly": True,
            }
            if cm.mount_path in static_paths:
                continue
            add = ops(patch("add", mounts.ptr.append(), literal(mount), 4))
            whole.append(mount)
            if replaced:
                chunks.append(add)
            else:
                test = Expr(
                    f"!({has(container.ref, 'volumeMounts')} && {mounts.ref}.exists(m, m.mountPath == {quote(cm.mount_path)}))",
                    cel.bound("volumeMounts") * 3,
                )
                chunks.append(when(test, add))
        appends = concat(chunks)
        if template_mounts is not None or not whole:
            return appends
        return when(
            Expr(has(container.ref, "volumeMounts"), container.cost),
            appends,
            ops(patch("add", mounts.ptr, literal(whole), 4 * len(whole))),
        )

    def _scheduler_name(self) -> Expr:
        name = self.profile.scheduling.scheduler_name
        if name is None:
            return NO_OPS
        default = ("", DEFAULT_SCHEDULER)
        current = f"{SPEC}.schedulerName"
        in_default = f"{current} in {literal(list(default))}"
        if "schedulerName" in self.tspec:
            templated = self.tspec["schedulerName"] in default
            if ("spec", "schedulerName") in self.overrides:
                test = Expr("true" if templated else "false", 0)
            else:
                test = Expr(
                    f"{has(SPEC, 'schedulerName')} ? {in_default} : {'true' if templated else 'false'}", 3
                )
        else:
            test = Expr(f"!({has(SPEC, 'schedulerName')}) || {in_default}", 3)
        if test.text == "false":
            return NO_OPS
        return when(test, ops(patch("add", Pointer(("spec", "schedulerName")), quote(name), 1)))


def _subsets(keys: list[str]) -> list[tuple[str, ...]]:
    """The non-empty subsets of `keys`."""
    return [tuple(k for i, k in enumerate(keys) if mask >> i & 1) for mask in range(1, 1 << len(keys))]
