"""User impersonation: the `Impersonate-*` headers of a request (`kubectl --as/--as-group`, `sparkgate
release --as/--as-group`), as kube-apiserver's filter applies them after authentication
(staging/src/k8s.io/apiserver/pkg/endpoints/filters/impersonation.go, `WithImpersonation` and
`buildImpersonationRequests`):

- `Impersonate-User` names the user; a name `system:serviceaccount:<ns>:<name>` is that service account,
  whose groups (`system:serviceaccounts`, `system:serviceaccounts:<ns>`) it gets when no group is given.
- Each `Impersonate-Group` header is one group (the header repeated, never a comma-separated list); once any
  is given, the groups are exactly those, plus `system:authenticated` unless `system:authenticated` or
  `system:unauthenticated` is among them.
- `Impersonate-Uid` sets the uid; `Impersonate-Extra-<key>` the extras (the key lower-cased and
  %-unescaped). Groups, a uid or extras without a user: 500, a plain-text answer (`responsewriters.
  InternalError`: `Internal Server Error: "<uri>": requested [...] without impersonating a user`, with
  only `&`, `<` and `>` escaped: errors.go's sanitizer). A header given twice counts by its first value
  (`Header.Get`), an empty one included; groups and extras by every value.
- Each thing impersonated is authorized with the verb `impersonate` (users, groups, serviceaccounts in the
  account's namespace, uids, userextras/<key>), in that order; the first refusal is a 403
  (`users "x" is forbidden: User "admin" cannot impersonate resource "users" in API group "" at the cluster
  scope`).

kubesim has no authorizer (every authenticated user may do everything else): impersonation is allowed to the
members of `system:masters` only, the one group any RBAC setup lets impersonate (kube-apiserver's superuser
authorizer), so a test can show an ordinary user refused. Of the extras, `authentication.kubernetes.io/
pod-name` is kept (kubesim's UserInfo carries no other); the others are authorized and then dropped.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable

from .errors import POD_NAME_EXTRA, UserInfo, forbidden

USER, GROUP, UID, EXTRA = "Impersonate-User", "Impersonate-Group", "Impersonate-Uid", "Impersonate-Extra-"
AUTHENTICATED, UNAUTHENTICATED, ANONYMOUS = (
    "system:authenticated",
    "system:unauthenticated",
    "system:anonymous",
)
SUPERUSERS = "system:masters"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
AUTHENTICATION, AUTHENTICATION_V1 = "authentication.k8s.io", "authentication.k8s.io/v1"


class PlainTextError(Exception):
    """An answer that is not a Status: kube-apiserver's `http.Error` text (code, body)."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


def impersonate(requestor: UserInfo, headers: Iterable[tuple[str, str]], uri: str) -> UserInfo:
    """The user the request acts as: `requestor` itself when it carries no `Impersonate-*` header."""
    first: dict[str, str] = {}  # Header.Get: the first value, even an empty one
    groups: list[str] = []
    extras: list[tuple[str, str]] = []
    for name, value in headers:
        key = name.lower()
        if key in (USER.lower(), UID.lower()):
            first.setdefault(key, value)
        elif key == GROUP.lower():
            groups.append(value)
        elif key.startswith(EXTRA.lower()):
            extras.append((urllib.parse.unquote(key[len(EXTRA) :]), value))
    user, uid = first.get(USER.lower(), ""), first.get(UID.lower(), "")
    # The ObjectReferences of buildImpersonationRequests, in its order: (kind, namespace, name, apiVersion,
    # fieldPath), with the resource and API group the impersonate verb is authorized on.
    wanted: list[tuple[tuple[str, str, str, str, str], str, str]] = []
    account = _service_account(user) if user else None
    if account:
        wanted.append((("ServiceAccount", *account, "", ""), "serviceaccounts", ""))
    elif user:
        wanted.append((("User", "", user, "", ""), "users", ""))
    wanted += [(("Group", "", group, "", ""), "groups", "") for group in groups]
    wanted += [
        (("UserExtra", "", value, AUTHENTICATION_V1, key), f"userextras/{key}", AUTHENTICATION)
        for key, value in extras
    ]
    if uid:
        wanted.append((("UID", "", uid, AUTHENTICATION_V1, ""), "uids", AUTHENTICATION))
    if not wanted:
        return requestor
    if not user:
        # Go's %v of a []v1.ObjectReference: {Kind Namespace Name UID APIVersion ResourceVersion FieldPath}.
        references = " ".join(
            "{" + " ".join((kind, ns, name, "", version, "", path)) + "}"
            for (kind, ns, name, version, path), _, _ in wanted
        )
        raise PlainTextError(
            500,
            _escape(f'Internal Server Error: "{uri}": requested [{references}] without impersonating a user'),
        )
    if SUPERUSERS not in requestor.groups:
        (_, namespace, name, _, _), resource, group = wanted[0]
        where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        why = f'User "{requestor.username}" cannot impersonate resource "{resource}" in API group "{group}" {where}'
        raise forbidden(resource.split("/")[0], name, why, group=group)
    names = list(groups)
    if account and not groups:
        names = ["system:serviceaccounts", f"system:serviceaccounts:{account[0]}"]
    if user != ANONYMOUS:
        if AUTHENTICATED not in names and UNAUTHENTICATED not in names:
            names.append(AUTHENTICATED)
    elif UNAUTHENTICATED not in names:
        names.append(UNAUTHENTICATED)
    pod = next((value for key, value in extras if key == POD_NAME_EXTRA), "")
    return UserInfo(user, uid, tuple(names), pod)


def _escape(text: str) -> str:
    """responsewriters' sanitizer (errors.go): `&`, `<` and `>` only ("Quotes are okay")."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _service_account(username: str) -> tuple[str, str] | None:
    """(namespace, name) of a service account's user name (serviceaccount.SplitUsername), else None."""
    if not username.startswith(SERVICE_ACCOUNT_PREFIX):
        return None
    parts = username[len(SERVICE_ACCOUNT_PREFIX) :].split(":")
    if len(parts) != 2 or not all(parts):
        return None
    return parts[0], parts[1]
