"""RBAC grants exactly what sparkgate's code calls: no more, no less.

Every Kubernetes call goes through sparkgate/kube.py's `Kube` (`get/list/watch/create/replace/patch/delete`
or `request(METHOD, path)`). This test reads allocator/*.py and certs/*.py with `ast` and derives, for
each call, the verb and the path template: a literal or f-string path, a `self.<attr>` assigned an f-string,
a method or module function returning one, or a module constant; a `Reflector(kube, name, path, ...)`
(sparkgate/kube.py) lists and watches its path. A call whose path it cannot derive fails the test, so new
code keeps its paths readable. sparkgate/probe.py, sparkgate/leader.py and sparkgate/events.py, which the
allocator runs, are read too. The union is compared with the rendered ClusterRole and Role, rule by rule
and verb by verb.
Then certs sync really runs on kubesim as the allocator's service account, and every request it made must
be allowed by the same rules (resourceNames included).
"""

from __future__ import annotations

import ast
import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from certs.plan import Lifetimes
from certs.sync import Target, sync_once
from kubesim.cluster import Cluster
from sparkgate import contract
from sparkgate.cli import main
from sparkgate.contract import GATE
from sparkgate.kube import Kube
from sparkgate.leader import LeaderElector

REPO = Path(__file__).resolve().parents[2]
Obj = dict[str, Any]
METHODS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
CALLS = {"get", "list", "watch", "create", "replace", "patch", "delete", "request"}


@dataclass(frozen=True)
class Use:
    group: str
    resource: str
    verb: str
    where: str
    named: bool = False  # the path names one object (a rule limited by name may allow it: checked live)


def template(node: ast.expr, module: _Module) -> str | None:
    """The path an expression builds, with `{}` for every value only known at run time."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                assert isinstance(value, ast.FormattedValue)
                inner = template(value.value, module) if parts == [] else None
                parts.append(inner if inner is not None else "{}")
        return "".join(parts)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return module.attributes.get(node.attr)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args:
        return module.returns.get(node.func.attr)
    if isinstance(node, ast.Name):
        return module.constants.get(node.id)
    return None


class _Module:
    def __init__(self, tree: ast.Module) -> None:
        self.attributes: dict[str, str] = {}
        self.returns: dict[str, str] = {}
        self.constants: dict[str, str] = {}
        for statement in tree.body:
            if isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name):
                found = template(statement.value, self)
                if found is not None:
                    self.constants[statement.targets[0].id] = found
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
                target = node.targets[0]
                if isinstance(target.value, ast.Name) and target.value.id == "self":
                    found = template(node.value, self)
                    if found is not None and found.startswith("/api"):
                        self.attributes[target.attr] = found
            if isinstance(node, ast.FunctionDef):
                returns = [n for n in ast.walk(node) if isinstance(n, ast.Return) and n.value is not None]
                if len(returns) == 1 and returns[0].value is not None:
                    found = template(returns[0].value, self)
                    if found is not None and found.startswith("/api"):
                        self.returns[node.name] = found


DISCOVERY = re.compile(r"^/apis/[^/{}]+/[^/{}]+$")


def split(path: str) -> tuple[str, str, bool]:
    """(API group, resource, names one object) of a path template."""
    parts = path.split("?")[0].strip("/").split("/")
    group, body = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if body[:1] == ["namespaces"] and len(body) >= 3:
        body = body[2:]
    resource = body[0] + (f"/{body[2]}" if len(body) >= 3 else "")
    return group, resource, len(body) >= 2


def uses_in(path: Path) -> Iterator[Use]:
    tree = ast.parse(path.read_text())
    module = _Module(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        where = f"{path.parent.name}/{path.name}:{node.lineno}"
        func = node.func
        if isinstance(func, ast.Name) and func.id == "Reflector":
            found = template(node.args[2], module)
            assert found is not None, f"{where}: a Reflector path must be a literal"
            group, resource, _ = split(found)
            yield Use(group, resource, "list", where)
            yield Use(group, resource, "watch", where)
            continue
        if not (isinstance(func, ast.Attribute) and func.attr in CALLS):
            continue
        receiver = ast.unparse(func.value)
        if not receiver.endswith("kube"):
            continue
        if func.attr == "request":
            method = node.args[0]
            assert isinstance(method, ast.Constant), f"{where}: the method must be a literal"
            path_node, verb = node.args[1], METHODS.get(str(method.value), "")
        else:
            path_node, verb = node.args[0], {"replace": "update"}.get(func.attr, func.attr)
        found = template(path_node, module)
        if found is None and path.parent.name == "certs":
            continue  # certs builds paths from its Target; its requests are checked live below
        assert found is not None, f"{where}: cannot tell which resource `{ast.unparse(path_node)}` is"
        if verb == "get" and DISCOVERY.match(found):
            continue  # a group version's discovery: every authenticated user's (ClusterRole system:discovery)
        group, resource, named = split(found)
        if verb == "get" and not named:
            verb = "list"
        yield Use(group, resource, verb, where, named)
        if verb == "patch" and applies(node, module):
            # An apply that creates its object is authorized as `create` of that name too (kube-apiserver's
            # staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go, `createAuthorizerAttributes`).
            yield Use(group, resource, "create", where, named)


def applies(call: ast.Call, module: _Module) -> bool:
    """A patch whose content type is server-side apply's."""
    kinds = [k.value for k in call.keywords if k.arg == "content_type"] + call.args[3:4]
    return any(template(kind, module) == "application/apply-patch+yaml" for kind in kinds)


