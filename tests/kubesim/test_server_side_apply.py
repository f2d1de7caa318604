"""Server-side apply in kubesim (kubesim/apply.py), over HTTP with the official client's
`application/apply-patch+yaml` PATCH. Sources: staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go
(applyPatcher, create-if-absent), staging/src/k8s.io/apimachinery/pkg/util/managedfields (managedFields,
internal/conflict.go's message), sigs.k8s.io/structured-merge-diff (merge/update.go, typed/merge.go,
typed/remove.go) and https://kubernetes.io/docs/reference/using-api/server-side-apply/."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from kubesim import apply as ssa

from .conftest import Served

APPLY = "application/apply-patch+yaml"


def apply(
    served: Served, path: str, body: Any, manager: str | None, *, force: bool = False, raw: str | None = None
) -> tuple[int, dict[str, Any]]:
    """PATCH with the apply content type through the official client's ApiClient; (status, document)."""
    query: list[tuple[str, str]] = [("fieldManager", manager)] if manager is not None else []
    if force:
        query.append(("force", "true"))
    answer = served.client.call_api(
        *served.client.param_serialize(
            "PATCH",
            path,
            query_params=query,
            header_params={"Content-Type": APPLY, "Accept": "application/json"},
            body=raw if raw is not None else body,
            auth_settings=["BearerToken"],
        )
    )
    answer.read()
    return answer.status, json.loads(answer.data)


def cm(name: str, data: dict[str, str], **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **meta}, "data": data}


CM = "/api/v1/namespaces/default/configmaps/c"


def managers(obj: dict[str, Any]) -> dict[str, Any]:
    return {e["manager"]: e for e in obj["metadata"].get("managedFields") or []}


def test_an_apply_creates_the_missing_object_and_records_its_manager(apiserver: Served) -> None:
    """patch.go: an apply to a missing object creates it (201); managedFields gets an `Apply` entry whose
    FieldsV1 names every applied leaf and no identity field (managedfields stripMeta)."""
    code, obj = apply(apiserver, CM, cm("c", {"a": "1"}, labels={"app": "x"}), "ops")
    assert code == 201
    assert obj["data"] == {"a": "1"} and obj["metadata"]["labels"] == {"app": "x"}
    [entry] = obj["metadata"]["managedFields"]
    assert entry["manager"] == "ops" and entry["operation"] == "Apply" and entry["apiVersion"] == "v1"
    assert entry["fieldsType"] == "FieldsV1"
    assert entry["fieldsV1"] == {"f:data": {"f:a": {}}, "f:metadata": {"f:labels": {"f:app": {}}}}
    assert apiserver.store.get("configmaps", "default", "c") == obj
    # the official client's typed call with the apply content type reads the same object
    core = client.CoreV1Api(apiserver.client)
    again = core.patch_namespaced_config_map(
        "c", "default", cm("c", {"a": "1"}, labels={"app": "x"}), field_manager="ops", _content_type=APPLY
    )
    assert again.metadata.resource_version == obj["metadata"]["resourceVersion"]


def test_an_apply_that_changes_nothing_writes_nothing(apiserver: Served) -> None:
    """The apply handler's no-op detection: the same configuration applied again by the same manager leaves
    the object, its managedFields time and the resourceVersion as they were (no watch event either). YAML
    and JSON bodies are the same configuration."""
    apply(apiserver, CM, cm("c", {"a": "1"}), "ops")
    before = apiserver.store.get("configmaps", "default", "c")
    rv = apiserver.store.resource_version
    code, obj = apply(
        apiserver,
        CM,
        None,
        "ops",
        raw="apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: '1'\n",
    )
    assert code == 200 and obj == before
    assert apiserver.store.resource_version == rv
    code, obj = apply(apiserver, CM, cm("c", {"a": "2"}), "ops")
    assert code == 200 and obj["data"] == {"a": "2"} and apiserver.store.resource_version == rv + 1


