"""All of sparkgate's Kubernetes I/O: one ApiClient, raw JSON, retries, typed errors, list, watch, and the
one `Reflector` (list, then watch, forever) every watch of sparkgate runs on.

The generated models of the official client cost ~0.5 ms per pod to deserialize, and its Watch has a
hidden retry loop that resends stale resourceVersions (docs/architecture.md, "Decisions"), so sparkgate uses the client only for what it does well: configuration,
authentication (including the in-cluster token refresh) and its urllib3 connection pool. Requests are built
as paths and dicts here; bodies are JSON. 409 and 422 are never retried: they mean "re-read and re-decide",
so they surface as `Conflict` and `Invalid`.

Retries (exponential backoff with full jitter, Retry-After honoured), by what the failed attempt may have
done (docs/architecture.md, "A write is retried only where a repeat is safe"):
- not done: a 429 (kube-apiserver's flow control refuses before any handler runs), a 5xx that carries
  Retry-After (the API server says the request may be sent again: client-go's `checkWait`, which retries
  every verb on it and on nothing else), a connection that was never made. Retried, reads and writes alike.
- maybe done: no answer once the request was sent (a reset, a timeout), or a 5xx without Retry-After (a
  proxy's 502 or 504, the API server's own 504 when its handler overran the request timeout, a 500): a write
  may have been applied. A read is retried. A write is retried only when a repeat is safe
  (`repeat_is_safe`): the API server refuses a repeat of one that landed (a PUT with a resourceVersion, a
  DELETE with a precondition, a POST of a named object, a JSON Patch that tests what it changes) or the repeat
  changes nothing (server-side apply, a dry run). Any other write is not repeated: client-go retries no
  write on an unanswered request either (rest/request.go `request`: "We are not automatically retrying
  write operations, as they are not idempotent").
An error raised for a write that some attempt may have applied carries `maybe_applied`: a 422 of a test, a
409 or a 404 that follows a lost answer may be the write's own doing, and the caller keeps the outcome open
until its watch shows it (allocator/expectations.py), rather than reading it as a refusal.

A client made for the leader's writes (`gated`) checks leadership before every write attempt, retries
included, and refuses with `NotLeading` instead of sending once it has lapsed (sparkgate/leader.py). Each of
its writes (dry runs apart: they store nothing) also carries the fence's timeout, on the client and, as
the `timeout` parameter, on the API server, which cancels the request's handler at it (request_deadline.go):
a write sent within the renew deadline is over before a new leader may write. A `limited` copy waits for a
client-side budget (sparkgate/ratelimit.py) before each attempt; a copy can be both
(`kube.gated(leading, timeout=...).limited(wait)`): leadership is asked before the budget is waited for (a
lapsed replica spends no token) and again after it (a lapse during the wait is caught).

Threading: a `Kube` is shared by every thread (urllib3's pool is thread-safe; its own fields never change
after construction but `_auth`, the cached authentication headers, which any thread replaces whole). A
`Reflector` runs in its own thread and owns its resourceVersion and backoff. The decoders of the shapes
(`decode`) are made once per shape and shared by every thread: a decode holds the GIL and keeps no state
between calls.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import logging
import os
import random
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any, TypedDict

import msgspec
import orjson
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config

log = logging.getLogger(__name__)

Obj = dict[str, Any]
RequestHook = Callable[[str, str, int], None]  # (verb, resource path template, status code; 0 = no answer)


class KubeError(Exception):
    """A request that failed. `maybe_applied`: the request was a write and an attempt of it got no answer or
    a 5xx, so it may have been applied whatever this error says (a 422 of a JSON Patch's test, a 409, a 404
    that follows such an attempt may be the write's own doing)."""

    maybe_applied = False

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Invalid(KubeError):
    pass


class Gone(KubeError):
    pass


class Unavailable(KubeError):
    """429, 5xx or no answer, after the retries the request allowed."""


class NotLeading(KubeError):
    """A write not sent: the client is gated on leadership (`Kube.gated`) and this replica does not lead."""


_BY_STATUS: dict[int, type[KubeError]] = {404: NotFound, 409: Conflict, 410: Gone, 422: Invalid}
_RETRIABLE = {429, 500, 502, 503, 504}
# How long the authentication headers are reused: client-go reads a service account's token file at most
# once a minute (transport/token_source.go, NewCachedFileTokenSource), and the kubelet renews a projected
# token at 80 % of its lifetime (10 minutes at least). The official client computes them per request
# (`update_params_for_auth`, which runs the kubeconfig loader's refresh hook): ~40 % of the allocator's CPU
# per PATCH, measured with py-spy during a burst of gate removals.
AUTH_REFRESH_SECONDS = 60.0


def kubeconfig_path(explicit: str | None) -> str | None:
    """The kubeconfig an admin's command uses, as kubectl resolves it: `explicit` (--kubeconfig), else
    $KUBECONFIG, else ~/.kube/config if it exists; None (the in-cluster service account) when none is. For the
    commands run from a workstation (`policy check --cluster`, `release`); the in-cluster processes take
    --kubeconfig or $KUBECONFIG only, never a home directory's file."""
    if explicit:
        return explicit
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    default = os.path.expanduser("~/.kube/config")
    return default if os.path.exists(default) else None


def api_client(kubeconfig: str | None, *, pool_size: int = 16) -> k8s.ApiClient:
    """One ApiClient from a kubeconfig file, or the in-cluster service account when None. `pool_size`: the
    connections its urllib3 pool keeps to the API server; a thread that finds them all busy opens one more
    and it is closed after its request (a new TCP and TLS handshake each time), so it should be at least
    the number of threads that send requests at once, long-running watches included."""
    configuration = k8s.Configuration()
    if kubeconfig:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = pool_size
    # urllib3's default Retry would re-send a 429/503 with Retry-After by itself (sleeping unjittered, unseen
    # by the request hook) and re-send after a dropped connection; Kube.request owns retries.
    configuration.retries = False
    return k8s.ApiClient(configuration)


def _verb(method: str, query: Mapping[str, Any] | None, path: str) -> str:
    if method == "GET":
        if query and str(query.get("watch", "")).lower() in ("true", "1"):
            return "watch"
        return "list" if _is_collection(path) else "get"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        method, method.lower()
    )


