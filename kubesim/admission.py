"""The admission chain of kube-apiserver: built-in plugins, admission webhooks and admission policies.

Order (kubernetes/kubernetes pkg/kubeapiserver/options/plugins.go, `AllOrderedPlugins`, default-on plugins):
mutating phase: the in-tree mutating plugins (podplugins.py: LimitRanger, ServiceAccount, Priority,
DefaultTolerationSeconds, RuntimeClass, PodTopologyLabels), then MutatingAdmissionPolicy
(mutating_policy.py), then MutatingAdmissionWebhook; when a policy or a webhook changed the object, the
whole mutating phase runs once more (k8s.io/apiserver/pkg/admission/reinvocation.go, reinvocation.py):
every in-tree plugin again, and the policies and webhooks with `reinvocationPolicy: IfNeeded` that ran
before a later change. Validating phase: the in-tree validating plugins (ServiceAccount, PodSecurity, Priority,
RuntimeClass), ValidatingAdmissionPolicy (policy.py), ValidatingAdmissionWebhook; ResourceQuota last, in
the store, atomically with the write (quota.py).

Webhooks (https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/): a
webhook is called when a rule matches the operation and the resource (`pods`, `*`, `pods/*`), the
namespace's labels match `namespaceSelector` (every namespace carries `kubernetes.io/metadata.name`), the
object's labels (old or new) match `objectSelector`, and every `matchConditions` CEL expression is true (an
expression that fails to evaluate skips the webhook under `failurePolicy: Ignore` and refuses the request
under `Fail`). The call is an AdmissionReview v1 POSTed over HTTPS verified against `caBundle`, within
`timeoutSeconds` (default 10). A JSONPatch answer is applied and the result defaulted again, as the API
server decodes it; a denial reaches the client as `admission webhook "NAME" denied the request: ...`; a
failed call is ignored under `failurePolicy: Ignore` and refuses the request under `Fail` (the v1 default).
On a dry run (`dryRun=All`) a webhook whose `sideEffects` is not None or NoneOnDryRun is not called and the
request fails with 400 `admission webhook "NAME" does not support dry run`. Connections are kept alive per
thread, as the API server reuses idle HTTP/1.1 connections.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Mapping

from sparkgate.json_patch import PatchError, apply_patch

from . import cel, matching, mutating_policy, podplugins, podrules, policy
from .errors import ApiError, bad_request, forbidden
from .jsondata import encode
from .reinvocation import Reinvocation
from .resources import RESOURCES
from .store import AdmissionRequest, Obj, Store

ServiceResolver = Mapping[tuple[str, str], str]


class _Connection:
    """One kept-alive HTTP/1.1 connection over TLS to a webhook, its certificate verified (and SNI sent) as
    `server_name`. A request is written in one piece and the answer read with as few reads as the bytes
    arrive in: http.client wrote the headers and the body of a review apart and parsed the answer's headers
    with the email package (~0.4 ms a call), and each write or read releases the GIL, which kubesim's busy
    process waited to get back. Answers framed by Content-Length, chunked, or by the end of the connection."""

    def __init__(
        self, host: str, port: int, server_name: str, context: ssl.SSLContext, timeout: float
    ) -> None:
        raw = socket.create_connection((host, port), timeout=timeout)
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock = context.wrap_socket(raw, server_hostname=server_name)
        except BaseException:
            raw.close()
            raise
        self.host = host if port == 443 else f"{host}:{port}"
        self._buffer = b""

    def post(self, target: str, body: bytes, timeout: float) -> tuple[int, bytes, bool]:
        """(status, body, whether the connection may be used again)."""
        self.sock.settimeout(timeout)
        self.sock.sendall(
            b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (target.encode(), self.host.encode(), len(body))
            + body
        )
        head = self._until(b"\r\n\r\n").decode("iso-8859-1").split("\r\n")
        version, _, rest = head[0].partition(" ")
        if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
            raise http.client.BadStatusLine(head[0])
        headers: dict[str, str] = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        reusable = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            data = b""
            while size := int(self._until(b"\r\n").split(b";")[0], 16):
                data += self._exactly(size)
                self._until(b"\r\n")
            self._until(b"\r\n")  # no trailers are sent to kubesim
        elif "content-length" in headers:
            data = self._exactly(int(headers["content-length"]))
        else:
            data, reusable = self._buffer + self._rest(), False
        return int(rest[:3]), data, reusable

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise http.client.RemoteDisconnected("the webhook closed the connection")
        return chunk

    def _until(self, end: bytes) -> bytes:
        while (at := self._buffer.find(end)) < 0:
            self._buffer += self._recv()
        found, self._buffer = self._buffer[:at], self._buffer[at + len(end) :]
        return found

    def _exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            self._buffer += self._recv()
        found, self._buffer = self._buffer[:size], self._buffer[size:]
        return found

    def _rest(self) -> bytes:
        parts = []
        while chunk := self.sock.recv(65536):
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        self.sock.close()


class AdmissionChain:
    """Store.admit (the mutating phase) and Store.validate (the validating phase) of a cluster."""

    def __init__(self, store: Store, webhooks: WebhookAdmission) -> None:
        self.store = store
        self.webhooks = webhooks

    def mutate(self, request: AdmissionRequest) -> Obj | None:
        """The admitted object. The request's object is the caller's own copy (the store's `create` and
        `_update` make it) and is changed in place, as the in-tree plugins change kube-apiserver's."""
        if request.obj is None:
            return None
        obj = request.obj
        context = Reinvocation()
        obj = self._mutating_phase(request, obj, context)
        if context.should_reinvoke:
            context.is_reinvoke = True
            obj = self._mutating_phase(request, obj, context)
        return obj

    def _mutating_phase(self, request: AdmissionRequest, obj: Obj, context: Reinvocation) -> Obj:
        podplugins.mutate(self.store, request, obj)
        obj = mutating_policy.mutate(self.store, request, obj, context)
        return self.webhooks.mutate(request, obj, context)

    def validate(self, request: AdmissionRequest, obj: Obj | None) -> None:
        if obj is not None:
            podplugins.validate(self.store, request, obj)
        policy.validate(self.store, request, obj)
        self.webhooks.validate(request, obj)