def test_fields_a_manager_no_longer_applies_are_removed_unless_another_owns_them(apiserver: Served) -> None:
    """merge/update.go Updater.prune: what the manager applied last time and leaves out now is removed from
    the object, except where another manager owns it too; an emptied map goes with it (typed/remove.go)."""
    apply(apiserver, CM, cm("c", {"a": "1", "b": "2"}, labels={"x": "1"}), "one")
    apply(apiserver, CM, cm("c", {"b": "2"}), "two")  # co-owns b with the same value: no conflict
    code, obj = apply(apiserver, CM, cm("c", {}), "one")
    assert code == 200
    assert obj["data"] == {"b": "2"} and "labels" not in obj["metadata"]
    assert set(managers(obj)) == {"two"}  # an emptied set leaves managedFields


def test_a_conflict_with_another_manager_is_409_unless_forced(apiserver: Served) -> None:
    """internal/conflict.go NewConflictError: 409 Conflict, `Apply failed with 1 conflict: conflict with
    "MANAGER": .data.a`, one FieldManagerConflict cause per field; with force=true the field changes owner.
    Several conflicts are listed per manager."""
    apply(apiserver, CM, cm("c", {"a": "1", "b": "1"}), "one")
    code, status = apply(apiserver, CM, cm("c", {"a": "2"}), "two")
    assert code == 409 and status["reason"] == "Conflict"
    assert status["message"] == 'Apply failed with 1 conflict: conflict with "one": .data.a'
    assert status["details"]["causes"] == [
        {"type": "FieldManagerConflict", "message": 'conflict with "one"', "field": ".data.a"}
    ]
    code, status = apply(apiserver, CM, cm("c", {"a": "2", "b": "2"}), "two")
    assert status["message"] == 'Apply failed with 2 conflicts: conflicts with "one":\n- .data.a\n- .data.b'
    assert apiserver.store.get("configmaps", "default", "c")["data"] == {"a": "1", "b": "1"}
    code, obj = apply(apiserver, CM, cm("c", {"a": "2"}), "two", force=True)
    assert code == 200 and obj["data"] == {"a": "2", "b": "1"}
    owned = managers(obj)
    assert owned["one"]["fieldsV1"] == {"f:data": {"f:b": {}}}
    assert owned["two"]["fieldsV1"] == {"f:data": {"f:a": {}}}


