"""User impersonation in kubesim over HTTP (`Impersonate-User`, `Impersonate-Group`, ...), copied from
kube-apiserver's filter: staging/src/k8s.io/apiserver/pkg/endpoints/filters/impersonation.go
(`WithImpersonation`, `buildImpersonationRequests`) and the messages of endpoints/handlers/responsewriters
(`Forbidden`'s forbiddenMessage, `InternalError`). What the request acts as is read where the API server
hands it on: the AdmissionReview's userInfo a webhook receives; who sent it, from the request log (audit's
`user` and `impersonatedUser`)."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.config import ConfigException

from kubesim.cluster import Cluster
from kubesim.errors import UserInfo
from kubesim.impersonation import PlainTextError, impersonate
from sparkgate.kube import Impersonation, Kube, KubeError

from .conftest import pod
from .test_cluster import TinyWebhook


def allow(request: dict[str, Any]) -> dict[str, Any]:
    return {"allowed": True}


@pytest.fixture
def webhook(cluster: Cluster) -> Iterator[TinyWebhook]:
    hook = TinyWebhook(allow)
    config = hook.config()
    config["webhooks"][0]["objectSelector"] = {}
    cluster.store.create("mutatingwebhookconfigurations", config)
    yield hook
    hook.close()


def create_as(cluster: Cluster, name: str, act_as: Impersonation | None, user: str = "admin") -> None:
    user_groups = (act_as.user, act_as.groups) if act_as else (None, ())
    kube = Kube.from_kubeconfig(
        str(cluster.kubeconfig(user)), as_user=user_groups[0], as_groups=user_groups[1], max_attempts=1
    )
    try:
        kube.create("/api/v1/namespaces/spark/pods", pod(name))
    finally:
        kube.close()


def test_a_user_and_groups_replace_the_callers_identity_and_both_are_logged(
    cluster: Cluster, webhook: TinyWebhook
) -> None:
    """Each Impersonate-Group header is one group; once groups are given they are the user's groups, with
    system:authenticated added (impersonation.go: `if username != user.Anonymous { ... addAuthenticated }`).
    The audit log keeps the caller as `user` and the impersonated one apart."""
    create_as(cluster, "p1", Impersonation("ops", ("team-a", "sparkgate:break-glass")))
    assert webhook.requests[-1]["userInfo"] == {
        "username": "ops",
        "uid": "",
        "groups": ["team-a", "sparkgate:break-glass", "system:authenticated"],
    }
    [entry] = [e for e in cluster.requests.entries() if e.verb == "create" and e.resource == "pods"]
    assert (entry.user, entry.impersonated) == ("admin", "ops")


def test_a_service_account_gets_its_groups_when_none_are_given(
    cluster: Cluster, webhook: TinyWebhook
) -> None:
    """`system:serviceaccount:<ns>:<name>` is impersonated as that account (serviceaccount.SplitUsername),
    with serviceaccount.MakeGroupNames(ns) when no group is given."""
    create_as(cluster, "p2", Impersonation("system:serviceaccount:spark:driver"))
    assert webhook.requests[-1]["userInfo"]["groups"] == [
        "system:serviceaccounts",
        "system:serviceaccounts:spark",
        "system:authenticated",
    ]


def test_system_unauthenticated_among_the_groups_keeps_system_authenticated_out(
    cluster: Cluster, webhook: TinyWebhook
) -> None:
    create_as(cluster, "p3", Impersonation("someone", ("system:unauthenticated",)))
    assert webhook.requests[-1]["userInfo"]["groups"] == ["system:unauthenticated"]


def test_impersonating_is_refused_to_a_user_rbac_does_not_let_impersonate(
    cluster: Cluster, webhook: TinyWebhook
) -> None:
    """The first thing impersonated that the caller may not impersonate is refused (the user before the
    groups), with responsewriters.Forbidden's message. kubesim authorizes only system:masters."""
    with pytest.raises(KubeError) as refused:
        create_as(cluster, "p4", Impersonation("ops", ("sparkgate:break-glass",)), user="bob")
    assert refused.value.message == (
        'users "ops" is forbidden: User "bob" cannot impersonate resource "users" in API group "" '
        "at the cluster scope"
    )
    assert not webhook.requests
    with pytest.raises(KubeError) as refused:
        create_as(cluster, "p5", Impersonation("system:serviceaccount:spark:driver"), user="bob")
    assert refused.value.message == (
        'serviceaccounts "driver" is forbidden: User "bob" cannot impersonate resource "serviceaccounts" '
        'in API group "" in the namespace "spark"'
    )


