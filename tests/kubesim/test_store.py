"""kubesim's Store called in-process, as the scheduler, kubelets and tests do: the seam's rules."""

from __future__ import annotations

import copy
import re
import threading
import uuid
from typing import Any

import pytest

from kubesim.errors import ApiError, UserInfo
from kubesim.store import AdmissionRequest, Store

USER = UserInfo("alice", "u1", ("system:authenticated",))
MERGE = "application/merge-patch+json"


def cm(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": dict(labels)}, "data": {"k": name}}


def names(items: list[dict[str, Any]]) -> list[str]:
    return [o["metadata"]["name"] for o in items]


def test_list_pages_carry_the_first_pages_version_and_expire_with_compaction(store: Store) -> None:
    """API concepts, "Retrieving large results sets in chunks": every page answers with the first page's
    resourceVersion; a continue token older than the compaction gets 410 Expired."""
    for i in range(5):
        store.create("configmaps", cm(f"c{i}"), namespace="spark")
    page, rv, token = store.list("configmaps", "spark", limit=2)
    assert names(page) == ["c0", "c1"] and token
    store.create("configmaps", cm("c9"), namespace="spark")
    page2, rv2, token2 = store.list("configmaps", "spark", limit=2, continue_token=token)
    assert names(page2) == ["c2", "c3"] and rv2 == rv and token2
    store.compact()
    with pytest.raises(ApiError) as e:
        store.list("configmaps", "spark", limit=2, continue_token=token2)
    assert e.value.code == 410 and e.value.reason == "Expired"
    with pytest.raises(ApiError) as e:
        store.list("configmaps", "spark", continue_token="garbage")
    assert e.value.code == 400


def test_watch_without_a_version_starts_with_the_current_state(store: Store) -> None:
    """API conventions: a watch with resourceVersion unset or "0" first sends synthetic ADDED events
    for the objects that exist, then the changes."""
    store.create("configmaps", cm("a"), namespace="spark")
    store.create("configmaps", cm("other"), namespace="default")
    w = store.watch("configmaps", "spark", resource_version="0")
    store.create("configmaps", cm("b"), namespace="spark")
    assert [(t, o["metadata"]["name"]) for t, o in (w.next(5), w.next(5))] == [("ADDED", "a"), ("ADDED", "b")]
    assert w.next(0.01) is None
    w.close()
    assert w.next(1) is None and list(w) == []


def test_watch_from_a_version_sees_each_later_change_in_order(store: Store) -> None:
    store.create("configmaps", cm("a"), namespace="spark")
    _, rv, _ = store.list("configmaps")
    w = store.watch("configmaps", resource_version=rv)
    store.patch("configmaps", "spark", "a", {"data": {"k": "2"}}, MERGE)
    store.create(
        "pods", {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}, namespace="spark"
    )
    store.delete("configmaps", "spark", "a")
    seen = [w.next(5) or ("", {}) for _ in range(2)]
    assert [t for t, _ in seen] == ["MODIFIED", "DELETED"], "other resources are not delivered"
    assert int(seen[1][1]["metadata"]["resourceVersion"]) == store.resource_version
    assert w.resource_version == str(store.resource_version)


def test_an_object_leaving_the_selector_is_deleted_for_that_watcher(store: Store) -> None:
    """Like the watch cache (cacheWatcher.convertToWatchEvent): an update that makes an object match a
    watcher's selector arrives as ADDED, one that makes it stop matching as DELETED, carrying "the previous
    object content, but with the event's resource version"."""
    store.create("configmaps", cm("a", tier="x"), namespace="spark")
    w = store.watch(
        "configmaps", "spark", resource_version=str(store.resource_version), label_selector="tier=x"
    )
    left = store.patch("configmaps", "spark", "a", {"metadata": {"labels": {"tier": "y"}}}, MERGE)
    store.patch("configmaps", "spark", "a", {"data": {"k": "ignored while outside"}}, MERGE)
    store.patch("configmaps", "spark", "a", {"metadata": {"labels": {"tier": "x"}}}, MERGE)
    kinds = [w.next(5) for _ in range(2)]
    assert [k[0] for k in kinds if k] == ["DELETED", "ADDED"]
    gone = kinds[0][1] if kinds[0] else {}
    assert gone["metadata"]["labels"] == {"tier": "x"}  # what it held while it matched
    assert gone["metadata"]["resourceVersion"] == left["metadata"]["resourceVersion"]
    assert w.next(0.01) is None


def test_a_watcher_is_queued_only_what_it_sees_and_its_version_follows_the_rest(store: Store) -> None:
    """The watch cache filters each event for each watcher as it dispatches it; a BOOKMARK then carries
    the latest version, past the changes the watcher does not see, but never past one it has not read."""
    w = store.watch(
        "configmaps", "spark", resource_version=str(store.resource_version), label_selector="tier=x"
    )
    store.create("configmaps", cm("other"), namespace="spark")
    store.create("configmaps", cm("elsewhere", tier="x"), namespace="default")
    assert w.next(0.01) is None
    assert w.resource_version == str(store.resource_version)
    store.create("configmaps", cm("mine", tier="x"), namespace="spark")
    seen_at = store.resource_version
    store.create("configmaps", cm("later"), namespace="spark")
    assert w.resource_version == str(seen_at - 1), "an unread event holds the version"
    event = w.next(5)
    assert event is not None and event[1]["metadata"]["name"] == "mine"
    assert w.resource_version == str(store.resource_version)


def test_a_watcher_that_reads_nothing_is_ended_past_the_compaction_window() -> None:
    """As the cacher ends a watcher whose buffer stays full (cache_watcher.go `add`: "Forcing ... watcher
    close due to unresponsiveness"): no ERROR event, what was queued is dropped, and the version it resumes
    from is too old by then."""
    small = Store(compaction_window=3)
    small.create("namespaces", {"metadata": {"name": "n"}})
    start = str(small.resource_version)
    w = small.watch("configmaps", resource_version=start)
    for i in range(4):
        small.create("configmaps", cm(f"c{i}"), namespace="n")
    assert w.closed and w.next(0.01) is None
    with pytest.raises(ApiError) as e:
        small.watch("configmaps", resource_version=start)
    assert e.value.code == 410


def test_compaction_ends_the_watches_and_their_versions_are_410(store: Store) -> None:
    """Its open watches end with no event (the cacher's `terminateAllWatchers` when its watch cache starts
    again); the versions they resume from are gone (410; an ERROR event over HTTP: test_api_contract)."""
    old = str(store.resource_version)
    w = store.watch("configmaps", resource_version=old)
    store.compact()
    assert w.closed and w.next(0.01) is None
    with pytest.raises(ApiError) as e:
        store.watch("configmaps", resource_version=old)
    assert e.value.code == 410
    _, rv, _ = store.list("configmaps")
    store.watch("configmaps", resource_version=rv).close()  # a version from a list after compaction is served


def test_the_event_log_is_bounded_by_the_compaction_window() -> None:
    small = Store(compaction_window=3)
    small.create("namespaces", {"metadata": {"name": "n"}})
    start = str(small.resource_version)
    for i in range(4):
        small.create("configmaps", cm(f"c{i}"), namespace="n")
    with pytest.raises(ApiError) as e:
        small.watch("configmaps", resource_version=start)
    assert e.value.code == 410


def test_subscribers_get_every_change_in_order_outside_the_lock(store: Store) -> None:
    seen: list[tuple[str, str, str]] = []
    lock_free: list[bool] = []

    def listener(kind: str, resource: str, obj: dict[str, Any]) -> None:
        seen.append((kind, resource, obj["metadata"]["name"]))
        probe = threading.Thread(
            target=lambda: lock_free.append(store.get("namespaces", None, "spark") != {})
        )
        probe.start()
        probe.join(10)

    unsubscribe = store.subscribe(listener)
    store.create("configmaps", cm("a"), namespace="spark")
    store.patch("configmaps", "spark", "a", {"data": {"k": "2"}}, MERGE)
    store.delete("configmaps", "spark", "a")
    unsubscribe()
    store.create("configmaps", cm("b"), namespace="spark")
    assert seen == [
        ("ADDED", "configmaps", "a"),
        ("MODIFIED", "configmaps", "a"),
        ("DELETED", "configmaps", "a"),
    ]
    assert lock_free == [True, True, True], "another thread could read the store during the callback"


def test_admission_sees_clients_writes_only(store: Store) -> None:
    """kube-apiserver calls admission for CREATE and UPDATE of the main resource; in-process components
    (user None) and the status and binding subresources skip it here."""
    calls: list[AdmissionRequest] = []

    def admit(request: AdmissionRequest) -> dict[str, Any] | None:
        calls.append(request)
        assert request.obj is not None
        request.obj["metadata"].setdefault("labels", {})["admitted"] = "yes"
        return request.obj

    store.admit = admit
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    created = store.create("pods", pod, namespace="spark", user=USER)
    assert created["metadata"]["labels"] == {"admitted": "yes"}
    store.patch("pods", "spark", "p", {"metadata": {"annotations": {"a": "1"}}}, MERGE, user=USER)
    store.patch(
        "pods", "spark", "p", {"status": {"phase": "Running"}}, MERGE, subresource="status", user=USER
    )
    store.create("pods", {**pod, "metadata": {"name": "q"}}, namespace="spark")
    assert [(c.operation, c.name, c.user.username) for c in calls] == [
        ("CREATE", "p", "alice"),
        ("UPDATE", "p", "alice"),
    ]
    assert calls[1].old is not None and calls[1].old["metadata"]["name"] == "p"
    dry = store.create(
        "pods", {**pod, "metadata": {"name": "dry"}}, namespace="spark", user=USER, dry_run=True
    )
    assert dry["metadata"]["name"] == "dry" and calls[-1].dry_run
    with pytest.raises(ApiError):
        store.get("pods", "spark", "dry")


def test_a_denial_from_admission_stores_nothing(store: Store) -> None:
    def deny(request: AdmissionRequest) -> dict[str, Any] | None:
        raise ApiError(400, "BadRequest", 'admission webhook "w.x.io" denied the request: no')

    store.admit = deny
    before = store.resource_version
    with pytest.raises(ApiError) as e:
        store.create("configmaps", cm("a"), namespace="spark", user=USER)
    assert "denied the request" in e.value.message and store.resource_version == before


def test_a_patch_is_retried_on_a_concurrent_change_but_a_stale_put_conflicts(store: Store) -> None:
    """GuaranteedUpdate: PATCH re-applies to the latest object after a concurrent write; PUT carries the
    client's resourceVersion as a precondition and gets 409 Conflict."""
    store.create("configmaps", cm("a"), namespace="spark")
    interfered = threading.Event()

    def admit(request: AdmissionRequest) -> dict[str, Any] | None:
        if not interfered.is_set():
            interfered.set()
            store.patch("configmaps", "spark", "a", {"data": {"other": "1"}}, MERGE)
        return request.obj

    store.admit = admit
    patched = store.patch("configmaps", "spark", "a", {"data": {"mine": "1"}}, MERGE, user=USER)
    assert patched["data"] == {"k": "a", "other": "1", "mine": "1"}, "both writes survive"
    stale = store.get("configmaps", "spark", "a")
    store.patch("configmaps", "spark", "a", {"data": {"k": "new"}}, MERGE)
    with pytest.raises(ApiError) as e:
        store.replace("configmaps", "spark", "a", {**stale, "data": {}})
    assert e.value.code == 409 and e.value.reason == "Conflict"
    assert e.value.message == (
        'Operation cannot be fulfilled on configmaps "a": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )


def test_garbage_collection_follows_chains_of_owners(store: Store) -> None:
    """Background cascading deletion (https://kubernetes.io/docs/concepts/architecture/garbage-collection/):
    dependents of a deleted owner are deleted, and so are theirs; Orphan leaves them."""
    top = store.create("configmaps", cm("top"), namespace="spark")

    def owned_by(name: str, owner: dict[str, Any]) -> dict[str, Any]:
        ref = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
        }
        return {"metadata": {"name": name, "ownerReferences": [ref]}}

    middle = store.create("configmaps", owned_by("middle", top), namespace="spark")
    store.create("secrets", owned_by("leaf", middle), namespace="spark")
    keep = store.create("configmaps", cm("keep"), namespace="spark")
    store.create("configmaps", owned_by("orphan", keep), namespace="spark")
    store.delete("configmaps", "spark", "top")
    store.delete("configmaps", "spark", "keep", propagation_policy="Orphan")
    assert names(store.list("configmaps", "spark")[0]) == ["orphan"]
    assert "ownerReferences" not in store.get("configmaps", "spark", "orphan")["metadata"]
    assert store.list("secrets", "spark")[0] == []


def test_garbage_collection_follows_the_owner_references_as_they_are_now(store: Store) -> None:
    """The garbage collector's graph follows each update of a dependent's ownerReferences (its graph builder
    handles every update: pkg/controller/garbagecollector/graph_builder.go `processGraphChanges`): a
    dependent whose reference was removed stays when the owner goes, one whose reference was added goes."""
    owner = store.create("configmaps", cm("owner"), namespace="spark")
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    for name in ("freed", "kept-as-dependent"):
        store.create("configmaps", {"metadata": {"name": name, "ownerReferences": [ref]}}, namespace="spark")
    store.create("configmaps", cm("adopted"), namespace="spark")
    merge = "application/merge-patch+json"
    store.patch("configmaps", "spark", "freed", {"metadata": {"ownerReferences": None}}, merge)
    store.patch("configmaps", "spark", "adopted", {"metadata": {"ownerReferences": [ref]}}, merge)
    store.delete("configmaps", "spark", "owner")
    assert names(store.list("configmaps", "spark")[0]) == ["freed"]


def test_uids_are_random_version_4_uuids_and_a_generated_name_five_more_characters(store: Store) -> None:
    """metadata.uid is a random RFC 4122 UUID (k8s.io/apimachinery/pkg/util/uuid) and generateName gets a
    5-character random suffix (names.SimpleNameGenerator), from kubesim/ids.py's generator."""
    made = [store.create("configmaps", cm(f"c{i}"), namespace="spark") for i in range(200)]
    uids = [uuid.UUID(o["metadata"]["uid"]) for o in made]
    assert all(u.version == 4 and u.variant == uuid.RFC_4122 for u in uids) and len(set(uids)) == 200
    name = store.create("configmaps", {"metadata": {"generateName": "g-"}}, namespace="spark")["metadata"][
        "name"
    ]
    assert re.fullmatch(r"g-[bcdfghjklmnpqrstvwxz2456789]{5}", name)  # apimachinery util/rand `alphanums`


def test_a_generated_name_already_taken_is_generated_again_up_to_eight_attempts(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RetryGenerateName (KEP-4420, locked on since 1.32): registry/store.go `createWithGenerateNameRetry`
    makes up to 8 attempts (maxNameGenerationCreateAttempts), each with a new name and the validating phase
    run again, mutating admission once; the last name taken answers rest.CheckGeneratedNameError's
    `NewGenerateNameConflict(gr, name, 1)`. An explicit name taken is a plain AlreadyExists, not retried."""
    store.create("configmaps", cm("g-bbbbb"), namespace="spark")
    suffixes: list[str] = []

    def suffix(length: int, alphabet: str = "") -> str:
        suffixes.append(candidates.pop(0) if candidates else "bbbbb")
        return suffixes[-1]

    admitted: list[str] = []
    validated: list[str] = []
    store.admit = lambda request: admitted.append(request.name) or None  # type: ignore[func-returns-value]
    store.validate = lambda request, obj: validated.append(request.name)
    monkeypatch.setattr("kubesim.ids.suffix", suffix)
    candidates = ["bbbbb", "bbbbb", "ccccc"]
    made = store.create("configmaps", {"metadata": {"generateName": "g-"}}, namespace="spark", user=USER)
    assert made["metadata"]["name"] == "g-ccccc" and made["metadata"]["generateName"] == "g-"
    assert admitted == [""] and validated == ["g-bbbbb", "g-bbbbb", "g-ccccc"]

    suffixes.clear()
    with pytest.raises(ApiError) as e:
        store.create("configmaps", {"metadata": {"generateName": "g-"}}, namespace="spark", user=USER)
    assert suffixes == ["bbbbb"] * 8
    assert (e.value.code, e.value.reason) == (409, "AlreadyExists")
    assert e.value.message == (
        'configmaps "g-bbbbb" already exists, the server was not able to generate a unique name for the object'
    )
    assert e.value.status()["details"] == {"name": "g-bbbbb", "kind": "configmaps", "retryAfterSeconds": 1}

    suffixes.clear()
    with pytest.raises(ApiError) as e:
        store.create("configmaps", cm("g-bbbbb"), namespace="spark", user=USER)
    assert suffixes == [] and e.value.message == 'configmaps "g-bbbbb" already exists'
    assert [o["metadata"]["name"] for o in store.list("configmaps", "spark")[0]] == ["g-bbbbb", "g-ccccc"]


def test_a_created_pod_gets_the_servers_status_and_a_gated_one_its_scheduling_gated_condition(
    store: Store,
) -> None:
    """pkg/registry/core/pod/strategy.go `PrepareForCreate`, after the mutating admission: the status is the
    server's (phase Pending, qos.ComputePodQOS's class), whatever the client sent, and a pod created gated is
    PodScheduled=False reason SchedulingGated (`applySchedulingGatedCondition`); the mutating phase sees the
    status the client sent (a captured AdmissionReview of a Spark executor has `"status": {}`)."""
    seen: list[Any] = []
    store.admit = lambda request: seen.append(dict((request.obj or {}).get("status") or {})) or None  # type: ignore[func-returns-value]

    def created(name: str, resources: dict[str, Any], **spec: Any) -> dict[str, Any]:
        pod = {
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": resources}], **spec},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }
        return store.create("pods", pod, namespace="spark", user=USER)["status"]

    gated = created("g", {}, schedulingGates=[{"name": "sparkgate.io/gate"}])
    assert gated == {
        "phase": "Pending",
        "qosClass": "BestEffort",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "lastProbeTime": None,
                "lastTransitionTime": gated["conditions"][0]["lastTransitionTime"],
                "reason": "SchedulingGated",
                "message": "Scheduling is blocked due to non-empty scheduling gates",
            }
        ],
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", gated["conditions"][0]["lastTransitionTime"])
    assert seen == [{"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}]
    assert created("b", {"requests": {"cpu": "1"}}) == {"phase": "Pending", "qosClass": "Burstable"}
    limits = {"cpu": "500m", "memory": "1Gi"}
    assert created("q", {"limits": limits})["qosClass"] == "Guaranteed"  # requests defaulted from limits
    assert created("u", {"limits": limits, "requests": {"cpu": "250m"}})["qosClass"] == "Burstable"
    assert created("z", {"requests": {"cpu": "0"}})["qosClass"] == "BestEffort"  # zero is no request
    # Removing the gate changes no status (PrepareForUpdate keeps the old status): the scheduler's to change.
    ungated = store.patch("pods", "spark", "g", {"spec": {"schedulingGates": None}}, MERGE, user=USER)
    assert ungated["status"] == gated


def test_a_patch_that_carries_a_stale_resource_version_is_a_conflict(store: Store) -> None:
    """registry/store.go Update: the updated object's resourceVersion, when the PATCH sets one, must be the
    stored one (409, OptimisticLockErrorMsg); a PATCH that sets none applies to whatever is stored."""
    made = store.create("configmaps", cm("a"), namespace="spark")
    stale = made["metadata"]["resourceVersion"]
    store.patch("configmaps", "spark", "a", {"data": {"k": "v2"}}, MERGE)
    with pytest.raises(ApiError) as e:
        store.patch(
            "configmaps", "spark", "a", {"metadata": {"resourceVersion": stale}, "data": {"k": "x"}}, MERGE
        )
    assert (e.value.code, e.value.reason) == (409, "Conflict")
    assert e.value.message == (
        'Operation cannot be fulfilled on configmaps "a": the object has been modified; please apply your '
        "changes to the latest version and try again"
    )
    current = store.get("configmaps", "spark", "a")
    assert current["data"] == {"k": "v2"}
    ok = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]}, "data": {"k": "v3"}}
    assert store.patch("configmaps", "spark", "a", ok, MERGE)["data"] == {"k": "v3"}


def test_a_pods_deletion_is_two_writes_and_a_pending_grace_may_only_be_shortened(store: Store) -> None:
    """registry/rest/delete.go BeforeDelete ("The deletion operation happens in two phases") and
    pod/strategy.go CheckGracefulDelete: a pod's deletion first writes its deletionTimestamp and
    deletionGracePeriodSeconds (MODIFIED), grace 0 included (an unscheduled pod), then removes it (DELETED); a
    bound pod waits its grace; a shorter grace moves the deletionTimestamp by the difference; a negative one
    is 1."""
    now = [1_800_000_000.0]
    store.clock = lambda: now[0]
    spec = {"containers": [{"name": "c", "image": "i"}]}
    store.create("pods", {"metadata": {"name": "unbound"}, "spec": spec}, namespace="spark")
    store.create(
        "pods", {"metadata": {"name": "bound"}, "spec": {**spec, "nodeName": "n"}}, namespace="spark"
    )
    w = store.watch("pods", "spark", resource_version=str(store.resource_version))
    store.delete("pods", "spark", "unbound")
    first, second = w.next(5), w.next(5)
    assert first is not None and second is not None
    assert (first[0], second[0]) == ("MODIFIED", "DELETED")
    assert first[1]["metadata"]["deletionGracePeriodSeconds"] == 0
    assert first[1]["metadata"]["deletionTimestamp"] == "2027-01-15T08:00:00Z"
    marked = store.delete("pods", "spark", "bound", grace_period_seconds=30)
    assert marked["metadata"]["deletionTimestamp"] == "2027-01-15T08:00:30Z"
    now[0] += 5
    shorter = store.delete("pods", "spark", "bound", grace_period_seconds=10)
    assert shorter["metadata"]["deletionTimestamp"] == "2027-01-15T08:00:10Z"  # from the first request
    assert shorter["metadata"]["deletionGracePeriodSeconds"] == 10
    assert store.delete("pods", "spark", "bound", grace_period_seconds=20) == shorter  # never longer
    negative = store.delete("pods", "spark", "bound", grace_period_seconds=-5)
    assert negative["metadata"]["deletionGracePeriodSeconds"] == 1
    store.delete("pods", "spark", "bound", grace_period_seconds=0)  # the kubelet's, once it stopped
    events = [w.next(5) for _ in range(5)]
    assert [(e[0], e[1]["metadata"].get("deletionGracePeriodSeconds")) for e in events if e] == [
        ("MODIFIED", 30),
        ("MODIFIED", 10),
        ("MODIFIED", 1),
        ("MODIFIED", 0),
        ("DELETED", 0),
    ]
    assert store.list("pods", "spark")[0] == []


def test_a_pod_update_may_change_only_what_validate_pod_update_allows(store: Store) -> None:
    """pkg/apis/core/validation/validation.go `ValidatePodUpdate`: besides the metadata, an update may change
    the containers' images, activeDeadlineSeconds, add tolerations and remove scheduling gates; while the
    pod is gated, also add to its nodeSelector and set its affinity (`validateOnlyAddedNodeSelector`,
    PodSchedulingReadiness). What the update was made from is the caller's, never the store's."""
    container = {"name": "c", "image": "i:1", "resources": {"requests": {"cpu": "1"}}}
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [container],
            "schedulingGates": [{"name": "a"}, {"name": "b"}],
            "nodeSelector": {"zone": "z1"},
        },
    }
    store.create("pods", pod, namespace="spark", user=USER)

    def update(**spec: Any) -> dict[str, Any]:
        current = store.get("pods", "spark", "p")
        return store.replace(
            "pods", "spark", "p", {**current, "spec": {**current["spec"], **spec}}, user=USER
        )

    def refused(**spec: Any) -> str:
        with pytest.raises(ApiError) as e:
            update(**spec)
        assert (e.value.code, e.value.reason) == (422, "Invalid")
        return e.value.message

    image = [{**container, "image": "i:2"}]
    assert update(containers=image)["spec"]["containers"][0]["image"] == "i:2"
    assert update(nodeSelector={"zone": "z1", "disk": "ssd"})["spec"]["nodeSelector"]["disk"] == "ssd"
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
    assert update(affinity=affinity)["spec"]["affinity"] == affinity
    assert update(schedulingGates=[{"name": "b"}])["spec"]["schedulingGates"] == [{"name": "b"}]
    more_cpu = [{**image[0], "resources": {"requests": {"cpu": "2"}}}]
    assert "pod updates may not change fields other than" in refused(containers=more_cpu)
    assert "only additions to spec.nodeSelector are allowed" in refused(nodeSelector={"zone": "z2"})
    store.patch("pods", "spark", "p", {"spec": {"schedulingGates": None}}, MERGE, user=USER)
    assert "pod updates may not change fields other than" in refused(affinity=None)  # ungated: fixed
    assert "pod updates may not change fields other than" in refused(nodeSelector={"zone": "z1"})
    mine = copy.deepcopy(store.get("pods", "spark", "p"))
    mine["spec"]["activeDeadlineSeconds"] = 60
    stored = store.replace("pods", "spark", "p", mine, user=USER)
    mine["spec"]["containers"][0]["image"] = "changed-by-the-caller-afterwards"
    assert stored["spec"]["activeDeadlineSeconds"] == 60
    assert store.get("pods", "spark", "p")["spec"]["containers"][0]["image"] == "i:2"
