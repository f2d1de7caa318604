"""The Flask app: the AdmissionReview envelope, malformed input, errors, readiness and policy reloads."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from sparkgate import contract
from sparkgate.mutation import Mutation, Outcome
from sparkgate.policy_file import PolicySource
from webhook import app as app_module
from webhook import metrics
from webhook.app import create_app
from webhook.review import MAX_BODY

from ..sparkgate.mutation.test_mutation import executor, request_for


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(
        (
            Path(__file__).parents[2] / "manifests" / "components" / "example-policy" / "policy.yaml"
        ).read_text()
    )
    return path


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def client(policy_file: Path, clock: Clock) -> Any:
    source = PolicySource(
        str(policy_file), "sparkgate-system", clock=clock, check_interval=1.0, on_reload=metrics.on_reload
    )
    return create_app(source).test_client()


def review(request: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def counted(endpoint: str, outcome: str) -> float:
    value: float = metrics.REQUESTS.labels(endpoint, outcome)._value.get()
    return value


def gate_removal(**fields: Any) -> dict[str, Any]:
    """An UPDATE that removes the sparkgate gate, by `userInfo` bob unless `fields` say otherwise."""
    gated = executor(schedulingGates=[{"name": contract.GATE}])
    return {
        **request_for(executor(), operation="UPDATE"),
        "oldObject": gated,
        "userInfo": {"username": "bob"},
        **fields,
    }


def test_mutate_echoes_uid_and_returns_a_base64_json_patch(client: Any, reviews: dict[str, Any]) -> None:
    sent = reviews["adhoc-query-exec-2"]
    answer = client.post("/mutate", json=sent)
    assert answer.status_code == 200
    body = answer.get_json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    response = body["response"]
    assert response["uid"] == sent["request"]["uid"] and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert {
        "op": "add",
        "path": "/spec/schedulingGates",
        "value": [{"name": "sparkgate.io/allocator"}],
    } in json.loads(base64.b64decode(response["patch"]))


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "not JSON"),
        (b"[1, 2]", 400, "not a JSON object"),
        (json.dumps({"kind": "Pod", "apiVersion": "v1"}).encode(), 400, "expected an AdmissionReview"),
        (
            json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1"}).encode(),
            400,
            "admission.k8s.io/v1",
        ),
        (json.dumps(review({"operation": "CREATE"})).encode(), 400, "uid is missing"),
        (
            json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}).encode(),
            400,
            "request is missing",
        ),
        (
            json.dumps(review({"uid": "x", "operation": "CREATE", "object": [1]})).encode(),
            400,
            "object is not an object",
        ),
        (json.dumps(review(gate_removal(kind="Pod"))).encode(), 400, "request.kind is not an object"),
        (
            json.dumps(review(gate_removal(resource="pods"))).encode(),
            400,
            "request.resource is not an object",
        ),
        (json.dumps(review(gate_removal(userInfo="bob"))).encode(), 400, "request.userInfo is not an object"),
        (
            json.dumps(review(gate_removal(userInfo={"username": ["bob"]}))).encode(),
            400,
            "request.userInfo.username is not a string",
        ),
        (
            json.dumps(
                review(gate_removal(userInfo={"username": "bob", "groups": contract.BREAK_GLASS_GROUP}))
            ).encode(),
            400,
            "request.userInfo.groups is not a list of strings",
        ),
        (
            json.dumps(review(gate_removal(userInfo={"username": "bob", "groups": [["x"]]}))).encode(),
            400,
            "request.userInfo.groups is not a list of strings",
        ),
        (b"[" * 200_000 + b"]" * 200_000, 400, "nested too deeply"),
        (b"{" + b" " * MAX_BODY + b"}", 413, "larger than"),
    ],
)
def test_malformed_requests_get_a_clear_4xx_never_a_500(
    client: Any, body: bytes, status: int, message: str
) -> None:
    for endpoint in ("/mutate", "/validate"):
        before = counted(endpoint.strip("/"), "bad_request")
        answer = client.post(endpoint, data=body, content_type="application/json")
        assert answer.status_code == status
        assert message in answer.get_data(as_text=True)
        assert counted(endpoint.strip("/"), "bad_request") == before + 1


def test_an_update_review_of_two_maximal_pods_is_answered(client: Any) -> None:
    """The API server takes a request body of up to 3 MiB; an UPDATE's review carries the pod twice."""
    limit = 3 * 1024 * 1024
    request = gate_removal()
    for key in ("object", "oldObject"):
        request[key]["metadata"]["annotations"] = {"sparkgate.io/x": "x" * (limit - 1024)}
        assert limit - 1024 < len(json.dumps(request[key])) <= limit
    body = json.dumps(review(request)).encode()
    answer = client.post("/validate", data=body, content_type="application/json")
    assert answer.status_code == 200 and answer.get_json()["response"]["allowed"] is False