def test_pod_lists_merge_by_their_keys_over_http(apiserver: Served) -> None:
    """structured-merge-diff over core/v1 Pod's schema: containers merge by name (a field of another
    manager's container conflicts at `.spec.containers[name="main"].image`), finalizers as a set (each
    manager owns its values: `v:"b/y"`), tolerations atomic (replaced whole, one field for conflicts).
    FieldsV1 marks each list element with "." (fieldpath/serialize.go)."""
    path = "/api/v1/namespaces/default/pods/p"
    first = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "finalizers": ["a/x"]},
        "spec": {
            "containers": [{"name": "main", "image": "i:1", "env": [{"name": "A", "value": "1"}]}],
            "tolerations": [{"key": "k", "operator": "Exists"}],
        },
    }
    code, pod = apply(apiserver, path, first, "spark")
    assert code == 201 and pod["spec"]["restartPolicy"] == "Always"  # created, defaulted
    main = managers(pod)["spark"]["fieldsV1"]["f:spec"]["f:containers"]['k:{"name":"main"}']
    assert main["."] == {} and main["f:env"] == {'k:{"name":"A"}': {".": {}, "f:name": {}, "f:value": {}}}
    second = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "finalizers": ["b/y"]},
        "spec": {"containers": [{"name": "main", "image": "i:2"}]},
    }
    code, status = apply(apiserver, path, second, "admin")
    assert code == 409
    assert (
        status["message"]
        == 'Apply failed with 1 conflict: conflict with "spark": .spec.containers[name="main"].image'
    )
    code, pod = apply(apiserver, path, second, "admin", force=True)
    assert code == 200 and pod["spec"]["containers"][0]["image"] == "i:2"
    assert pod["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}]
    assert pod["metadata"]["finalizers"] == ["a/x", "b/y"]
    assert managers(pod)["admin"]["fieldsV1"]["f:metadata"] == {"f:finalizers": {'v:"b/y"': {}}}
    # spark drops its finalizer: it goes; admin's stays
    first["metadata"]["finalizers"] = []
    del first["spec"]["containers"][0]["image"]
    code, pod = apply(apiserver, path, first, "spark")
    assert code == 200 and pod["metadata"]["finalizers"] == ["b/y"]
    code, status = apply(
        apiserver, path, {**second, "spec": {"tolerations": [{"key": "k2", "operator": "Exists"}]}}, "admin"
    )
    assert (
        code == 409
        and status["message"] == 'Apply failed with 1 conflict: conflict with "spark": .spec.tolerations'
    )


def test_the_merge_of_associative_atomic_and_set_lists() -> None:
    """typed/merge.go visitListItems: the live order kept, an applied element new to the list placed where
    the configuration puts it relative to the shared ones, elements merged by key (container ports by
    containerPort+protocol, protocol defaulted to TCP), sets by value, atomic lists replaced."""
    live = [{"name": n} for n in "abc"]
    assert [e["name"] for e in ssa.merge(live, [{"name": "x"}, {"name": "b"}], "env")] == ["a", "x", "b", "c"]
    assert [e["name"] for e in ssa.merge(live, [{"name": "c"}, {"name": "y"}], "env")] == ["a", "b", "c", "y"]
    ports = [{"containerPort": 80, "protocol": "TCP", "name": "http"}]
    assert ssa.merge(ports, [{"containerPort": 80, "hostPort": 8080}], "ports") == [
        {"containerPort": 80, "protocol": "TCP", "name": "http", "hostPort": 8080}
    ]
    assert ssa.merge(ports, [{"containerPort": 80, "protocol": "UDP"}], "ports")[1]["protocol"] == "UDP"
    assert ssa.merge(["x"], ["y", "x"], "finalizers") == ["y", "x"]
    assert ssa.merge([1, 2], [3], "args") == [3]
    assert ssa.merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3, "d": 4}}) == {"a": {"b": 1, "c": 3, "d": 4}}
    with pytest.raises(ValueError, match="duplicate entries"):
        ssa.merge([], [{"name": "a"}, {"name": "a"}], "env")


def test_bad_applies_are_refused_and_lose_nothing(apiserver: Served) -> None:
    """ValidatePatchOptions: no fieldManager is 422 on PatchOptions; force on a non-apply patch too. The
    fieldmanager's checks: the wrong apiVersion, managedFields in the configuration, a name that is not the
    URL's, and a list element without its key are 400s that say what is wrong; the object stays."""
    apply(apiserver, CM, cm("c", {"a": "1"}), "ops")
    stored = apiserver.store.get("configmaps", "default", "c")
    code, status = apply(apiserver, CM, cm("c", {"a": "2"}), None)
    assert code == 422 and status["message"] == (
        'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch'
    )
    assert apply(apiserver, CM, {**cm("c", {}), "apiVersion": "apps/v1"}, "ops")[1]["message"] == (
        "Incorrect version specified in apply patch. Specified patch version: apps/v1, expected: v1"
    )
    assert apply(apiserver, CM, cm("c", {}, managedFields=[]), "ops")[1]["message"] == (
        "metadata.managedFields must be nil"
    )
    assert apply(apiserver, CM, cm("d", {}), "ops")[1]["message"] == (
        "the name of the object (d) does not match the name on the URL (c)"
    )
    bad_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"image": "x"}]},
    }
    code, status = apply(apiserver, "/api/v1/namespaces/default/pods/p", bad_pod, "ops")
    assert (
        code == 400
        and 'associative list with keys has an element that omits key field "name"' in status["message"]
    )
    assert apply(apiserver, CM, None, "ops", raw="data: [unclosed")[0] == 400
    core = client.CoreV1Api(apiserver.client)
    answer = core.api_client.call_api(
        *core.api_client.param_serialize(
            "PATCH",
            CM,
            query_params=[("force", "true")],
            header_params={"Content-Type": "application/merge-patch+json"},
            body={"data": {"a": "3"}},
            auth_settings=["BearerToken"],
        )
    )
    answer.read()
    assert answer.status == 422
    assert "force: Forbidden: may not be specified for non-apply patch" in answer.data.decode()
    assert apiserver.store.get("configmaps", "default", "c") == stored