class WebhookAdmission:
    def __init__(self, store: Store, *, services: ServiceResolver | None = None) -> None:
        self.store = store
        self.services: dict[tuple[str, str], str] = dict(services or {})
        self.calls = 0  # webhook calls made, for tests and the demo's report
        self._local = threading.local()
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()

    def mutate(self, request: AdmissionRequest, obj: Obj, context: Reinvocation) -> Obj:
        """One pass of the mutating webhooks (mutating/dispatcher.go), reinvocation bookkeeping included."""
        state = context.plugin("MutatingAdmissionWebhook")
        if context.is_reinvoke and state.output_changed(obj):
            state.require_reinvoking_previously_invoked()  # the in-tree plugins or a policy changed it
        for config, webhook in self._webhooks("mutatingwebhookconfigurations"):
            key = f"{config['metadata']['name']}/{webhook.get('name', '')}"
            if not self._should_call(webhook, request, obj):
                continue
            if context.is_reinvoke and key not in state.reinvoke:
                continue
            patched = self._call(webhook, request, obj, mutating=True)
            if patched is not None and patched != obj:
                obj = patched
                state.require_reinvoking_previously_invoked()
                context.should_reinvoke = True
            if webhook.get("reinvocationPolicy") == "IfNeeded":
                state.previously_invoked.add(key)
        state.set_last_output(obj)
        return obj

    def validate(self, request: AdmissionRequest, obj: Obj | None) -> None:
        for _, webhook in self._webhooks("validatingwebhookconfigurations"):
            if self._should_call(webhook, request, obj):
                self._call(webhook, request, obj, mutating=False)

    def _webhooks(self, resource: str) -> list[tuple[Obj, Obj]]:
        configs, _, _ = self.store.list_objects(resource)
        return [(c, w) for c in configs for w in c.get("webhooks") or []]

    def _should_call(self, webhook: Obj, request: AdmissionRequest, obj: Obj | None) -> bool:
        if not matching.matches(self.store, request, obj, webhook):
            return False
        conditions = webhook.get("matchConditions") or []
        if conditions:
            variables = cel.Inputs(
                {"object": obj, "oldObject": request.old, "request": matching.cel_request(request, obj)}
            )
            error = matching.match_conditions(conditions, variables, webhook.get("failurePolicy", "Fail"))
            if error == "":
                return False
            if error is not None:
                meta = (obj or request.old or {}).get("metadata") or {}
                r = RESOURCES[request.resource]
                raise forbidden(request.resource, meta.get("name") or request.name, error, group=r.group)
        if request.dry_run and webhook.get("sideEffects") not in ("None", "NoneOnDryRun"):
            raise bad_request(f'admission webhook "{webhook.get("name", "")}" does not support dry run')
        return True

    def _call(
        self, webhook: Obj, request: AdmissionRequest, obj: Obj | None, *, mutating: bool
    ) -> Obj | None:
        name = webhook.get("name", "")
        body = matching.review_request(request, obj)
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}
        try:
            url = self._url(webhook.get("clientConfig") or {})
            answer = self._post(url, webhook, review)
            response = answer.get("response") or {}
            if response.get("uid") != body["uid"]:
                raise ValueError(f"expected response.uid={body['uid']!r}, got {response.get('uid')!r}")
        except (OSError, ValueError, http.client.HTTPException) as e:
            if webhook.get("failurePolicy", "Fail") == "Ignore":
                return obj
            raise ApiError(
                500, "InternalError", f'Internal error occurred: failed calling webhook "{name}": {e}'
            ) from None
        if not response.get("allowed"):
            status = response.get("status") or {}
            code = int(status.get("code") or 403)
            message = status.get("message") or ""
            raise ApiError(
                code,
                status.get("reason") or "Forbidden",
                f'admission webhook "{name}" denied the request: {message}'.rstrip(": "),
            )
        if mutating and response.get("patch") and obj is not None:
            try:
                ops = json.loads(base64.b64decode(response["patch"]))
                patched: Obj = apply_patch(obj, ops)
            except (ValueError, PatchError) as e:
                if webhook.get("failurePolicy", "Fail") == "Ignore":
                    return obj
                raise ApiError(
                    500,
                    "InternalError",
                    f'Internal error occurred: failed calling webhook "{name}": the patch does not apply: {e}',
                ) from None
            if request.resource == "pods":
                podrules.default_pod(patched)  # the API server decodes the patched object with defaulting
            return patched
        return obj

    def _url(self, client_config: Obj) -> str:
        if client_config.get("url"):
            return str(client_config["url"])
        service = client_config.get("service") or {}
        key = (service.get("namespace", ""), service.get("name", ""))
        base = self.services.get(key)
        if base is None:
            raise OSError(f"service {key[0]}/{key[1]} has no endpoints in kubesim")
        return base.rstrip("/") + (service.get("path") or "")

    def _context(self, ca_bundle: str) -> ssl.SSLContext:
        digest = hashlib.sha256(ca_bundle.encode()).hexdigest()
        with self._lock:
            context = self._contexts.get(digest)
            if context is None:
                context = ssl.create_default_context()
                if ca_bundle:
                    context = ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode())
                self._contexts[digest] = context
            return context

    def _post(self, url: str, webhook: Obj, review: Obj) -> Obj:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "https":
            raise ValueError(f"webhook URL {url} is not https")
        timeout = min(float(webhook.get("timeoutSeconds") or 10), 30.0)
        client_config = webhook.get("clientConfig") or {}
        ca_bundle = client_config.get("caBundle") or ""
        # A webhook reached through a Service is verified as `<name>.<namespace>.svc`, whatever address its
        # endpoint has (kube-apiserver's service resolver; the admission webhook docs: "the server
        # certificate must be valid for the host name <svc_name>.<svc_namespace>.svc").
        service = client_config.get("service")
        server_name = (
            f"{service.get('name')}.{service.get('namespace')}.svc" if service else parts.hostname or ""
        )
        pool: dict[tuple[str, int, str, str], _Connection] = self._local.__dict__.setdefault("pool", {})
        key = (parts.hostname or "", parts.port or 443, ca_bundle, server_name)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        body = encode(review)
        for attempt in (1, 2):  # a kept-alive connection the server closed is retried once on a new one
            conn = pool.pop(key, None)
            fresh = conn is None
            try:
                if conn is None:
                    conn = _Connection(key[0], key[1], server_name, self._context(ca_bundle), timeout)
                self.calls += 1
                status, data, reusable = conn.post(target, body, timeout)
            except (OSError, http.client.HTTPException, ValueError):
                if conn is not None:
                    conn.close()
                if fresh or attempt == 2:
                    raise
                continue
            if reusable:
                pool[key] = conn
            else:
                conn.close()
            if status != 200:
                raise ValueError(f"the webhook answered HTTP {status}: {data[:200]!r}")
            document: Obj = json.loads(data)
            return document
        raise OSError("unreachable")

    def close(self) -> None:
        for conn in (self._local.__dict__.get("pool") or {}).values():
            conn.close()
