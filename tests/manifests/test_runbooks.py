"""The procedures of docs/install.md and docs/operations.md that release executor pods by hand run on
kubesim as an admin types them, under the install's own gate protection (manifests/base/gate-policy.yaml,
evaluated with the requesting user's groups).

Every `sparkgate release` command the two documents show, in a code block or inline, is taken from the text,
its placeholders (`<namespace>`, `<app id>`, ...) filled in, and run through the CLI as a member of the
break-glass group: it must release exactly the pods it names (none on a dry run), and the same command by a
cluster admin outside the group must be refused. The uninstall of each admission mode is run line by line
from its code block: the `sparkgate` lines through the CLI, the `kubectl delete` lines as the API calls kubectl
makes for them (kubesim serves plain HTTP, where kubectl sends no bearer token, so kubectl itself cannot run
here); kubesim does not serve apps/v1, policy/v1 or rbac, so of `kubectl delete -k` the objects of the kinds
it serves are deleted and checked. Without the webhook (components/admission-policy) the allocator runs as
a process in that mode and applies the MutatingAdmissionPolicy and binding itself, which kubesim serves and
applies at admission; the Deployment's deletion, an apps/v1 kind, is run as what it does: the allocator
process stops. Each uninstall must leave no executor pod gated, no admission object of sparkgate's, and a
cluster where a new executor pod is not gated.
"""

from __future__ import annotations

import contextlib
import copy
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kubesim.cluster import Cluster
from kubesim.errors import ApiError, UserInfo
from kubesim.resources import RESOURCES
from sandbox.localsystem import AllocatorProcess
from sparkgate import contract
from sparkgate.cli import main
from sparkgate.kube import Kube, NotFound

from .test_release import executor

REPO = Path(__file__).resolve().parents[2]
DOCS = (REPO / "docs" / "install.md", REPO / "docs" / "operations.md")
Obj = dict[str, Any]

# The test's values for the documents' placeholders.
PLACEHOLDERS = {"<namespace>": "spark-a", "<app id>": "app-1", "<app>": "app-1", "<pod>": "app-2-exec-1"}
# (namespace, app id, executor id) of the gated executor pods each test starts from.
EXECUTORS = (
    ("spark-a", "app-1", 1),
    ("spark-a", "app-1", 2),
    ("spark-a", "app-2", 1),
    ("spark-b", "app-3", 1),
)
UNINSTALL = [
    "kubectl delete mutatingwebhookconfiguration sparkgate",
    "kubectl delete validatingadmissionpolicybinding sparkgate-gate --ignore-not-found",
    "kubectl delete validatingwebhookconfiguration sparkgate --ignore-not-found",
    "sparkgate release -A",
    "kubectl delete -k manifests/ --ignore-not-found",
    "kubectl delete configmap -A -l app.kubernetes.io/managed-by=sparkgate",
]
# The install without the webhook (components/admission-policy), from the admin's own kustomization.
UNINSTALL_WITHOUT_WEBHOOK = [
    "kubectl -n sparkgate-system delete deployment sparkgate --cascade=foreground",
    "kubectl delete mutatingadmissionpolicybinding sparkgate",
    "kubectl delete mutatingadmissionpolicy sparkgate",
    "kubectl delete validatingadmissionpolicybinding sparkgate-gate",
    "sparkgate release -A",
    "kubectl delete -k my-sparkgate/ --ignore-not-found",
    "kubectl delete configmap -A -l app.kubernetes.io/managed-by=sparkgate",
]
ADMISSION_OBJECTS = (
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
    "mutatingadmissionpolicies",
    "mutatingadmissionpolicybindings",
    "validatingadmissionpolicies",
    "validatingadmissionpolicybindings",
)


def section(path: Path, heading: str) -> str:
    """The text under the markdown heading `heading` (any level), up to the next heading of its level (a
    line in a fenced code block is never a heading: `# a shell comment`)."""
    level, out, fenced = 0, [], False
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        heading_level = len(line) - len(line.lstrip("#")) if not fenced and line.startswith("#") else 0
        if (
            level
            and heading_level
            and line[heading_level : heading_level + 1] == " "
            and heading_level <= level
        ):
            break
        if level:
            out.append(line)
        elif heading_level and line.rstrip("\n") == f"{'#' * heading_level} {heading}":
            level = heading_level
    assert level, f"no heading {heading!r} in {path.name}"
    return "".join(out)