def test_an_update_without_managed_fields_keeps_them(apiserver: Served) -> None:
    """managedfields: an update whose object carries no managedFields keeps the live ones, and its own Update
    entry, named after the User-Agent (the official client's "OpenAPI-Generator/..."), owns what it added."""
    _, obj = apply(apiserver, CM, cm("c", {"a": "1"}), "ops")
    core = client.CoreV1Api(apiserver.client)
    body = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "managedFields"}}
    body["data"] = {"a": "1", "z": "9"}
    replaced = core.replace_namespaced_config_map("c", "default", body)
    assert [(e.manager, e.operation) for e in replaced.metadata.managed_fields] == [
        ("ops", "Apply"),
        ("OpenAPI-Generator", "Update"),
    ]
    assert replaced.metadata.managed_fields[1].fields_v1 == {"f:data": {"f:z": {}}}


def test_a_create_records_an_update_manager_that_co_owns_its_fields_against_an_applier(
    apiserver: Served,
) -> None:
    """handlers/create.go records an `Update` entry for a POST (manager: its fieldManager, else the
    User-Agent before "/"), owning every field it wrote. An applier that later takes the object over by
    apply (force) shares those fields: one it stops applying is not pruned (the other manager still owns
    it), where it would be from an object the applier created by apply (issue 37: the rendered
    MutatingAdmissionPolicy created by POST kept every field a later version dropped). An apply that
    changes the creator's field without force conflicts with it; an update takes fields from an applier."""
    core = client.CoreV1Api(apiserver.client)
    core.create_namespaced_config_map("default", cm("c", {"a": "1", "b": "2"}), field_manager="maker")
    created = apiserver.store.get("configmaps", "default", "c")
    [entry] = created["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"], entry["apiVersion"]) == ("maker", "Update", "v1")
    assert entry["fieldsV1"] == {"f:data": {"f:a": {}, "f:b": {}}}
    code, conflict = apply(apiserver, CM, cm("c", {"a": "9"}), "ops")
    assert code == 409 and conflict["message"].startswith(
        'Apply failed with 1 conflict: conflict with "maker" using v1 at '
    )
    assert apply(apiserver, CM, cm("c", {"a": "1", "b": "2"}), "ops", force=True)[0] == 200
    _, obj = apply(apiserver, CM, cm("c", {"a": "1"}), "ops", force=True)  # ops stops applying b
    assert obj["data"] == {"a": "1", "b": "2"}, "b is still maker's: not pruned"
    apply(apiserver, "/api/v1/namespaces/default/configmaps/d", cm("d", {"a": "1", "b": "2"}), "ops")
    _, pruned = apply(apiserver, "/api/v1/namespaces/default/configmaps/d", cm("d", {"a": "1"}), "ops")
    assert pruned["data"] == {"a": "1"}, "created by apply: ops alone owned b"
    patched = core.patch_namespaced_config_map("d", "default", {"data": {"a": "5"}}, field_manager="editor")
    fields = {(e.manager, e.operation): e.fields_v1 for e in patched.metadata.managed_fields}
    assert fields == {("editor", "Update"): {"f:data": {"f:a": {}}}}  # ops lost its only field


def test_the_manager_of_an_update_is_the_user_agent_before_its_first_slash() -> None:
    """handlers/create.go `managerOrUserAgent`, `prefixFromUserAgent`."""
    assert ssa.manager_of("", "kubectl/v1.36.2 (linux/amd64) kubernetes/abc") == "kubectl"
    assert ssa.manager_of("mine", "kubectl/v1.36.2") == "mine"
    assert ssa.manager_of("", "x\ty/1") == "xy" and len(ssa.manager_of("", "a" * 300)) == 128