def _is_collection(path: str) -> bool:
    parts = path.strip("/").split("/")
    body = parts[2:] if parts[0] == "api" else parts[3:]
    if body[:1] == ["namespaces"] and len(body) >= 3:
        body = body[2:]
    return len(body) == 1


_CHANGING_OPS = (
    "remove",
    "replace",
)  # JSON Patch operations after which a repeat's test of the same value fails


def repeat_is_safe(method: str, query: Mapping[str, Any] | None, body: Any, content_type: str | None) -> bool:
    """Whether sending a request again can do no harm whatever became of an attempt whose answer was lost:
    a read or a dry run (nothing is stored); a write the API server refuses to repeat once it has landed: a
    PUT that carries the resourceVersion it replaces (409), a DELETE with a precondition (404, or 409 for a
    new object of the same name), a POST of a named object (409 AlreadyExists), a JSON Patch whose first
    operation tests a value that a later one removes or replaces (422: sparkgate's gate removal); or a write
    whose repeat changes nothing: a server-side apply. Not a POST with generateName (a second object), an
    unconditional PUT, a merge or strategic patch, a DELETE by name alone (a repeat could overwrite or delete
    what another writer made in between)."""
    if method == "GET" or _dry_run(query):
        return True
    meta = (body.get("metadata") or {}) if isinstance(body, dict) else {}
    kind = (content_type or "").split(";")[0].strip()
    if method == "PUT":
        return bool(meta.get("resourceVersion"))
    if method == "POST":
        return bool(meta.get("name"))
    if method == "DELETE":
        return bool(isinstance(body, dict) and body.get("preconditions"))
    if method == "PATCH" and kind == "application/apply-patch+yaml":
        return True
    if method == "PATCH" and kind == "application/json-patch+json" and isinstance(body, list) and body:
        tested = (
            str(body[0].get("path")) if isinstance(body[0], dict) and body[0].get("op") == "test" else None
        )
        changed = [
            str(op.get("path")) for op in body[1:] if isinstance(op, dict) and op.get("op") in _CHANGING_OPS
        ]
        return tested is not None and any(tested == p or tested.startswith(f"{p}/") for p in changed)
    return False


