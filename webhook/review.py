"""The AdmissionReview v1 envelope: reading a request strictly, writing a response.

Kept apart from the Flask app (and its metrics) so the CLI can read reviews without starting
prometheus-client before its multiprocess directory is known.
"""

from __future__ import annotations

import json
from typing import Any

MAX_BODY = 3 * 1024 * 1024  # kube-apiserver's own limit on an object is 3 MiB


class BadReview(ValueError):
    pass


def parse_review(body: bytes) -> dict[str, Any]:
    """The `request` of an AdmissionReview v1, or BadReview saying what is wrong."""
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadReview(f"the body is not JSON: {e}") from None
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
    for key in ("object", "oldObject"):
        if req.get(key) is not None and not isinstance(req[key], dict):
            raise BadReview(f"AdmissionReview.request.{key} is not an object")
    return req


def review_response(uid: str, response: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, **response},
    }
