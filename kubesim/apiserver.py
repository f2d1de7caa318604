"""kubesim's API server: the Kubernetes REST API over HTTP/1.1 on loopback, for the official client.

Plain HTTP on 127.0.0.1 (the client accepts an http:// server in a kubeconfig) with bearer tokens, so
tests act as different users. Paths, verbs, query parameters, list and watch documents, and `Status`
failures follow https://kubernetes.io/docs/reference/using-api/api-concepts/. A watch is a chunked stream
of JSON lines; `allowWatchBookmarks` adds BOOKMARK events, `timeoutSeconds` ends it, a resourceVersion
that was compacted away gets 410 at connect or an ERROR event in the stream.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable, Collection, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from .apply import manager_of
from .errors import ApiError, UserInfo, bad_request
from .faults import WRITES, Faults, LoggedRequest, RequestLog
from .impersonation import PlainTextError, impersonate
from .jsondata import encode
from .resources import BUILT_IN, RESOURCES, SUBRESOURCES, groups
from .store import Store

ADMIN = UserInfo("admin", "admin", ("system:masters", "system:authenticated"))


class Route:
    def __init__(self, resource: str, namespace: str | None, name: str | None, subresource: str) -> None:
        self.resource = resource
        self.namespace = namespace
        self.name = name
        self.subresource = subresource

    @property
    def audited(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def parse_path(path: str, served: Collection[str] = BUILT_IN) -> Route | None:
    """The route of a resource path among the `served` resources (a CRD not installed is not found)."""
    parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis" and groups(served).get(parts[1]) == parts[2]:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or rest[0] not in served or RESOURCES[rest[0]].group != group:
        return None
    resource = RESOURCES[rest[0]]
    if namespace is not None and not resource.namespaced:
        return None
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else ""
    if len(rest) > 3 or (sub and (rest[0], sub) not in SUBRESOURCES):
        return None
    return Route(rest[0], namespace, name, sub)


def _somaxconn() -> int:
    try:
        return int(Path("/proc/sys/net/core/somaxconn").read_text())
    except (OSError, ValueError):
        return socket.SOMAXCONN


class _Listener(ThreadingHTTPServer):
    """kube-apiserver listens with the kernel's largest backlog (Go's net.Listen reads
    /proc/sys/net/core/somaxconn: net/sock_linux.go, maxListenerBacklog); socketserver's default of 5
    dropped the SYNs of a client opening 16 connections at once, which its kernel resent 1 s later."""

    request_queue_size = _somaxconn()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that reset or closed its kept-alive connection is not an error: Go's net/http server
        returns quietly on a read error of the next request (net/http/server.go `conn.serve`,
        `isCommonNetReadError`), and so does kubesim. Anything else is a kubesim bug, printed with its
        traceback as socketserver does."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class ApiServer:
    def __init__(
        self,
        store: Store,
        *,
        tokens: Mapping[str, UserInfo] | None = None,
        faults: Faults | None = None,
        log: RequestLog | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        bookmark_interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.tokens: dict[str, UserInfo] = dict(tokens or {})
        self.faults = faults or Faults()
        self.log = log or RequestLog()
        self.bookmark_interval = bookmark_interval
        self.clock = clock
        self._stopping = threading.Event()
        server = self

        class Handler(_Handler):
            api = server

        self._http = _Listener((host, port), Handler)
        self._http.daemon_threads = True
        self.url = f"http://{host}:{self._http.server_address[1]}"
        self._thread: threading.Thread | None = None

    def add_user(self, token: str, user: UserInfo) -> None:
        self.tokens[token] = user

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._http.serve_forever, name="kubesim-apiserver", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self.faults.resume()
        self.store.close_watches()
        self._http.shutdown()
        self._http.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()


class _Handler(BaseHTTPRequestHandler):
    api: ApiServer
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: the status line and headers go out before the body, and with Nagle's algorithm the body
    # waited for the client's delayed ACK (~40 ms on every request), as Go's net/http never does.
    disable_nagle_algorithm = True
    # A buffered writer: an answer's status line, headers and body leave in one write, when the handler
    # returns (BaseHTTPRequestHandler.handle_one_request flushes; a watch flushes each event). Unbuffered,
    # the headers and the body were two sends, each a trip through the kernel's loopback (the receiver's
    # side included) and a release of the GIL: 14 % of kubesim's CPU with five drivers creating through
    # sparkgate's webhook (py-spy).
    wbufsize = 1 << 16
    _raw_body = b""
    _logged = False
    _record: Callable[..., None]  # (code, resource_version=0, lost_as=None): the request logged once

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    # --- plumbing -------------------------------------------------------------------------------------

    def _send(self, code: int, document: Any, headers: Mapping[str, str] | None = None) -> None:
        body = encode(document)
        rv = ((document.get("metadata") or {}) if isinstance(document, dict) else {}).get("resourceVersion")
        self._record(code, int(rv) if isinstance(rv, str) and rv.isdecimal() else 0)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _lose(self, code: int, document: Any, answer: int) -> None:
        """A write applied whose answer is lost (Faults.lose): logged as applied, and the client gets
        `answer` instead: nothing (0: the connection closed), or the error a proxy or kube-apiserver's
        timeout filter gives."""
        rv = ((document.get("metadata") or {}) if isinstance(document, dict) else {}).get("resourceVersion")
        self._record(code, int(rv) if isinstance(rv, str) and rv.isdecimal() else 0, answer)
        if answer == 0:
            self.close_connection = True
        elif answer == 502:
            self._send_text(502, "Bad Gateway")  # a proxy's own page, not a Status
        elif answer == 504:  # filters/timeout.go: NewTimeoutError("request did not complete ...", 0)
            message = "Timeout: request did not complete within the allotted timeout"
            self._send(504, ApiError(504, "Timeout", message).status())
        else:
            message = "Internal error occurred: kubesim: the answer was lost after the write was applied"
            self._send(500, ApiError(500, "InternalError", message).status())

    def _send_text(self, code: int, text: str) -> None:
        """Go's http.Error: a plain-text answer, not a Status."""
        body = (text + "\n").encode()
        self._record(code, 0)
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> Any:
        raw = self._raw_body
        if not raw:
            return None
        if _media_type(self.headers.get("Content-Type", "")) in APPLY_TYPES:
            try:  # patch.go applyPatcher: yaml.Unmarshal (JSON is YAML)
                return yaml.safe_load(raw)
            except yaml.YAMLError as e:
                raise bad_request(f"error decoding YAML: {e}") from None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise bad_request(f"the body of the request could not be decoded as JSON: {e}") from None

    def _user(self) -> UserInfo | None:
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return self.api.tokens.get(auth[7:].strip())
        return None

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self._raw_body = self.rfile.read(length) if length else b""  # always, to keep the connection in sync
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        requestor = user = self._user()
        route = parse_path(url.path, self.api.store.served)
        verb = _verb(method, route, query)
        self._logged = False

        def record(code: int, resource_version: int = 0, lost_as: int | None = None) -> None:
            # Logged before the response goes out, so a client that got its answer finds its entry.
            if not self._logged:
                self._logged = True
                self.api.log.add(
                    LoggedRequest(
                        time.time(),
                        requestor.username if requestor else "",
                        verb,
                        route.audited if route else url.path,
                        route.namespace if route else None,
                        route.name if route else None,
                        code,
                        url.path,
                        url.query,
                        route.subresource if route else "",
                        requestor.pod if requestor else "",
                        resource_version if verb in WRITES and 200 <= code < 300 else 0,
                        user.username if user is not requestor and user else "",
                        lost_as,
                    )
                )

        self._record = record
        try:
            if requestor is None:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            user = impersonate(requestor, self.headers.items(), self.path)
            if route is None:
                self._discovery(url.path)
                return
            if self.api.faults.hold(verb, route.audited, route.namespace):  # a hang: no answer at all
                self._record(0, 0)
                self.close_connection = True
                return
            seconds, injected = self.api.faults.consult(verb, route.audited, route.namespace)
            if seconds:
                time.sleep(seconds)  # injected latency
            if injected is not None:
                headers = (
                    {"Retry-After": str(injected.retry_after)} if injected.retry_after is not None else None
                )
                raise _Injected(injected.code, headers)
            if verb == "watch":
                self._watch(route, query)
                return
            code, document = self._dispatch(method, verb, route, query, user)
            if verb in WRITES and 200 <= code < 300:
                lost = self.api.faults.lost(verb, route.audited, route.namespace)
                if lost is not None:
                    self._lose(code, document, lost)
                    return
            self._send(code, document)
        except _Injected as e:
            code = e.code
            reason = {
                429: "TooManyRequests",
                409: "Conflict",
                500: "InternalError",
                503: "ServiceUnavailable",
            }.get(code, "InternalError")
            self._send(code, ApiError(code, reason, f"kubesim: injected {code}").status(), e.headers)
        except ApiError as e:
            self._send(e.code, e.status())
        except PlainTextError as e:
            self._send_text(e.code, e.text)
        except ValueError as e:
            self._send(400, bad_request(str(e)).status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # a kubesim bug: answer as kube-apiserver answers a panic, and show it
            traceback.print_exc()
            self._send(500, ApiError(500, "InternalError", f"kubesim: {e!r}").status())
        finally:
            record(500)  # an answer that never went out

    def _discovery(self, path: str) -> None:
        path = path.rstrip("/")
        served = self.api.store.served
        if path == "/version":
            self._send(
                200, {"major": "1", "minor": "36", "gitVersion": "v1.36.0-kubesim", "platform": "linux/amd64"}
            )
        elif path == "/api":
            self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        elif path == "/apis":
            self._send(
                200,
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [
                        {
                            "name": g,
                            "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                            "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v},
                        }
                        for g, v in groups(served).items()
                        if g
                    ],
                },
            )
        elif path.startswith("/apis/") and path.count("/") == 2 and path[len("/apis/") :] in groups(served):
            group = path[len("/apis/") :]
            version = {"groupVersion": f"{group}/{groups(served)[group]}", "version": groups(served)[group]}
            self._send(
                200,
                {
                    "kind": "APIGroup",
                    "apiVersion": "v1",
                    "name": group,
                    "versions": [version],
                    "preferredVersion": version,
                },
            )
        elif path == "/api/v1" or (
            path.startswith("/apis/")
            and path.count("/") == 3
            and path[len("/apis/") :].split("/")[0] in groups(served)
        ):
            group_version = "v1" if path == "/api/v1" else path[len("/apis/") :]
            listed = [r for p, r in RESOURCES.items() if p in served and r.api_version == group_version]
            self._send(
                200,
                {
                    "kind": "APIResourceList",
                    "apiVersion": "v1",
                    "groupVersion": group_version,
                    "resources": [r.describe() for r in listed]
                    + [
                        r.describe_subresource(s)
                        for r in listed
                        for p, s in sorted(SUBRESOURCES)
                        if p == r.plural
                    ],
                },
            )
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _dispatch(
        self, method: str, verb: str, route: Route, query: Mapping[str, str], user: UserInfo
    ) -> tuple[int, Any]:
        store = self.api.store
        r = RESOURCES[route.resource]
        if verb == "list":
            limit = int(query["limit"]) if query.get("limit") else None
            items, rv, token = store.list(
                route.resource,
                route.namespace,
                label_selector=query.get("labelSelector"),
                field_selector=query.get("fieldSelector"),
                limit=limit,
                continue_token=query.get("continue"),
            )
            meta: dict[str, Any] = {"resourceVersion": rv}
            if token is not None:
                meta["continue"] = token
            return 200, {"kind": r.list_kind, "apiVersion": r.api_version, "metadata": meta, "items": items}
        if verb == "get":
            assert route.name is not None
            return 200, store.get(route.resource, route.namespace, route.name)
        body = self._body()
        if verb == "create" and route.subresource == "binding":
            assert route.name is not None and route.namespace is not None
            target = ((body or {}).get("target") or {}).get("name")
            if not target:
                raise bad_request("binding.target.name is required")
            store.bind(route.namespace, route.name, target, user=user)
            return 201, {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            }
        dry = _dry_run(query)
        manager = manager_of(query.get("fieldManager", ""), self.headers.get("User-Agent", ""))
        if verb == "create":
            return 201, store.create(
                route.resource, body, namespace=route.namespace, user=user, dry_run=dry, manager=manager
            )
        if verb == "update":
            assert route.name is not None
            return 200, store.replace(
                route.resource,
                route.namespace,
                route.name,
                body,
                subresource=route.subresource,
                user=user,
                dry_run=dry,
                manager=manager,
            )
        if verb == "patch":
            assert route.name is not None
            content_type = self.headers.get("Content-Type", "")
            if _media_type(content_type) in APPLY_TYPES and not route.subresource:
                applied, created = store.apply(
                    route.resource,
                    route.namespace,
                    route.name,
                    body,
                    query.get("fieldManager", ""),
                    force=query.get("force") in ("true", "1"),
                    user=user,
                    dry_run=dry,
                )
                return 201 if created else 200, applied
            if "force" in query:  # validation.ValidatePatchOptions
                raise ApiError(
                    422,
                    "Invalid",
                    'PatchOptions.meta.k8s.io "" is invalid: force: Forbidden: may not be specified for '
                    "non-apply patch",
                )
            return 200, store.patch(
                route.resource,
                route.namespace,
                route.name,
                body,
                content_type,
                subresource=route.subresource,
                user=user,
                dry_run=dry,
                manager=manager,
            )
        if verb == "delete":
            assert route.name is not None
            options = body or {}
            grace = query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
            deleted = store.delete(
                route.resource,
                route.namespace,
                route.name,
                grace_period_seconds=int(grace) if grace is not None else None,
                preconditions=options.get("preconditions"),
                propagation_policy=query.get("propagationPolicy", options.get("propagationPolicy")),
                user=user,
                dry_run=dry,
            )
            return 200, deleted
        if verb == "deletecollection":
            items = store.delete_collection(
                route.resource,
                route.namespace,
                label_selector=query.get("labelSelector"),
                field_selector=query.get("fieldSelector"),
            )
            return 200, {"kind": r.list_kind, "apiVersion": r.api_version, "metadata": {}, "items": items}
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {route.audited}")

    # --- watch ----------------------------------------------------------------------------------------

    def _chunk(self, document: Any) -> None:
        data = encode(document) + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _watch(self, route: Route, query: Mapping[str, str]) -> None:
        api = self.api
        try:
            stream = api.store.watch(
                route.resource,
                route.namespace,
                resource_version=query.get("resourceVersion"),
                label_selector=query.get("labelSelector"),
                field_selector=query.get("fieldSelector"),
                name=route.name,
            )
        except ApiError as e:
            if e.code != 410:
                raise  # a bad selector or version: answered as an error, before the response starts
            # A version too old: the watch cache answers with a watcher whose only event is the error
            # (cacher.go `Watch`: "other errors must fail with a watch event of type ERROR, rather than a
            # directly returned error", `newErrWatcher`), so the client sees 200 and one ERROR event.
            self._record(200, 0)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._chunk({"type": "ERROR", "object": e.status()})
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return
        # Registered before the client sees the response start, so a test that drops watches once the
        # client's stream is open always finds it.
        unregister = api.faults.register_watch(route.resource, stream.close)
        try:
            self._record(200, 0)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()  # the response starts now, before any event: the client's watch is open
            bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
            deadline = api.clock() + float(query.get("timeoutSeconds") or 1800)
            next_bookmark = api.clock() + api.bookmark_interval
            while not api.stopping:
                now = api.clock()
                if now >= deadline:
                    break
                if bookmarks and now >= next_bookmark:
                    r = RESOURCES[route.resource]
                    bookmark = {"resourceVersion": stream.resource_version}
                    self._chunk(
                        {
                            "type": "BOOKMARK",
                            "object": {"kind": r.kind, "apiVersion": r.api_version, "metadata": bookmark},
                        }
                    )
                    next_bookmark = now + api.bookmark_interval
                wait = min(deadline, next_bookmark if bookmarks else deadline) - now
                item = stream.next(min(max(wait, 0.0), 0.5))
                if item is not None:
                    self._chunk({"type": item[0], "object": item[1]})
                elif stream.closed:
                    break
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            unregister()
            # A watch that ran its timeoutSeconds, or that the store ended (Watch.end: its history compacted
            # away, too far behind), leaves the connection reusable, as Go's net/http does when a handler
            # returns: the client pools it, and its next watch gets the ERROR. A dropped one (the faults'
            # broken connection) or one the server stops with closes it.
            if (stream.closed and not stream.ended) or api.stopping:
                self.close_connection = True
            stream.close()


class _Injected(Exception):
    def __init__(self, code: int, headers: Mapping[str, str] | None) -> None:
        super().__init__(code)
        self.code = code
        self.headers = headers


APPLY_TYPES = ("application/apply-patch+yaml",)


def _media_type(content_type: str) -> str:
    return content_type.split(";")[0].strip()


def _dry_run(query: Mapping[str, str]) -> bool:
    """`dryRun=All`, the only value the API accepts (kube-apiserver answers another with 422; kubesim's 400
    names the problem in its own words)."""
    value = query.get("dryRun")
    if value is None:
        return False
    if value != "All":
        raise bad_request(f'kubesim: dryRun must be "All", got "{value}"')
    return True


def _verb(method: str, route: Route | None, query: Mapping[str, str]) -> str:
    if method == "GET":
        if query.get("watch") in ("true", "1"):
            return "watch"
        return "get" if route is not None and route.name else "list"
    if method == "POST":
        return "create"
    if method == "PUT":
        return "update"
    if method == "PATCH":
        return "patch"
    if method == "DELETE":
        return "delete" if route is not None and route.name else "deletecollection"
    return method.lower()