def _dry_run(query: Mapping[str, Any] | None) -> bool:
    return query is not None and query.get("dryRun") is not None


def resource_of(path: str) -> str:
    """`/api/v1/namespaces/x/pods/y/status` → `pods/status` (for metrics and RBAC checks)."""
    parts = path.strip("/").split("?")[0].split("/")
    body = parts[2:] if parts[0] == "api" else parts[3:]
    if body[:1] == ["namespaces"] and len(body) >= 3:
        body = body[2:]
    if len(body) >= 3:
        return f"{body[0]}/{body[2]}"
    return body[0] if body else ""


@dataclasses.dataclass(frozen=True)
class Impersonation:
    """Act as another user (`--as`) and groups (`--as-group`), as kubectl does: the `Impersonate-User`
    header and one `Impersonate-Group` header per group (kube-apiserver reads each header as one group; a
    comma-separated value would be one group named with commas). The API server authorizes the verb
    `impersonate` on each for the caller, then handles the request as that user with exactly those groups
    (plus system:authenticated); its audit log records both the caller and the user impersonated."""

    user: str
    groups: tuple[str, ...] = ()

    def headers(self, base: Mapping[str, str]) -> urllib3.HTTPHeaderDict:
        out = urllib3.HTTPHeaderDict(base)
        out.add("Impersonate-User", self.user)
        for group in self.groups:
            out.add("Impersonate-Group", group)
        return out


def impersonation(
    kubeconfig: str | None, user: str | None = None, groups: Sequence[str] = ()
) -> Impersonation | None:
    """Whom the requests act as, as kubectl decides it: the kubeconfig's current user may ask for it (`as`,
    `as-groups`: kubectl's flags written into the file, which client-go honours and the official Python
    client ignores), and `user` (--as) and `groups` (--as-group), when given, each replace that field
    (clientcmd merges the overrides field by field). The files of a $KUBECONFIG list are merged as the client
    merges them, the first to set a value winning. Groups without a user are refused (ConfigException), as
    kube-apiserver refuses them (a 500); so are the `as-uid` and `as-user-extra` fields, which sparkgate does
    not send. None: act as the kubeconfig's own credentials."""
    asked_user, asked_groups = _kubeconfig_as(kubeconfig) if kubeconfig else ("", ())
    user, groups = user or asked_user, tuple(groups) or asked_groups
    if groups and not user:
        raise k8s_config.ConfigException(
            "groups to act as (--as-group, or the kubeconfig user's as-groups) need a user to act as "
            "(--as, or its as)"
        )
    return Impersonation(user, groups) if user else None


def add_impersonation_arguments(parser: argparse.ArgumentParser, user_help: str) -> None:
    """kubectl's `--as` and `--as-group` on a command that talks to the API server with a kubeconfig: read as
    `args.act_as` and `args.as_group` (`Kube.from_kubeconfig(..., as_user=, as_groups=)`)."""
    parser.add_argument("--as", dest="act_as", metavar="USER", help=user_help)
    parser.add_argument(
        "--as-group",
        action="append",
        default=[],
        metavar="GROUP",
        help="act as a member of this group (repeatable; needs a user: --as, or the kubeconfig user's as)",
    )