@pytest.mark.parametrize(
    "obj",
    [
        {"kind": "Pod", "metadata": {"name": "no-labels"}, "spec": {}},
        {"kind": "Pod"},
        {"kind": "ConfigMap", "metadata": {"name": "cm"}},
    ],
)
def test_objects_that_are_not_executor_pods_are_allowed_without_a_patch(
    client: Any, obj: dict[str, Any]
) -> None:
    request = request_for(obj)
    if obj.get("kind") == "ConfigMap":
        request["kind"] = {"group": "", "version": "v1", "kind": "ConfigMap"}
    response = client.post("/mutate", json=review(request)).get_json()["response"]
    assert response == {"uid": "u1", "allowed": True}


def test_an_unexpected_error_admits_the_pod_unchanged_and_is_counted(
    client: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(request: Any, policy: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(app_module, "mutate", broken)
    before = app_module.metrics.REQUESTS.labels("mutate", "error")._value.get()
    pod = executor()
    pod["metadata"]["namespace"] = "spark-jobs"
    response = client.post("/mutate", json=review(request_for(pod))).get_json()["response"]
    assert response == {"uid": "u1", "allowed": True}
    assert app_module.metrics.REQUESTS.labels("mutate", "error")._value.get() == before + 1
    assert "spark-jobs/app-exec-1" in caplog.text


def test_a_patch_that_is_not_json_admits_the_pod_unchanged_and_is_counted(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """json.dumps writes NaN, which is not JSON: the API server would refuse the patch ("undecodable")."""
    nan = Mutation(Outcome.MUTATED, [{"op": "add", "path": "/metadata/x", "value": float("nan")}], "p")
    monkeypatch.setattr(app_module, "mutate", lambda request, policy: nan)
    before = counted("mutate", "error")
    response = client.post("/mutate", json=review(request_for(executor()))).get_json()["response"]
    assert response == {"uid": "u1", "allowed": True}
    assert counted("mutate", "error") == before + 1


@pytest.mark.parametrize(
    "bad",
    [
        "allocation: {batchSize: -1}",
        "profiles: [{name: a, template: {metadata: [1]}}]",  # the loader itself failed on this
        "profiles: " + "[" * 5000 + "]" * 5000,
    ],
)
def test_a_bad_new_policy_is_refused_and_the_last_good_one_stays_in_force(
    client: Any, policy_file: Path, clock: Clock, bad: str
) -> None:
    assert client.get("/readyz").status_code == 200
    failures = metrics.POLICY_RELOADS.labels("failure")._value.get()
    policy_file.write_text(f"apiVersion: sparkgate.io/v1alpha1\nkind: Policy\n{bad}\n")
    clock.now += 5
    assert client.get("/readyz").status_code == 200  # still ready: the last good policy is in force
    response = client.post("/mutate", json=review(request_for(executor(), "spark-jobs"))).get_json()[
        "response"
    ]
    assert "patch" in response
    metrics_text = client.get("/metrics").get_data(as_text=True)
    assert "sparkgate_webhook_policy_loaded 1.0" in metrics_text
    assert metrics.POLICY_RELOADS.labels("failure")._value.get() == failures + 1


def test_not_ready_until_a_policy_loads(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("kind: Nonsense\n")
    clock = Clock()
    client = create_app(PolicySource(str(path), "sparkgate-system", clock=clock)).test_client()
    answer = client.get("/readyz")
    assert answer.status_code == 503 and "kind" in answer.get_data(as_text=True)
    response = client.post("/mutate", json=review(request_for(executor()))).get_json()["response"]
    assert response == {"uid": "u1", "allowed": True}
    path.write_text("apiVersion: sparkgate.io/v1alpha1\nkind: Policy\n")
    clock.now += 2
    assert client.get("/readyz").status_code == 200


def test_validate_denies_gate_removal_by_others_with_a_403_status(client: Any) -> None:
    gated = executor(schedulingGates=[{"name": "sparkgate.io/allocator"}])
    request = {
        **request_for(executor(), operation="UPDATE"),
        "oldObject": gated,
        "userInfo": {"username": "bob"},
    }
    response = client.post("/validate", json=review(request)).get_json()["response"]
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert "sparkgate" in response["status"]["message"]
