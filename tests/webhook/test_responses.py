"""The webhook's answers, byte for byte, as the code before issue 38's speed-ups wrote them.

tests/data/webhook-responses.json was written by this module (`python -m tests.webhook.test_responses
--write`) from main at 20c348b, before the webhook was made faster: for the example policy and 80 policies
generated like the parity test's (tests/sparkgate/policies.py; their YAML is in the file), every captured
Spark 4.3 pod in several namespaces, with and without a requested profile, and its re-invocation (the pod
after the patch, posted again); plus the envelope's other answers (gate protection, skipped objects, bad
bodies, text that JSON escapes). Each answer is pinned by the SHA-256 of its status, content type and body;
the example policy's answers for the captured pods as sent, and the other answers, also in full.

Regenerate only when an answer is meant to change, and say so in the commit.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from sparkgate import contract
from sparkgate.policy_file import PolicySource
from webhook.app import create_app

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "data" / "spark-4.3"
GOLDEN = REPO / "tests" / "data" / "webhook-responses.json"
EXAMPLE_POLICY = REPO / "manifests" / "components" / "example-policy" / "policy.yaml"
GENERATED = 80
# (namespace, requested profile) for every captured pod: None is the pod's own namespace, no annotation.
EXAMPLE_VARIANTS = [
    (ns, requested)
    for ns in (None, "spark-jobs", "spark-etl", "adhoc", "legacy-x", "monitoring")
    for requested in (None, "analytics", "default", "nope")
]
GENERATED_VARIANTS = [(None, None), ("spark-etl", "p1"), ("adhoc", "p0"), ("monitoring", None)]

Case = tuple[str, str, bytes]  # (key, endpoint, body)


def load_reviews() -> dict[str, bytes]:
    return {
        p.name.removesuffix(".admissionreview.json"): p.read_bytes()
        for p in sorted(FIXTURES.glob("*.admissionreview.json"))
    }


def variant(raw: bytes, ns: str | None, requested: str | None) -> bytes:
    """The captured review moved to `ns` and asking for the profile `requested` (the bytes as captured when
    neither is given)."""
    if ns is None and requested is None:
        return raw
    review = json.loads(raw)
    request = review["request"]
    if ns is not None:
        request["namespace"] = ns
        request["object"]["metadata"]["namespace"] = ns
    if requested is not None:
        request["object"]["metadata"].setdefault("annotations", {})[contract.ANNOTATION_PROFILE] = requested
    return json.dumps(review).encode()


def envelope(request: dict[str, Any]) -> bytes:
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


def other_cases(reviews: dict[str, bytes]) -> Iterator[Case]:
    """The envelope's answers other than a pod's patch, under the example policy."""
    pod = json.loads(reviews["adhoc-query-exec-1"])["request"]
    gated = copy.deepcopy(pod["object"])
    gated["spec"]["schedulingGates"] = [{"name": contract.GATE}]
    removal = {**pod, "operation": "UPDATE", "oldObject": gated, "uid": "uid-é-☃"}
    for user, groups in (
        ("bob", None),
        ('bøb "quoted" </script>', []),
        (contract.ALLOCATOR_USER, None),
        ("alice", [contract.BREAK_GLASS_GROUP]),
    ):
        info = {"username": user} if groups is None else {"username": user, "groups": groups}
        yield f"validate:{user}:{groups}", "/validate", envelope({**removal, "userInfo": info})
    yield "mutate:update", "/mutate", envelope({**pod, "operation": "UPDATE", "oldObject": pod["object"]})
    yield (
        "mutate:configmap",
        "/mutate",
        envelope(
            {
                **pod,
                "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
                "object": {"kind": "ConfigMap"},
            }
        ),
    )
    yield "mutate:non-ascii-uid", "/mutate", envelope({**pod, "uid": "ü-\u2028-\U0001f600"})
    labels = pod["object"]["metadata"]["labels"]
    odd = {**pod["object"], "metadata": {**pod["object"]["metadata"], "labels": {**labels, "ünï": "cødé"}}}
    yield "mutate:non-ascii-label", "/mutate", envelope({**pod, "object": odd})
    for name, body in (
        ("not-json", b"{not json"),
        ("not-object", b"[1, 2]"),
        ("bad-utf8", b'{"kind": "\xff"}'),
        ("wrong-kind", b'{"kind": "Pod", "apiVersion": "v1"}'),
        ("no-uid", envelope({"operation": "CREATE"})),
        ("nan", b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": NaN}'),
    ):
        for endpoint in ("/mutate", "/validate"):
            yield f"bad:{name}:{endpoint}", endpoint, body


def pod_cases(reviews: dict[str, bytes], variants: list[tuple[str | None, str | None]]) -> Iterator[Case]:
    for name, raw in reviews.items():
        for ns, requested in variants:
            yield f"{name}:{ns}:{requested}", "/mutate", variant(raw, ns, requested)


def fingerprint(status: int, content_type: str, body: bytes) -> str:
    return hashlib.sha256(f"{status} {content_type}\n".encode() + body).hexdigest()[:20]


def answers(policy_text: str, cases: Iterator[Case], tmp: Path) -> Iterator[tuple[str, int, str, bytes]]:
    """(key, status, content type, body) of each case through the Flask app, and of each patched pod's
    re-invocation (key + ":again")."""
    path = tmp / "policy.yaml"
    path.write_text(policy_text)
    client = create_app(PolicySource(str(path), "sparkgate-system")).test_client()
    for key, endpoint, body in cases:
        answer = client.post(endpoint, data=body, content_type="application/json")
        data = answer.get_data()
        yield key, answer.status_code, answer.content_type, data
        response = json.loads(data)["response"] if answer.status_code == 200 else {}
        if "patch" in response:
            review = json.loads(body)
            patch = json.loads(base64.b64decode(response["patch"]))
            review["request"]["object"] = jsonpatch.apply_patch(review["request"]["object"], patch)
            again = client.post(endpoint, data=json.dumps(review).encode(), content_type="application/json")
            yield key + ":again", again.status_code, again.content_type, again.get_data()


def everything(policies: list[str], tmp: Path) -> Iterator[tuple[int, str, int, str, bytes]]:
    """(policy index, key, status, content type, body) of every pinned answer."""
    reviews = load_reviews()
    for index, text in enumerate(policies):
        if index == 0:
            cases: Iterator[Case] = iter([*pod_cases(reviews, EXAMPLE_VARIANTS), *other_cases(reviews)])
        else:
            cases = pod_cases(reviews, GENERATED_VARIANTS)
        for key, status, content_type, body in answers(text, cases, tmp):
            yield index, key, status, content_type, body


def in_full(index: int, key: str) -> bool:
    return index == 0 and (key.endswith(":None:None") or key.split(":")[0] in ("validate", "mutate", "bad"))


def test_every_answer_is_byte_for_byte_as_before(tmp_path: Path) -> None:
    golden = json.loads(GOLDEN.read_text())
    want = golden["answers"]
    got = {}
    for index, key, status, content_type, body in everything(golden["policies"], tmp_path):
        got[f"{index}/{key}"] = fingerprint(status, content_type, body)
        if in_full(index, key):
            assert [status, content_type, body.decode()] == golden["in_full"][f"{index}/{key}"], key
    assert got.keys() == want.keys()
    assert [k for k in want if got[k] != want[k]] == []
    # The pinned answers do mutate: most pods got a patch, the re-invocations none.
    patched = sum(k.endswith(":again") for k in want)
    assert patched > len(want) // 3


def generated_policies() -> list[str]:
    """GENERATED policy documents drawn as the parity test draws them (deterministic: derandomized)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tests.sparkgate.policies import profiles

    drawn: list[str] = []

    @settings(
        max_examples=2 * GENERATED, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(
        st.integers(min_value=0, max_value=3).flatmap(lambda n: st.tuples(*(profiles(i) for i in range(n))))
    )
    def collect(profiles: tuple[dict[str, Any], ...]) -> None:
        document = {
            "apiVersion": "sparkgate.io/v1alpha1",
            "kind": "Policy",
            "excludedNamespaces": ["monitoring", "legacy-*"],
            "profiles": list(profiles),
        }
        text = yaml.safe_dump(document, sort_keys=False)
        if text not in drawn:
            drawn.append(text)

    collect()
    return drawn[:GENERATED]


def write(tmp: Path) -> None:
    policies = [EXAMPLE_POLICY.read_text(), *generated_policies()]
    pinned: dict[str, str] = {}
    full: dict[str, list[Any]] = {}
    for index, key, status, content_type, body in everything(policies, tmp):
        pinned[f"{index}/{key}"] = fingerprint(status, content_type, body)
        if in_full(index, key):
            full[f"{index}/{key}"] = [status, content_type, body.decode()]
    GOLDEN.write_text(
        json.dumps({"policies": policies, "answers": pinned, "in_full": full}, indent=0, ensure_ascii=False)
        + "\n"
    )
    print(f"wrote {len(pinned)} answers of {len(policies)} policies to {GOLDEN}")


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python -m tests.webhook.test_responses --write")
    with tempfile.TemporaryDirectory() as directory:
        write(Path(directory))