def code_uses() -> list[Use]:
    """allocator/, certs/, and what they run from the core: the policy probe (sparkgate/probe.py), the
    Lease elector (sparkgate/leader.py) and the Event recorder (sparkgate/events.py)."""
    files = [p for d in ("allocator", "certs") for p in sorted((REPO / d).glob("*.py"))]
    core = [REPO / "sparkgate" / n for n in ("probe.py", "leader.py", "events.py")]
    return [u for p in [*files, *core] for u in uses_in(p)]


def rules(rendered: dict[tuple[str, str], Obj]) -> list[Obj]:
    found: list[Obj] = (
        rendered[("ClusterRole", "sparkgate-allocator")]["rules"]
        + rendered[("Role", "sparkgate-allocator")]["rules"]
    )
    return found


def allows(rule: Obj, group: str, resource: str, verb: str, name: str | None = None) -> bool:
    if group not in rule["apiGroups"] or resource not in rule["resources"] or verb not in rule["verbs"]:
        return False
    return "resourceNames" not in rule or (name is not None and name in rule["resourceNames"])


def live_certs_requests(tmp_path: Path) -> list[tuple[str, str, str, str | None]]:
    """(group, resource, verb, name) of every request certs sync and its Lease make on kubesim."""
    with Cluster(nodes=1, workdir=tmp_path) as cluster:
        for kind in ("mutating", "validating"):
            webhook = {
                "name": f"{kind}.sparkgate.io",
                "clientConfig": {"url": "https://127.0.0.1:1/x"},
                "rules": [],
            }
            config = {"metadata": {"name": "sparkgate"}, "webhooks": [webhook]}
            cluster.store.create(f"{kind}webhookconfigurations", config)
        kube = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
        now = dt.datetime.now(dt.UTC)
        elector = LeaderElector(kube, "sparkgate-system", "sparkgate-certs", "pod-a")
        assert elector.try_acquire_or_renew() and elector.try_acquire_or_renew()
        sync_once(kube, Target(), now)
        sync_once(kube, Target(lifetimes=Lifetimes(ca_renew_before=Lifetimes.ca)), now)
        elector.release()
        kube.close()
        found = []
        for entry in cluster.requests.entries():
            if entry.user == contract.ALLOCATOR_USER:
                group = re.match(r"/apis/([^/]+)/", entry.path)
                found.append((group.group(1) if group else "", entry.resource, entry.verb, entry.name))
        return found


def live_admission_policy_requests(tmp_path: Path) -> list[tuple[str, str, str, str | None]]:
    """(group, resource, verb, name) of every request the admission-policy task makes on kubesim, as the
    API server authorizes them: each apply is a `patch` of its name, and one that created its object (201)
    a `create` of that name as well (handlers/patch.go)."""
    from allocator.admission_policy import AdmissionPolicySync
    from sparkgate.policy_file import PolicySource

    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: sparkgate.io/v1alpha1\nkind: Policy\nprofiles:\n  - name: p\n")
    with Cluster(nodes=1, workdir=tmp_path) as cluster:
        kube = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
        sync = AdmissionPolicySync(kube, PolicySource(str(policy), "sparkgate-system"))
        sync.run_once()  # creates both
        sync.run_once()  # applies both again
        kube.close()
        found = []
        for entry in cluster.requests.entries():
            if entry.user == contract.ALLOCATOR_USER:
                group = re.match(r"/apis/([^/]+)/", entry.path)
                request = (group.group(1) if group else "", entry.resource, entry.verb, entry.name)
                found.append(request)
                if entry.verb == "patch" and entry.code == 201:
                    found.append((*request[:2], "create", entry.name))
        return found


