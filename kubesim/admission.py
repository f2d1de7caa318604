"""Dynamic admission as kube-apiserver does it: mutating webhooks, then validating webhooks.

https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/ — a webhook is
called when a rule matches the operation and the resource (`pods`, `*`, `pods/*`), the namespace's labels
match `namespaceSelector` (every namespace carries `kubernetes.io/metadata.name`), and the object's labels
(old or new) match `objectSelector`. The call is an AdmissionReview v1 POSTed over HTTPS verified against
`caBundle`, within `timeoutSeconds` (default 10). A JSONPatch answer is applied; a denial reaches the client
as `admission webhook "NAME" denied the request: ...`; a failed call is ignored under `failurePolicy:
Ignore` and refuses the request under `Fail` (the v1 default). Connections are kept alive per thread, as
the API server reuses idle HTTP/1.1 connections.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import ssl
import threading
import urllib.parse
import uuid
from collections.abc import Mapping
from typing import Any

from sparkgate.json_patch import PatchError, apply_patch

from .errors import ApiError
from .resources import RESOURCES
from .selectors import match_label_selector_object
from .store import AdmissionRequest, Obj, Store

ServiceResolver = Mapping[tuple[str, str], str]


class WebhookAdmission:
    def __init__(self, store: Store, *, services: ServiceResolver | None = None) -> None:
        self.store = store
        self.services: dict[tuple[str, str], str] = dict(services or {})
        self.calls = 0  # webhook calls made, for tests and the demo's report
        self._local = threading.local()
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()

    def __call__(self, request: AdmissionRequest) -> Obj | None:
        obj = request.obj
        for config, webhook in self._webhooks("mutatingwebhookconfigurations"):
            if self._matches(webhook, request, obj):
                obj = self._call(config, webhook, request, obj, mutating=True)
        for config, webhook in self._webhooks("validatingwebhookconfigurations"):
            if self._matches(webhook, request, obj):
                self._call(config, webhook, request, obj, mutating=False)
        return obj

    def _webhooks(self, resource: str) -> list[tuple[Obj, Obj]]:
        configs, _, _ = self.store.list_objects(resource)
        return [(c, w) for c in configs for w in c.get("webhooks") or []]

    def _matches(self, webhook: Obj, request: AdmissionRequest, obj: Obj | None) -> bool:
        resource = RESOURCES[request.resource]
        target = f"{request.resource}/{request.subresource}" if request.subresource else request.resource
        if not any(
            _rule_matches(rule, request.operation, resource.group, resource.version, target)
            for rule in webhook.get("rules") or []
        ):
            return False
        if resource.namespaced and webhook.get("namespaceSelector"):
            try:
                namespace = self.store.get("namespaces", None, request.namespace)
            except ApiError:
                return False
            if not match_label_selector_object(
                webhook["namespaceSelector"], namespace["metadata"].get("labels") or {}
            ):
                return False
        selector = webhook.get("objectSelector")
        if selector:
            candidates = [o for o in (obj, request.old) if o is not None]
            if not any(
                match_label_selector_object(selector, (o.get("metadata") or {}).get("labels") or {})
                for o in candidates
            ):
                return False
        return True

    def _review(self, request: AdmissionRequest, obj: Obj | None) -> Obj:
        r = RESOURCES[request.resource]
        gvk = {"group": r.group, "version": r.version, "kind": r.kind}
        gvr = {"group": r.group, "version": r.version, "resource": request.resource}
        body: Obj = {
            "uid": str(uuid.uuid4()),
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": request.name,
            "namespace": request.namespace,
            "operation": request.operation,
            "userInfo": request.user.review(),
            "object": obj,
            "oldObject": request.old,
            "dryRun": request.dry_run,
            "options": {
                "kind": "CreateOptions" if request.operation == "CREATE" else "UpdateOptions",
                "apiVersion": "meta.k8s.io/v1",
            },
        }
        if request.subresource:
            body["subResource"] = request.subresource
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}

    def _call(
        self, config: Obj, webhook: Obj, request: AdmissionRequest, obj: Obj | None, *, mutating: bool
    ) -> Obj | None:
        name = webhook.get("name", "")
        review = self._review(request, obj)
        try:
            url = self._url(webhook.get("clientConfig") or {})
            answer = self._post(url, webhook, review)
            response = answer.get("response") or {}
            if response.get("uid") != review["request"]["uid"]:
                raise ValueError(
                    f"expected response.uid={review['request']['uid']!r}, got {response.get('uid')!r}"
                )
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
                return patched
            except (ValueError, PatchError) as e:
                if webhook.get("failurePolicy", "Fail") == "Ignore":
                    return obj
                raise ApiError(
                    500,
                    "InternalError",
                    f'Internal error occurred: failed calling webhook "{name}": the patch does not apply: {e}',
                ) from None
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
        ca_bundle = (webhook.get("clientConfig") or {}).get("caBundle") or ""
        pool: dict[tuple[str, int, str], http.client.HTTPSConnection] = self._local.__dict__.setdefault(
            "pool", {}
        )
        key = (parts.hostname or "", parts.port or 443, ca_bundle)
        body = json.dumps(review).encode()
        for attempt in (1, 2):  # a kept-alive connection the server closed is retried once on a new one
            conn = pool.get(key)
            fresh = conn is None
            if conn is None:
                conn = http.client.HTTPSConnection(
                    key[0], key[1], context=self._context(ca_bundle), timeout=timeout
                )
                pool[key] = conn
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            try:
                self.calls += 1
                conn.request(
                    "POST",
                    parts.path + (f"?{parts.query}" if parts.query else ""),
                    body,
                    {"Content-Type": "application/json"},
                )
                answer = conn.getresponse()
                data = answer.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                pool.pop(key, None)
                if fresh or attempt == 2:
                    raise
                continue
            if answer.status != 200:
                raise ValueError(f"the webhook answered HTTP {answer.status}: {data[:200]!r}")
            document: Obj = json.loads(data)
            return document
        raise OSError("unreachable")

    def close(self) -> None:
        for conn in (self._local.__dict__.get("pool") or {}).values():
            conn.close()


def _rule_matches(rule: Obj, operation: str, group: str, version: str, resource: str) -> bool:
    def has(values: Any, value: str) -> bool:
        return "*" in (values or []) or value in (values or [])

    if not has(rule.get("operations"), operation):
        return False
    if not has(rule.get("apiGroups"), group) or not has(rule.get("apiVersions"), version):
        return False
    resources = rule.get("resources") or []
    main = resource.split("/")[0]
    return any(
        r == resource or r == "*" or (r == f"{main}/*" and "/" in resource) or (r == "*/*") for r in resources
    )