def _kubeconfig_as(kubeconfig: str) -> tuple[str, tuple[str, ...]]:
    """The current context's user's `as` and `as-groups`."""

    def plain(node: Any) -> Any:  # the merger's ConfigNode wrappers (the merged lists' items) unwrapped
        return node.value if isinstance(node, k8s_config.kube_config.ConfigNode) else node

    document = plain(k8s_config.kube_config.KubeConfigMerger(kubeconfig).config) or {}  # type: ignore[no-untyped-call]
    current = document.get("current-context")
    contexts = [plain(c) for c in document.get("contexts") or []]
    context = next((c.get("context") or {} for c in contexts if c.get("name") == current), {})
    name = context.get("user")
    users = [plain(u) for u in document.get("users") or []]
    user = next((u.get("user") or {} for u in users if u.get("name") == name), {})
    unsupported = sorted(k for k in ("as-uid", "as-user-extra") if user.get(k))
    if unsupported:
        raise k8s_config.ConfigException(
            f"kubeconfig user {name!r} sets {', '.join(unsupported)}, which sparkgate does not send: use kubectl, "
            "or a context without it"
        )
    return str(user.get("as") or ""), tuple(str(g) for g in user.get("as-groups") or ())


class Kube:
    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        on_request: RequestHook | None = None,
        max_attempts: int = 6,
        backoff_base: float = 0.1,
        backoff_cap: float = 5.0,
        timeout: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
        limiter: Callable[[], object] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        act_as: Impersonation | None = None,
    ) -> None:
        self.api = api
        self.act_as = act_as
        self.limiter = limiter  # called before each attempt: waits for the client-side budget
        self.host = api.configuration.host.rstrip("/")
        self.on_request = on_request
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.timeout = timeout
        self._sleep = sleep
        self._rand = rand
        self._gate: Callable[[], bool] | None = None
        self._fence: float | None = None  # the gated writes' timeout (`gated`)
        self._monotonic = monotonic
        self._auth: tuple[float, dict[str, str]] | None = None  # (when computed, the headers)

    def gated(self, leading: Callable[[], bool], *, timeout: float) -> Kube:
        """This client for writes only the leader may make: every write attempt (each retry too) first asks
        `leading()` and raises NotLeading instead of sending when it is false, and is over within `timeout`
        seconds, on the client and on the API server (its `timeout` parameter) alike, so that no write of a
        replica whose leadership lapsed can land after a new leader's first (sparkgate/leader.py
        `LeaderElector.gate` works it out). A dry run stores nothing: it keeps the client's timeout. Reads
        are not gated."""
        clone = copy.copy(self)
        clone._gate, clone._fence = leading, timeout
        return clone

    def may_write(self) -> bool:
        """False when this client is gated and the replica does not lead (a write would not be sent)."""
        return self._gate is None or self._gate()

    @classmethod
    def from_kubeconfig(
        cls,
        kubeconfig: str | None,
        *,
        pool_size: int = 16,
        as_user: str | None = None,
        as_groups: Sequence[str] = (),
        **kwargs: Any,
    ) -> Kube:
        """A client from a kubeconfig (None: the in-cluster service account), acting as the kubeconfig's user
        asks and `as_user`/`as_groups` (--as, --as-group) override, as kubectl does (`impersonation`)."""
        act_as = impersonation(kubeconfig, as_user, as_groups)
        return cls(api_client(kubeconfig, pool_size=pool_size), act_as=act_as, **kwargs)

    def limited(self, limiter: Callable[[], object]) -> Kube:
        """The same client (connections, retries, request hook) with every request attempt waiting for
        `limiter` first (a TokenBucket's `wait`: sparkgate/ratelimit.py). Close the original, not this."""
        clone = copy.copy(self)
        clone.limiter = limiter
        return clone

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]

    # --- one request ------------------------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None,
        body: Any,
        content_type: str | None,
        timeout: float | tuple[float, float] | None,
    ) -> Any:
        url = self.host + path
        if query:
            url += "?" + urllib.parse.urlencode(
                {k: _query_value(v) for k, v in query.items() if v is not None}
            )
        headers: MutableMapping[str, str] = {
            "Accept": "application/json",
            "User-Agent": "sparkgate",
            **self._auth_headers(),
        }
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        if self.act_as is not None:
            headers = self.act_as.headers(headers)
        return self.api.call_api(
            method, url, header_params=headers, body=body, _request_timeout=timeout or self.timeout
        )

    def _auth_headers(self) -> dict[str, str]:
        """The client's authentication headers, computed again once AUTH_REFRESH_SECONDS have passed or after
        a 401 (a renewed token). Threads may race to compute them: each result is whole."""
        now = self._monotonic()
        cached = self._auth
        if cached is None or now - cached[0] >= AUTH_REFRESH_SECONDS:
            headers: dict[str, str] = {}
            self.api.update_params_for_auth(headers, [], ["BearerToken"], "", "GET", None)
            cached = self._auth = (now, headers)
        return cached[1]

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        retry: bool = True,
        timeout: float | None = None,
        shape: Any = None,
    ) -> Any:
        """The decoded JSON answer; KubeError subclasses on failure (after the retries the module docstring
        describes). `retry=False`: one attempt whatever happens. `timeout`: of each attempt, in seconds
        (default: the client's, or a gated write's fence). `shape`: decode only these fields of the answer
        (`decode`)."""
        verb = _verb(method, query, path)
        resource = resource_of(path)
        write = method != "GET"
        repeatable = not write or repeat_is_safe(method, query, body, content_type)
        if write and self._fence is not None and not _dry_run(query):
            timeout = min(timeout or self.timeout, self._fence)
            query = {**(query or {}), "timeout": f"{timeout:g}s"}  # client-go's Request.Timeout sends it too
        attempt, maybe_applied = 0, False
        while True:
            attempt += 1
            status, retry_after, sent = 0, None, True
            self._check_gate(write, method, path, maybe_applied)  # a lapsed replica spends no token
            if self.limiter is not None:
                self.limiter()
                self._check_gate(write, method, path, maybe_applied)
            try:
                response = self._send(method, path, query, body, content_type, timeout)
                status = response.status
                data = response.read()
                if 200 <= status < 300:
                    self._count(verb, resource, status)
                    return decode(data, shape) if data else None
                error = _error(status, data)
                if status == 401:
                    self._auth = None
                header = response.getheader("Retry-After")
                retry_after = float(header) if header and header.isdigit() else None
            except urllib3.exceptions.ConnectTimeoutError as e:  # no connection: nothing was sent
                status, sent, error = 0, False, Unavailable(0, "ConnectionError", str(e))
            except (urllib3.exceptions.HTTPError, OSError) as e:  # sent; the answer (or its body) lost
                status, error = 0, Unavailable(0, "ConnectionError", str(e))
            self._count(verb, resource, status)
            unknown = sent and (status == 0 or status >= 500)  # a write may have been applied
            maybe_applied |= write and unknown
            again = (
                retry
                and attempt < self.max_attempts
                and (
                    (status == 0 and (repeatable or not sent))
                    or status == 429
                    or (status in _RETRIABLE and (repeatable or retry_after is not None))
                )
            )
            if not again:
                if status in _RETRIABLE or status == 0:
                    error = Unavailable(error.status, error.reason, error.message)
                error.maybe_applied = maybe_applied
                raise error
            delay = retry_after if retry_after is not None else self.backoff(attempt)
            log.warning("%s %s failed (%s); retrying in %.2fs", method, path, error, delay)
            self._sleep(delay)

    def _check_gate(self, write: bool, method: str, path: str, maybe_applied: bool) -> None:
        if write and self._gate is not None and not self._gate():
            error = NotLeading(0, "NotLeading", f"{method} {path} not sent: this replica does not lead")
            error.maybe_applied = maybe_applied
            raise error

    def backoff(self, attempt: int) -> float:
        """Exponential with full jitter: uniform in [0, min(cap, base * 2^attempt)]."""
        return float(self._rand() * min(self.backoff_cap, self.backoff_base * 2**attempt))

    def _count(self, verb: str, resource: str, status: int) -> None:
        if self.on_request is not None:
            self.on_request(verb, resource, status)

    # --- conveniences -------------------------------------------------------------------------------

    def get(self, path: str) -> Obj:
        result: Obj = self.request("GET", path)
        return result

    def create(self, path: str, body: Obj) -> Obj:
        result: Obj = self.request("POST", path, body=body)
        return result

    def patch(self, path: str, body: Any, content_type: str, *, shape: Any = None) -> Obj:
        result: Obj = self.request("PATCH", path, body=body, content_type=content_type, shape=shape)
        return result

    def replace(self, path: str, body: Obj) -> Obj:
        result: Obj = self.request("PUT", path, body=body)
        return result

    def delete(
        self, path: str, *, preconditions: Mapping[str, str] | None = None, grace_period: int | None = None
    ) -> Any:
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if preconditions:
            body["preconditions"] = dict(preconditions)
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        return self.request("DELETE", path, body=body)

    def list(
        self, path: str, *, label_selector: str | None = None, page_size: int = 500
    ) -> tuple[list[Obj], str]:
        """Every item, paging with limit/continue; (items, the list's resourceVersion)."""
        items, resource_version = self.list_pages(path, label_selector=label_selector, page_size=page_size)
        return list(items), resource_version

    def list_pages(
        self, path: str, *, label_selector: str | None = None, page_size: int = 500, shape: Any = None
    ) -> tuple[Iterator[Obj], str]:
        """Every item, a page at a time, and the list's resourceVersion (the first page's: every page of a
        list is read at that version). The first page is requested now; each next one once the items before
        it were taken, and each item is let go as it is taken: a caller that turns each object into
        something small holds one page of whole objects, not the list (a new leader relisting 100,000
        executor pods held ~6.5 GB as one list, bench/scale.py). Iterate once; a later page that fails
        (410: its continue token expired) raises from the iteration. `shape`: decode only these fields of
        each item (`decode`)."""
        query: dict[str, Any] = {"labelSelector": label_selector, "limit": page_size}
        page_shape = None if shape is None else _list_shape(shape)
        first: Obj = self.request("GET", path, query=query, shape=page_shape)
        resource_version = str((first.get("metadata") or {}).get("resourceVersion", ""))
        return self._items(path, query, first, page_shape), resource_version

    def _items(self, path: str, query: dict[str, Any], page: Obj, shape: Any) -> Iterator[Obj]:
        while True:
            token = (page.get("metadata") or {}).get("continue")
            items: list[Obj] = page.get("items") or []
            del page  # the page's items only, and each only until it is taken
            items.reverse()
            while items:
                yield items.pop()
            if not token:
                return
            page = self.request("GET", path, query={**query, "continue": token}, shape=shape)

    def watch(
        self,
        path: str,
        *,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
        shape: Any = None,
    ) -> Iterator[tuple[str, Obj]]:
        """(type, object) events from `resource_version`, BOOKMARKs included; Gone on 410 (at connect or
        in the stream). The stream ends when the server closes it; the caller resumes from the last
        resourceVersion it saw. `shape`: decode only these fields of each object (`decode`)."""
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_seconds,
            "labelSelector": label_selector,
        }
        resource = resource_of(path)
        try:
            response = self._send("GET", path, query, None, None, (10.0, timeout_seconds + 30.0))
        except (urllib3.exceptions.HTTPError, OSError) as e:
            self._count("watch", resource, 0)
            raise Unavailable(0, "ConnectionError", str(e)) from None
        self._count("watch", resource, response.status)
        if response.status != 200:
            raise _error(response.status, response.read())
        raw = response.response
        try:
            buffer = b""
            for chunk in raw.stream(65536, decode_content=True):
                *lines, buffer = (buffer + chunk).split(b"\n")  # one pass per chunk, whatever its lines
                for line in lines:
                    if line.strip():
                        yield _event(line, shape)
            if buffer.strip():
                yield _event(buffer, shape)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise Unavailable(0, "WatchBroken", str(e)) from None
        finally:
            raw.release_conn()