def test_the_admission_policy_task_is_allowed_with_its_names(kustomize: ModuleType, tmp_path: Path) -> None:
    install = kustomize.by_kind(kustomize.install([kustomize.ADMISSION_POLICY]))
    requests = live_admission_policy_requests(tmp_path)
    assert {(r, v) for _, r, v, _ in requests} == {
        (r, v)
        for r in ("mutatingadmissionpolicies", "mutatingadmissionpolicybindings")
        for v in ("patch", "create")
    }
    denied = [req for req in requests if not any(allows(rule, *req) for rule in rules(install))]
    assert not denied, denied
    other = ("admissionregistration.k8s.io", "mutatingadmissionpolicies", "create", "another")
    assert not any(allows(rule, *other) for rule in rules(install))  # by name only


# The code only one install runs: the webhook's certificates (certs/, the base install), the rendered
# MutatingAdmissionPolicy (allocator/admission_policy.py, the install without the webhook).
MODE_ONLY = {"webhook": ("certs/",), "policy": ("allocator/admission_policy.py",)}


def mode_uses(mode: str) -> list[Use]:
    other = "policy" if mode == "webhook" else "webhook"
    return [u for u in code_uses() if not u.where.startswith(MODE_ONLY[other])]


@pytest.fixture(scope="module")
def installs(
    kustomize: ModuleType, rendered: dict[tuple[str, str], Obj]
) -> dict[str, dict[tuple[str, str], Obj]]:
    """The base install (the webhook's) and the install without the webhook, by mode."""
    return {"webhook": rendered, "policy": kustomize.by_kind(kustomize.install([kustomize.ADMISSION_POLICY]))}


@pytest.mark.parametrize("mode", ["webhook", "policy"])
def test_every_call_in_the_code_is_granted(
    installs: dict[str, dict[tuple[str, str], Obj]], mode: str
) -> None:
    uses = mode_uses(mode)
    assert {u.resource for u in uses} >= {"pods", "configmaps", "events", "leases"}
    denied = [
        u
        for u in uses
        if not any(
            allows(r, u.group, u.resource, u.verb, *(r.get("resourceNames", [])[:1] if u.named else []))
            for r in rules(installs[mode])
        )
    ]
    assert not denied, denied


@pytest.mark.parametrize("mode", ["webhook", "policy"])
def test_every_grant_is_used_by_the_code(
    installs: dict[str, dict[tuple[str, str], Obj]], mode: str, tmp_path: Path
) -> None:
    """Both ways, per install: the right to write a MutatingAdmissionPolicy (the power to mutate every pod
    it matches) only where the allocator writes one, the certificates' rights only where it makes them."""
    used = {(u.group, u.resource, u.verb) for u in mode_uses(mode)}
    if mode == "webhook":
        used |= {(g, r, v) for g, r, v, _ in live_certs_requests(tmp_path)}
    unused = [
        (group, resource, verb)
        for rule in rules(installs[mode])
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        if (group, resource, verb) not in used
    ]
    assert not unused, f"granted but never called: {unused}"


def test_certs_sync_requests_are_allowed_with_their_names(
    rendered: dict[tuple[str, str], Obj], tmp_path: Path
) -> None:
    requests = live_certs_requests(tmp_path)
    assert {r for _, r, _, _ in requests} == {
        "secrets",
        "leases",
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
    }
    denied = [req for req in requests if not any(allows(rule, *req) for rule in rules(rendered))]
    assert not denied, denied


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('self.kube.patch(f"/api/v1/namespaces/{ns}/pods/{name}", p, "x")', ("", "pods", "patch")),
        ('self.kube.request("POST", f"/api/v1/namespaces/{ns}/events", body=b)', ("", "events", "create")),
        ('kube.get("/api/v1/pods")', ("", "pods", "list")),
        (
            'self.kube.replace(f"/apis/coordination.k8s.io/v1/namespaces/{n}/leases/{x}", b)',
            ("coordination.k8s.io", "leases", "update"),
        ),
        ('Reflector(kube, "x", "/api/v1/configmaps", None, f, g)', ("", "configmaps", "list")),
    ],
)
def test_the_scanner_reads_calls(tmp_path: Path, source: str, expected: tuple[str, str, str]) -> None:
    probe = tmp_path / "allocator" / "probe.py"
    probe.parent.mkdir()
    probe.write_text(source + "\n")
    assert [(u.group, u.resource, u.verb) for u in uses_in(probe)][:1] == [expected]


def test_the_scanner_refuses_paths_it_cannot_read(tmp_path: Path) -> None:
    probe = tmp_path / "allocator" / "probe.py"
    probe.parent.mkdir()
    probe.write_text("self.kube.delete(make_path(x))\n")
    with pytest.raises(AssertionError, match="cannot tell which resource"):
        list(uses_in(probe))


