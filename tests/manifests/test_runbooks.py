"""The procedures of docs/install.md and docs/operations.md that release executor pods by hand run on
kubesim as an admin types them, under the install's own gate protection (manifests/base/gate-policy.yaml,
evaluated with the requesting user's groups).

Every `sparkgate release` command the two documents show, in a code block or inline, is taken from the text,
its placeholders (`<namespace>`, `<app id>`, ...) filled in, and run through the CLI as a member of the
break-glass group: it must release exactly the pods it names (none on a dry run), and the same command by a
cluster admin outside the group must be refused. The uninstall is run line by line from its code block: the
`sparkgate` lines through the CLI, the `kubectl delete` lines as the API calls kubectl makes for them (kubesim
serves plain HTTP, where kubectl sends no bearer token, so kubectl itself cannot run here); kubesim does not
serve apps/v1, policy/v1 or rbac, so of `kubectl delete -k manifests/` the objects of the kinds it serves are
deleted and checked.
"""

from __future__ import annotations

import contextlib
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kubesim.cluster import Cluster
from kubesim.resources import RESOURCES
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
    "sparkgate release -A",
    "kubectl delete -k manifests/ --ignore-not-found",
    "kubectl delete configmap -A -l app.kubernetes.io/managed-by=sparkgate",
]


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
    """The command lines of the ```sh blocks in `text`, as written: continuation lines joined, spaces
    collapsed, comments dropped (placeholders such as `<app id>` are not shell, so no shell parsing)."""
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, flags=re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = " ".join(re.sub(r"(^|\s)#(\s.*)?$", "", line).split())
            if line:
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
    with Cluster(
        nodes=1, namespaces=("default", "kube-system", "spark-a", "spark-b"), workdir=tmp_path
    ) as cluster:
        for obj in installed(kustomize):
            resource = resource_of(obj)
            namespace = obj["metadata"].get("namespace") if RESOURCES[resource].namespaced else None
            cluster.store.create(resource, obj, namespace=namespace)
        for namespace, app, exec_id in EXECUTORS:
            cluster.store.create("pods", executor(namespace, app, exec_id), namespace=namespace)
        yield cluster


def installed(kustomize: ModuleType) -> list[Obj]:
    """The rendered base install, the kinds kubesim serves, in an order the API server accepts."""
    kinds = {r.kind: r for r in RESOURCES.values()}
    objects = [o for o in kustomize.build(REPO / "manifests") if o["kind"] in kinds]
    return sorted(objects, key=lambda o: (o["kind"] != "Namespace", o["kind"].endswith("Binding")))


def resource_of(obj: Obj) -> str:
    [resource] = [name for name, r in RESOURCES.items() if r.kind == obj["kind"]]
    return resource


def test_the_docs_show_every_form_of_release_the_runbooks_need() -> None:
    commands = release_commands()
    assert "sparkgate release -A" in commands  # the uninstall
    assert "sparkgate release -n <namespace> --app <app id>" in commands  # the allocator is down
    assert "sparkgate release -n <namespace> --app <app>" in commands  # SparkgateExecutorsHeld's labels
    for heading in ("The allocator is down", "SparkgateNoAllocatorLeader", "SparkgateExecutorsHeld"):
        assert "`sparkgate release -n <namespace> --app <app" in section(DOCS[1], heading), heading


@pytest.mark.parametrize("command", release_commands())
def test_each_release_command_of_the_docs_releases_what_it_names_and_only_for_the_break_glass_group(
    cluster: Cluster, command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = fill(command)
    before = gated(cluster)
    outsider = cluster.kubeconfig("admin")  # system:masters, not in the break-glass group
    monkeypatch.setenv("KUBECONFIG", str(outsider))
    assert main(argv[1:]) == 1, command
    assert "may remove the scheduling gate" in capsys.readouterr().err
    assert gated(cluster) == before
    member = cluster.add_user("ops@example.com", groups=(contract.BREAK_GLASS_GROUP,))
    monkeypatch.setenv("KUBECONFIG", str(member))
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
    assert shell_commands(section(DOCS[0], "Uninstall")) == UNINSTALL
    copy = {
        "metadata": {
            "name": "sg-app-1-log4j-0123456789",
            "namespace": "spark-a",
            "labels": {contract.LABEL_MANAGED_BY: contract.MANAGED_BY},
        },
        "data": {"k": "v"},
    }
    cluster.store.create("configmaps", copy, namespace="spark-a")
    admin = cluster.add_user("ops@example.com", groups=(contract.BREAK_GLASS_GROUP,))
    monkeypatch.setenv("KUBECONFIG", str(admin))
    kube = Kube.from_kubeconfig(str(admin))
    kubectl = kubectl_lines(kube, kustomize)
    try:
        for line in UNINSTALL:
            words = shlex.split(line)
            if words[0] == "sparkgate":
                assert main(words[1:]) == 0, line
            else:
                kubectl[line]()
    finally:
        kube.close()
    store = cluster.store
    assert gated(cluster) == set()
    for resource in (
        "mutatingwebhookconfigurations",
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
    ):
        assert store.list_objects(resource)[0] == [], resource
    assert store.list_objects("configmaps", "sparkgate-system")[0] == []
    assert store.list_objects("serviceaccounts", "sparkgate-system")[0] == []
    assert [c["metadata"]["name"] for c in store.list_objects("configmaps", "spark-a")[0]] == []


def kubectl_lines(kube: Kube, kustomize: ModuleType) -> dict[str, Callable[[], None]]:
    """The uninstall's kubectl lines, each as the API calls kubectl makes for it."""

    def path(obj: Obj) -> str:
        r = RESOURCES[resource_of(obj)]
        base = f"/api/{r.version}" if not r.group else f"/apis/{r.group}/{r.version}"
        namespace = obj["metadata"].get("namespace")
        where = f"/namespaces/{namespace}" if r.namespaced and namespace else ""
        return f"{base}{where}/{r.plural}/{obj['metadata']['name']}"

    def delete_k() -> None:  # every object of the rendered directory, namespaced ones first
        for obj in sorted(installed(kustomize), key=lambda o: o["kind"] == "Namespace"):
            with contextlib.suppress(NotFound):  # --ignore-not-found: the webhook went first
                kube.delete(path(obj))

    def delete_copies() -> None:
        items, _ = kube.list("/api/v1/configmaps", label_selector="app.kubernetes.io/managed-by=sparkgate")
        for item in items:
            kube.delete(path({**item, "kind": "ConfigMap"}))

    return {
        UNINSTALL[0]: lambda: kube.delete(
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/sparkgate"
        ),
        UNINSTALL[2]: delete_k,
        UNINSTALL[3]: delete_copies,
    }
