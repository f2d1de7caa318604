"""The AdmissionReview v1 envelope: reading a request strictly, writing a response.

Kept apart from the Flask app (and its metrics) so the CLI can read reviews without starting
prometheus-client before its multiprocess directory is known.
"""

from __future__ import annotations

import json
from typing import Any

# kube-apiserver takes a request body of up to 3 MiB, so a pod is at most that; an UPDATE's review carries it
# twice (object and oldObject), plus the envelope.
MAX_BODY = 8 * 1024 * 1024
# Seconds the webhook waits for each read of a body (and each write of its answer) before it gives up on the
# client: the API server sends a review at once, and a thread waiting on a stalled client serves no one else.
BODY_TIMEOUT = 5.0


class BadReview(ValueError):
    pass


def parse_review(body: bytes) -> dict[str, Any]:
    """The `request` of an AdmissionReview v1, or BadReview saying what is wrong."""
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadReview(f"the body is not JSON: {e}") from None
    except RecursionError:
        raise BadReview("the body is nested too deeply") from None
    if not isinstance(review, dict):
        raise BadReview("the body is not a JSON object")
    if review.get("kind") != "AdmissionReview" or review.get("apiVersion") != "admission.k8s.io/v1":
        raise BadReview(
            "expected an AdmissionReview of apiVersion admission.k8s.io/v1, got "
            f"kind={review.get('kind')!r} apiVersion={review.get('apiVersion')!r}"
        )
    req = review.get("request")
    if not isinstance(req, dict):
        raise BadReview("AdmissionReview.request is missing or not an object")
    if not isinstance(req.get("uid"), str) or not req["uid"]:
        raise BadReview("AdmissionReview.request.uid is missing")
    if not isinstance(req.get("operation"), str):
        raise BadReview("AdmissionReview.request.operation is missing")
    for key in ("kind", "resource", "userInfo", "object", "oldObject"):
        if req.get(key) is not None and not isinstance(req[key], dict):
            raise BadReview(f"AdmissionReview.request.{key} is not an object")
    user = req.get("userInfo") or {}
    if user.get("username") is not None and not isinstance(user["username"], str):
        raise BadReview("AdmissionReview.request.userInfo.username is not a string")
    groups = user.get("groups")
    if groups is not None and not (isinstance(groups, list) and all(isinstance(g, str) for g in groups)):
        raise BadReview("AdmissionReview.request.userInfo.groups is not a list of strings")
    return req


def review_response(uid: str, response: dict[str, Any]) -> dict[str, Any]:
    # `response` stays the last member, `uid` its first: webhook/app.py `_answer` writes the patch after the
    # encoded document's last two braces.
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, **response},
    }
