"""Failures as kube-apiserver reports them: a `Status` object with a code, a reason and a message."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            out["details"] = self.details
        return out


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource})


def already_exists(resource: str, name: str) -> ApiError:
    return ApiError(
        409, "AlreadyExists", f'{resource} "{name}" already exists', {"name": name, "kind": resource}
    )


def generate_name_conflict(resource: str, name: str) -> ApiError:
    """A create with generateName whose every generated name was taken (apimachinery errors.go
    `NewGenerateNameConflict(gr, name, 1)`, from rest.CheckGeneratedNameError)."""
    return ApiError(
        409,
        "AlreadyExists",
        f'{resource} "{name}" already exists, the server was not able to generate a unique name for the object',
        {"name": name, "kind": resource, "retryAfterSeconds": 1},
    )


def conflict(resource: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {resource} "{name}": {why}',
        {"name": name, "kind": resource},
    )


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(kind: str, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """422 Invalid, message shaped like `Pod "x" is invalid: spec.schedulingGates: Forbidden: ...`."""
    text = "; ".join(f"{field}: {message}" for field, message in causes)
    return ApiError(
        422,
        "Invalid",
        f'{kind} "{name}" is invalid: {text}',
        {"name": name, "kind": kind, "causes": [{"field": f, "message": m} for f, m in causes]},
    )


def forbidden(resource: str, name: str, why: str, *, group: str = "") -> ApiError:
    """admission.NewForbidden: 403 `pods "x" is forbidden: WHY` (the resource qualified by its group)."""
    qualified = f"{resource}.{group}" if group else resource
    details: dict[str, Any] = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    return ApiError(403, "Forbidden", f'{qualified} "{name}" is forbidden: {why}', details)


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"


@dataclass(frozen=True)
class UserInfo:
    """Who a bearer token authenticates as. `pod`: the pod a service account token is bound to, which
    kube-apiserver reports in the user's extra as `authentication.kubernetes.io/pod-name`
    (pkg/serviceaccount/util.go, `PodNameKey` in `ServiceAccountInfo.UserInfo`), so the replicas of one
    service account are told apart. Not modelled: the `pod-uid` extra that comes with it, and the
    credential id and node extras of newer versions."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    pod: str = ""

    def review(self) -> dict[str, Any]:
        review: dict[str, Any] = {"username": self.username, "uid": self.uid, "groups": list(self.groups)}
        if self.pod:
            review["extra"] = {POD_NAME_EXTRA: [self.pod]}
        return review