def shell_commands(text: str) -> list[str]:
    """The command lines of the ```sh blocks in `text`, as written: continuation lines joined (a trailing
    backslash, or a line that ends with a pipe, as the shell reads it), spaces collapsed, comments dropped
    (placeholders such as `<app id>` are not shell, so no shell parsing)."""
    commands: list[str] = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, flags=re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = " ".join(re.sub(r"(^|\s)#(\s.*)?$", "", line).split())
            if line and commands and commands[-1].endswith("|"):
                commands[-1] = f"{commands[-1]} {line}"
            elif line:
                commands.append(line)
    return commands


def release_commands() -> list[str]:
    """Every distinct `sparkgate release` command of the documents: code block lines and inline spans."""
    found: list[str] = []
    for path in DOCS:
        text = path.read_text()
        found += [c for c in shell_commands(text) if c.startswith("sparkgate release ")]
        found += re.findall(r"`(sparkgate release -[^`]*)`", text)
    return list(dict.fromkeys(found))


def fill(command: str) -> list[str]:
    for placeholder, value in PLACEHOLDERS.items():
        command = command.replace(placeholder, value)
    assert "<" not in command, f"a placeholder this test does not know: {command}"
    return shlex.split(command)


def gated(cluster: Cluster) -> set[tuple[str, str]]:
    pods, _, _ = cluster.store.list_objects("pods")
    return {
        (p["metadata"]["namespace"], p["metadata"]["name"])
        for p in pods
        if contract.gate_index(p) is not None
    }


def chosen(argv: list[str]) -> set[tuple[str, str]]:
    """The pods a `sparkgate release` command names, from its arguments alone."""
    args = argv[2:]
    namespace = args[args.index("-n") + 1] if "-n" in args else None
    app = args[args.index("--app") + 1] if "--app" in args else None
    pod = args[args.index("--pod") + 1] if "--pod" in args else None
    return {
        (ns, f"{a}-exec-{i}")
        for ns, a, i in EXECUTORS
        if namespace in (None, ns) and app in (None, a) and pod in (None, f"{a}-exec-{i}")
    }


@pytest.fixture
def cluster(kustomize: ModuleType, tmp_path: Path) -> Iterator[Cluster]:
    """kubesim with the base install's objects of the kinds it serves, and gated executor pods."""
    with installed_on_kubesim(installed(kustomize), tmp_path) as cluster:
        yield cluster


@contextlib.contextmanager
def installed_on_kubesim(objects: list[Obj], tmp_path: Path) -> Iterator[Cluster]:
    """kubesim with these objects, gated executor pods and a config map the allocator copied for an app."""
    with Cluster(
        nodes=1, namespaces=("default", "kube-system", "spark-a", "spark-b"), workdir=tmp_path
    ) as cluster:
        for obj in objects:
            resource = resource_of(obj)
            namespace = obj["metadata"].get("namespace") if RESOURCES[resource].namespaced else None
            cluster.store.create(resource, obj, namespace=namespace)
        for namespace, app, exec_id in EXECUTORS:
            cluster.store.create("pods", executor(namespace, app, exec_id), namespace=namespace)
        copy = {
            "metadata": {
                "name": "sg-app-1-log4j-0123456789",
                "namespace": "spark-a",
                "labels": {contract.LABEL_MANAGED_BY: contract.MANAGED_BY},
            },
            "data": {"k": "v"},
        }
        cluster.store.create("configmaps", copy, namespace="spark-a")
        yield cluster


def installed(kustomize: ModuleType, components: tuple[str, ...] = ()) -> list[Obj]:
    """The rendered install (the base, or the base with these components as an admin's kustomization lists
    them), the kinds kubesim serves, in an order the API server accepts."""
    kinds = {r.kind: r for r in RESOURCES.values()}
    rendered = kustomize.install(components) if components else kustomize.build(REPO / "manifests")
    objects = [o for o in rendered if o["kind"] in kinds]
    return sorted(objects, key=lambda o: (o["kind"] != "Namespace", o["kind"].endswith("Binding")))


def resource_of(obj: Obj) -> str:
    [resource] = [name for name, r in RESOURCES.items() if r.kind == obj["kind"]]
    return resource