def test_the_break_glass_group_is_granted_exactly_what_sparkgate_release_calls(
    rendered: dict[tuple[str, str], Obj], tmp_path: Path
) -> None:
    """`sparkgate release` in each of its forms, run on kubesim as a member of the group: every request it
    makes is allowed by the shipped ClusterRole bound to that group, and every grant is used."""
    role = rendered[("ClusterRole", "sparkgate-break-glass")]
    binding = rendered[("ClusterRoleBinding", "sparkgate-break-glass")]
    assert binding["roleRef"]["name"] == "sparkgate-break-glass"
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": contract.BREAK_GLASS_GROUP}
    ]
    with Cluster(nodes=1, namespaces=("default", "spark"), workdir=tmp_path) as cluster:
        for i in (1, 2):
            pod = {
                "metadata": {
                    "name": f"app-exec-{i}",
                    "namespace": "spark",
                    "labels": {contract.LABEL_ROLE: contract.ROLE_EXECUTOR, contract.LABEL_APP_ID: "app"},
                },
                "spec": {"containers": [{"name": "c", "image": "i"}], "schedulingGates": [{"name": GATE}]},
            }
            cluster.store.create("pods", pod, namespace="spark")
        config = str(cluster.add_user("ops@example.com", groups=(contract.BREAK_GLASS_GROUP,)))
        for argv in (
            ["-A", "--dry-run"],
            ["-n", "spark", "--app", "app", "--dry-run"],
            ["-n", "spark", "--pod", "app-exec-1"],
            ["-A"],
        ):
            assert main(["release", "--kubeconfig", config, *argv]) == 0
        requests = {(e.resource, e.verb) for e in cluster.requests.entries() if e.user == "ops@example.com"}
    assert requests == {("pods", "list"), ("pods", "get"), ("pods", "patch")}
    assert all(any(allows(rule, "", *request) for rule in role["rules"]) for request in requests)
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert granted == requests and all(rule["apiGroups"] == [""] for rule in role["rules"])


def test_the_impersonator_role_lets_an_admin_act_as_the_break_glass_group_and_nothing_more(
    rendered: dict[tuple[str, str], Obj], tmp_path: Path
) -> None:
    """Where an admin cannot be a member of the group (groups from an identity provider), `sparkgate release
    --as sparkgate-break-glass --as-group sparkgate:break-glass` acts as one: kubesim applies the
    Impersonate-* headers as kube-apiserver does (kubesim/impersonation.py), and the shipped ClusterRole
    allows impersonating exactly that user and that group."""
    role = rendered[("ClusterRole", "sparkgate-break-glass-impersonator")]
    bindings = [o for (kind, _), o in rendered.items() if kind in ("ClusterRoleBinding", "RoleBinding")]
    assert role["metadata"]["name"] not in {b["roleRef"]["name"] for b in bindings}  # bound to nobody
    wanted = {("users", contract.BREAK_GLASS_USER), ("groups", contract.BREAK_GLASS_GROUP)}
    assert all(any(allows(rule, "", r, "impersonate", name) for rule in role["rules"]) for r, name in wanted)
    granted = {
        (r, n, v)
        for rule in role["rules"]
        for r in rule["resources"]
        for n in rule["resourceNames"]
        for v in rule["verbs"]
    }
    assert granted == {(r, n, "impersonate") for r, n in wanted}
    with Cluster(nodes=1, namespaces=("default", "spark"), workdir=tmp_path) as cluster:
        pod = {
            "metadata": {
                "name": "app-exec-1",
                "namespace": "spark",
                "labels": {contract.LABEL_ROLE: contract.ROLE_EXECUTOR, contract.LABEL_APP_ID: "app"},
            },
            "spec": {"containers": [{"name": "c", "image": "i"}], "schedulingGates": [{"name": GATE}]},
        }
        cluster.store.create("pods", pod, namespace="spark")
        config = str(cluster.kubeconfig("admin"))
        act_as = ["--as", contract.BREAK_GLASS_USER, "--as-group", contract.BREAK_GLASS_GROUP]
        assert main(["release", "--kubeconfig", config, "-n", "spark", "--app", "app", *act_as]) == 0
        entries = [e for e in cluster.requests.entries() if e.user == "admin" and e.resource == "pods"]
        [stored] = cluster.store.list_objects("pods")[0]
    assert {(e.verb, e.impersonated) for e in entries} == {
        ("list", contract.BREAK_GLASS_USER),
        ("patch", contract.BREAK_GLASS_USER),
    }
    assert not stored["spec"].get("schedulingGates")