class Reflector:
    """List then watch one kind of object, forever, until `stop`: every watch of sparkgate runs on this.

    As client-go's reflector does (staging/src/k8s.io/client-go/tools/cache/reflector.go, `ListAndWatch` and
    `watchHandler`):
    - a full list (`on_replace(items)`: the handler diffs it against what it held) only at the start and
      after 410 Gone (the resourceVersion expired); when a stream ends or fails otherwise, a plain re-watch
      from the last resourceVersion seen (events and BOOKMARKs advance it);
    - a watch that ended within `short_watch` seconds without a single event (client-go's "very short
      watch"), a failed request and a 410 count as failures: the next attempt waits a jittered exponential
      backoff, between half and all of `min(backoff_cap, backoff_base * 2^failures)`, so a server that
      closes every watch at once gets a bounded reconnect rate, never a hot loop. An event, or a watch that
      was not very short, resets the count;
    - an exception of a handler (a malformed object, a bug) is contained: counted (`on_crash`), logged with
      its traceback, and the reflector starts again from a fresh list after its backoff (the event may be
      half applied). The thread never ends before `stop`.
    `synced` is true while the view is current: from a successful list or event until a failure.
    `shape`: the fields of each object the handlers read (`decode`); None: the whole object.
    `on_restart(name, cause)`: `timeout` (the stream ended), `short` (a very short watch), `expired` (410),
    `error` (the request failed). Time is injected: `monotonic` measures a watch's life, `wait(seconds)`
    waits out a backoff and returns True when stopped (default: `stop.wait`).
    """

    def __init__(
        self,
        kube: Kube,
        name: str,
        path: str,
        label_selector: str | None,
        on_event: Callable[[str, Obj], None],
        on_replace: Callable[[Iterable[Obj]], None],
        *,
        stop: threading.Event,
        shape: Any = None,
        on_restart: Callable[[str, str], None] | None = None,
        on_crash: Callable[[str], None] | None = None,
        on_progress: Callable[[str], None] | None = None,
        timeout_seconds: int = 240,
        short_watch: float = 1.0,
        backoff_base: float = 0.2,
        backoff_cap: float = 10.0,
        rand: Callable[[], float] = random.random,
        monotonic: Callable[[], float] = time.monotonic,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        self.kube = kube
        self.name = name
        self.path = path
        self.label_selector = label_selector
        self.on_event = on_event
        self.on_replace = on_replace
        self.stop = stop
        self.shape = shape
        self.on_restart = on_restart
        self.on_crash = on_crash
        self.on_progress = on_progress
        self.synced = False
        self.timeout_seconds = timeout_seconds
        self.short_watch = short_watch
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.rand = rand
        self.monotonic = monotonic
        self.wait = wait or stop.wait
        self.resource_version = ""
        self._failures = 0  # in a row
        self.thread = threading.Thread(target=self.run, name=f"reflector-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _restart(self, cause: str) -> None:
        if self.on_restart is not None:
            self.on_restart(self.name, cause)

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.name)

    def backoff(self, failures: int) -> float:
        """The wait after `failures` failures in a row: jittered, never below half its exponential step."""
        step = float(min(self.backoff_cap, self.backoff_base * 2**failures))
        return step / 2 + self.rand() * step / 2

    def run(self) -> None:
        while not self.stop.is_set():
            self._progress()
            try:
                if not self.resource_version:
                    self._list()
                normal = self._watch()
                if self.stop.is_set():
                    return
                if normal:
                    self._failures = 0
                    self._restart("timeout")  # the server ended the stream: resume from the last version
                    continue
                cause = f"very short watch: closed within {self.short_watch:g}s with no event"
                self._restart("short")
            except Gone:
                cause = f"resourceVersion {self.resource_version} expired; relisting"
                self.resource_version = ""
                self._restart("expired")
            except KubeError as e:
                cause = f"{e}"
                self._restart("error")
            except Exception as e:
                cause = f"{type(e).__name__}: {e}"
                log.exception("%s: crashed; restarting from a fresh list", self.name)
                self.resource_version = ""
                if self.on_crash is not None:
                    self.on_crash(self.name)
            self._failures += 1
            self.synced = False
            delay = self.backoff(self._failures)
            log.warning("%s: %s; retrying in %.2fs", self.name, cause, delay)
            if self.wait(delay):
                return

    def _list(self) -> None:
        """A full list handed to `on_replace`, page by page (`Kube.list_pages`): the handler takes each
        object once, in one pass, and must read them all before it changes anything (a later page may fail).
        Its own frame: no listed object (a whole parsed pod is ~65 KB) outlives the handling, let alone the
        watch that follows (bench/scale.py found a replica that had listed 100,000 pods holding 6.5 GB until
        its next relist). The resourceVersion is kept only once the handler has taken the whole list."""
        items, resource_version = self.kube.list_pages(
            self.path, label_selector=self.label_selector, shape=self.shape
        )
        self.on_replace(items)
        self.resource_version = resource_version
        self.synced = True
        self._progress()

    def _watch(self) -> bool:
        """One watch stream until it ends; False when it was very short (no event, ended at once)."""
        started, events = self.monotonic(), 0
        for kind, obj in self.kube.watch(
            self.path,
            resource_version=self.resource_version,
            label_selector=self.label_selector,
            timeout_seconds=self.timeout_seconds,
            shape=self.shape,
        ):
            events += 1
            self._failures = 0
            self.synced = True
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if kind != "BOOKMARK":
                self.on_event(kind, obj)
            if rv:
                self.resource_version = rv
            self._progress()
            if self.stop.is_set():
                return True
        return events > 0 or self.monotonic() - started >= self.short_watch


@functools.cache
def _decoder(shape: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(shape)


def decode(data: bytes, shape: Any = None) -> Any:
    """JSON `data` decoded, whole (orjson), or only the fields of `shape`: a TypedDict (total=False) of what
    the caller reads, nested TypedDicts and lists of them inside. The fields of the shape come out as plain
    dicts and lists, exactly as a whole parse gives them; every other field is skipped without being built
    (msgspec). An executor pod of ~10 KB of which the allocator reads a few fields decodes in ~11 µs where
    orjson builds it whole in ~30 (bench/scale.py). Data that does not fit the shape (an ERROR event's Status
    where a pod was expected, a field of another type) is decoded whole: the caller sees what it would have
    seen without a shape."""
    if shape is not None:
        try:
            return _decoder(shape).decode(data)
        except msgspec.DecodeError:
            pass  # orjson parses it whole, and raises as before for what is not JSON
    return orjson.loads(data)


class Unread(TypedDict, total=False):
    """The shape of an answer the caller does not read (a gate removal's: the whole pod): checked to be
    JSON, nothing of it built."""


# A list's metadata: "continue" is a keyword, hence the functional form.
_ListMeta = TypedDict("_ListMeta", {"resourceVersion": str | None, "continue": str | None}, total=False)


@functools.cache
def _event_shape(shape: Any) -> Any:
    """A watch event whose object has `shape`."""
    event: Any = TypedDict
    return event("WatchEvent", {"type": str, "object": shape}, total=False)


@functools.cache
def _list_shape(shape: Any) -> Any:
    """A list page whose items have `shape`."""
    page: Any = TypedDict
    return page("ListPage", {"metadata": _ListMeta, "items": list[shape]}, total=False)


def _event(line: bytes, shape: Any = None) -> tuple[str, Obj]:
    # A watch event of a Spark executor pod is ~10 KB of JSON: parsing it whole was half of the allocator's
    # time per event with the standard library's parser, orjson halved it, and a shape of the fields read
    # (`decode`) more than halves it again (bench/scale.py).
    event = decode(line, None if shape is None else _event_shape(shape))
    kind, obj = event.get("type", ""), event.get("object") or {}
    if kind == "ERROR":
        obj = orjson.loads(line).get("object") or {}  # its Status whole, whatever the shape kept of it
        raise _error(int(obj.get("code") or 500), json.dumps(obj).encode())
    return kind, obj


def _error(status: int, data: bytes | None) -> KubeError:
    reason, message = "", (data or b"").decode(errors="replace")[:500]
    try:
        document = json.loads(data or b"")
        reason, message = document.get("reason", ""), document.get("message", message)
    except ValueError:
        pass
    return _BY_STATUS.get(status, KubeError)(status, reason, message)


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