def test_every_pod_template_is_admitted_under_the_namespaces_restricted_pod_security(
    kustomize: ModuleType, tmp_path: Path
) -> None:
    """The install namespace enforces the Pod Security Standards' `restricted` profile: the Deployment's and
    the scheduler component's pods, created as their ReplicaSets would (a dry run), pass kubesim's
    PodSecurity admission (policy/check_*.go); a container that asks for root is refused there."""
    objects = installed(kustomize, ("scheduler",))
    [namespace] = [o for o in objects if o["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    deployments = [o for o in kustomize.install(("scheduler",)) if o["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {"sparkgate", "sparkgate-scheduler"}
    with installed_on_kubesim(objects, tmp_path) as cluster:
        admin = UserInfo("admin", groups=("system:masters", "system:authenticated"))
        for deployment in deployments:
            template = deployment["spec"]["template"]
            pod = {
                "metadata": {**template["metadata"], "name": deployment["metadata"]["name"]},
                "spec": template["spec"],
            }
            cluster.store.create("pods", pod, namespace=contract.INSTALL_NAMESPACE, user=admin, dry_run=True)
        root = copy.deepcopy(deployments[0]["spec"]["template"])
        root["spec"]["securityContext"]["runAsNonRoot"] = False
        with pytest.raises(ApiError, match='violates PodSecurity "restricted:latest"'):
            cluster.store.create(
                "pods",
                {"metadata": {"name": "root"}, "spec": root["spec"]},
                namespace=contract.INSTALL_NAMESPACE,
                user=admin,
                dry_run=True,
            )


def test_the_docs_show_every_form_of_release_the_runbooks_need() -> None:
    commands = release_commands()
    assert "sparkgate release -A" in commands  # the uninstall
    assert "sparkgate release -n <namespace> --app <app id>" in commands  # the allocator is down
    assert "sparkgate release -n <namespace> --app <app>" in commands  # SparkgateExecutorsHeld's labels
    impersonating = f"--as {contract.BREAK_GLASS_USER} --as-group {contract.BREAK_GLASS_GROUP}"
    assert f"sparkgate release -n <namespace> --app <app id> {impersonating}" in commands  # GKE, AKS
    for heading in ("The allocator is down", "SparkgateNoAllocatorLeader", "SparkgateExecutorsHeld"):
        assert "`sparkgate release -n <namespace> --app <app" in section(DOCS[1], heading), heading


@pytest.mark.parametrize("command", release_commands())
def test_each_release_command_of_the_docs_releases_what_it_names_and_only_for_the_break_glass_group(
    cluster: Cluster, command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command that impersonates the group (`--as ... --as-group`) is run by a cluster admin, who may
    impersonate, and refused to a user who may not; the others by a member of the group, and refused to a
    cluster admin outside it."""
    argv = fill(command)
    before = gated(cluster)
    if "--as-group" in argv:
        assert argv[argv.index("--as") + 1] == contract.BREAK_GLASS_USER
        assert argv[argv.index("--as-group") + 1] == contract.BREAK_GLASS_GROUP
        outsider, refusal = cluster.add_user("dev@example.com"), "cannot impersonate"
        allowed = cluster.kubeconfig("admin")  # system:masters: may impersonate, as cluster-admin may
    else:
        outsider, refusal = cluster.kubeconfig("admin"), "may remove the scheduling gate"
        allowed = cluster.add_user("ops@example.com", groups=(contract.BREAK_GLASS_GROUP,))
    monkeypatch.setenv("KUBECONFIG", str(outsider))
    assert main(argv[1:]) == 1, command
    assert refusal in capsys.readouterr().err
    assert gated(cluster) == before
    monkeypatch.setenv("KUBECONFIG", str(allowed))
    assert main(argv[1:]) == 0, command
    out = capsys.readouterr().out
    expected = set() if "--dry-run" in argv else chosen(argv)
    assert gated(cluster) == before - expected
    assert {
        tuple(w.split("/")) for w in re.findall(r"(?:released|would release) (\S+/\S+) \(app", out)
    } == chosen(argv)


def test_the_uninstall_runs_as_documented(
    cluster: Cluster, kustomize: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert shell_commands(section(DOCS[0], "With the webhook (the default)")) == UNINSTALL
    objects = installed(kustomize)
    admin = cluster.add_user("ops@example.com")  # not in sparkgate:break-glass (GKE, AKS: cannot be)
    monkeypatch.setenv("KUBECONFIG", str(admin))
    kube = Kube.from_kubeconfig(str(admin))
    try:
        for line in UNINSTALL:
            words = shlex.split(line)
            if words[0] == "sparkgate":
                assert main(words[1:]) == 0, line
            else:
                kubectl(kube, line, objects)
        assert_uninstalled(cluster, kube)
    finally:
        kube.close()


def test_the_uninstall_without_the_webhook_runs_as_documented(
    kustomize: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """components/admission-policy: the allocator applies the MutatingAdmissionPolicy at run time, so it is
    stopped first and its objects deleted before the release; a pod created in between is gated by them."""
    assert (
        shell_commands(section(DOCS[0], "Without the webhook (`components/admission-policy`)"))
        == UNINSTALL_WITHOUT_WEBHOOK
    )
    objects = installed(kustomize, (kustomize.ADMISSION_POLICY,))
    policy = REPO / "manifests" / "base" / "policy.yaml"
    with installed_on_kubesim(objects, tmp_path) as cluster:
        allocator = AllocatorProcess(cluster, policy, tmp_path, extra_args=("--admission", "policy"))
        admin = cluster.add_user("ops@example.com")  # not in sparkgate:break-glass
        monkeypatch.setenv("KUBECONFIG", str(admin))
        kube = Kube.from_kubeconfig(str(admin))
        try:
            cluster.wait_for(
                lambda: bool(cluster.store.list_objects("mutatingadmissionpolicybindings")[0]),
                timeout=60,
                what="the allocator to apply the MutatingAdmissionPolicy and its binding",
            )
            assert created_gated(kube, "app-8")  # the policy gates executor pods
            with pytest.raises(NotFound):  # the webhook mode's first line fails here
                kube.delete(f"{ADMISSIONREGISTRATION}/mutatingwebhookconfigurations/sparkgate")
            for line in UNINSTALL_WITHOUT_WEBHOOK:
                words = shlex.split(line)
                if words[0] == "sparkgate":
                    assert main(words[1:]) == 0, line
                elif "deployment" in words:
                    # apps/v1 is not served: the Deployment's deletion, with its pods, stops the allocator.
                    assert (
                        "--cascade=foreground" in words
                        and words[words.index("deployment") + 1] == "sparkgate"
                    )
                    allocator.stop()
                    # Nothing releases any more, but the policy still gates: what the next lines undo.
                    assert created_gated(kube, "app-9")
                else:
                    kubectl(kube, line, objects)
            assert_uninstalled(cluster, kube)
        finally:
            allocator.stop()
            kube.close()


ADMISSIONREGISTRATION = "/apis/admissionregistration.k8s.io/v1"


def created_gated(kube: Kube, app: str) -> bool:
    """Whether an executor pod of `app` created now in spark-a, as Spark creates it, is gated."""
    pod = executor("spark-a", app, 1)
    del pod["spec"]["schedulingGates"]
    created = kube.create("/api/v1/namespaces/spark-a/pods", pod)
    return contract.gate_index(created) is not None


def assert_uninstalled(cluster: Cluster, kube: Kube) -> None:
    """No executor pod gated, nothing of sparkgate's left, and a new executor pod is not gated."""
    store = cluster.store
    assert gated(cluster) == set()
    for resource in ADMISSION_OBJECTS:
        assert store.list_objects(resource)[0] == [], resource
    assert store.list_objects("configmaps", "sparkgate-system")[0] == []
    assert store.list_objects("serviceaccounts", "sparkgate-system")[0] == []
    assert [c["metadata"]["name"] for c in store.list_objects("configmaps", "spark-a")[0]] == []
    assert not created_gated(kube, "app-after")
    assert gated(cluster) == set()


def kubectl(kube: Kube, line: str, objects: list[Obj]) -> None:
    """One `kubectl delete` line of an uninstall, as the API calls kubectl makes for it; `objects`: what the
    directory of `kubectl delete -k` renders (the kinds kubesim serves)."""
    words = shlex.split(line)
    assert words[:2] == ["kubectl", "delete"], line

    def path(obj: Obj) -> str:
        r = RESOURCES[resource_of(obj)]
        base = f"/api/{r.version}" if not r.group else f"/apis/{r.group}/{r.version}"
        namespace = obj["metadata"].get("namespace")
        where = f"/namespaces/{namespace}" if r.namespaced and namespace else ""
        return f"{base}{where}/{r.plural}/{obj['metadata']['name']}"

    if words[2] == "-k":  # every object of the rendered directory, namespaced ones first
        assert words[4:] == ["--ignore-not-found"], line
        for obj in sorted(objects, key=lambda o: o["kind"] == "Namespace"):
            with contextlib.suppress(NotFound):  # --ignore-not-found: deleted by an earlier line
                kube.delete(path(obj))
    elif words[2:4] == ["configmap", "-A"]:  # the per-application copies, by label
        assert words[4] == "-l", line
        items, _ = kube.list("/api/v1/configmaps", label_selector=words[5])
        for item in items:
            kube.delete(path({**item, "kind": "ConfigMap"}))
    else:  # kubectl delete TYPE NAME [--ignore-not-found], a cluster-scoped kind: TYPE is its kind in lower case
        [kind] = [r.kind for r in RESOURCES.values() if r.kind.lower() == words[2] and not r.namespaced]
        assert len(words) == 4 or words[4:] == ["--ignore-not-found"], line
        with contextlib.suppress(*((NotFound,) if words[4:] else ())):
            kube.delete(path({"kind": kind, "metadata": {"name": words[3]}}))