def test_groups_without_a_user_are_a_plain_text_internal_error(cluster: Cluster) -> None:
    """buildImpersonationRequests: `requested %v without impersonating a user`, answered by
    responsewriters.InternalError: Go's http.Error, text/plain, the message HTML-escaped."""
    base = urllib.parse.urlsplit(cluster.apiserver.url)
    cluster.kubeconfig("admin")
    [token] = [t for t, user in cluster.apiserver.tokens.items() if user.username == "admin"]
    conn = http.client.HTTPConnection(base.hostname or "", base.port)
    try:
        conn.request(
            "GET",
            "/api/v1/namespaces/spark/pods",
            headers={"Authorization": f"Bearer {token}", "Impersonate-Group": "sparkgate:break-glass"},
        )
        answer = conn.getresponse()
        body = answer.read().decode()
    finally:
        conn.close()
    assert answer.status == 500
    assert answer.getheader("Content-Type") == "text/plain; charset=utf-8"
    assert body == (
        'Internal Server Error: "/api/v1/namespaces/spark/pods": '
        "requested [{Group  sparkgate:break-glass    }] without impersonating a user\n"
    )
    with pytest.raises(json.JSONDecodeError):
        json.loads(body)


def test_a_kubeconfig_users_as_and_as_groups_are_honoured_and_each_flag_replaces_its_field(
    cluster: Cluster, webhook: TinyWebhook, tmp_path: Path
) -> None:
    """kubectl (client-go's ImpersonationConfig) sends a kubeconfig user's `as`/`as-groups`, and its --as
    and --as-group each replace one field (clientcmd merges the overrides field by field); the official
    Python client ignores them, sparkgate's client reads them (sparkgate/kube.py `impersonation`)."""
    config = yaml.safe_load(cluster.kubeconfig("admin").read_text())
    user = config["users"][0]["user"]
    user.update({"as": "ops", "as-groups": ["sparkgate:break-glass"]})
    path = tmp_path / "break-glass-context"

    def created_as(name: str, as_user: str | None = None, as_groups: tuple[str, ...] = ()) -> Any:
        path.write_text(yaml.safe_dump(config))
        kube = Kube.from_kubeconfig(str(path), max_attempts=1, as_user=as_user, as_groups=as_groups)
        try:
            kube.create("/api/v1/namespaces/spark/pods", pod(name))
        finally:
            kube.close()
        return webhook.requests[-1]["userInfo"]

    seen = created_as("k1")
    assert (seen["username"], seen["groups"]) == ("ops", ["sparkgate:break-glass", "system:authenticated"])
    seen = created_as("k2", as_user="other")  # --as alone: the kubeconfig's groups stay
    assert (seen["username"], seen["groups"]) == ("other", ["sparkgate:break-glass", "system:authenticated"])
    seen = created_as("k3", as_groups=("team-a",))  # --as-group alone: the kubeconfig's user stays
    assert (seen["username"], seen["groups"]) == ("ops", ["team-a", "system:authenticated"])
    del user["as"]
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigException, match="need a user to act as"):
        Kube.from_kubeconfig(str(path))
    user.update({"as": "ops", "as-uid": "1234"})
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigException, match="sets as-uid, which sparkgate does not send"):
        Kube.from_kubeconfig(str(path))


def test_the_first_value_of_a_repeated_user_header_counts_even_empty() -> None:
    """Header.Get reads the first value: an empty first Impersonate-User means no user, whatever follows
    (so the groups are refused as requested without a user); extras print with their API version and key."""
    admin = UserInfo("admin", groups=("system:masters", "system:authenticated"))
    headers = [
        ("Impersonate-User", ""),
        ("impersonate-user", "ops"),
        ("Impersonate-Extra-Scopes", "view"),
    ]
    with pytest.raises(PlainTextError) as refused:
        impersonate(admin, headers, "/api")
    assert refused.value.text == (
        'Internal Server Error: "/api": requested [{UserExtra  view  authentication.k8s.io/v1  scopes}] '
        "without impersonating a user"
    )
    assert impersonate(admin, [("X-Other", "1")], "/api") is admin
