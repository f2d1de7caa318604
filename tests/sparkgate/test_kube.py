"""sparkgate/kube.py against kubesim over real HTTP: raw JSON CRUD, typed errors, retries, paging, watch."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any, TypedDict
from unittest.mock import ANY

import orjson
import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from kubesim.cluster import Cluster
from sparkgate.kube import (
    AUTH_REFRESH_SECONDS,
    Conflict,
    Gone,
    Invalid,
    Kube,
    KubeError,
    NotFound,
    NotLeading,
    Unavailable,
    Unread,
    decode,
    repeat_is_safe,
    resource_of,
)
from sparkgate.ratelimit import TokenBucket
from tests.sparkgate.test_ratelimit import Clock

NS = "spark"
PODS = f"/api/v1/namespaces/{NS}/pods"
CONFIG_MAPS = f"/api/v1/namespaces/{NS}/configmaps"


def config_map(name: str, **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"t": "1"}},
        "data": data,
    }


def gated_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulingGates": [{"name": "a.io/one"}, {"name": "sparkgate.io/allocator"}],
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "100m"}}}],
        },
    }


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(nodes=1, bookmark_interval=0.2) as c:
        c.add_namespace(NS)
        yield c


class Recorder:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, int]] = []
        self.sleeps: list[float] = []

    def __call__(self, verb: str, resource: str, code: int) -> None:
        self.requests.append((verb, resource, code))


@pytest.fixture
def recorder(cluster: Cluster) -> Iterator[Recorder]:
    cluster.faults.clear()
    yield Recorder()
    cluster.faults.clear()


@pytest.fixture
def kube(cluster: Cluster, recorder: Recorder) -> Iterator[Kube]:
    k = Kube.from_kubeconfig(
        str(cluster.kubeconfig()), on_request=recorder, sleep=recorder.sleeps.append, max_attempts=4
    )
    yield k
    k.close()


def test_resource_of_names_the_resource_and_subresource() -> None:
    assert resource_of("/api/v1/namespaces/x/pods/y/status") == "pods/status"
    assert resource_of("/api/v1/pods") == "pods"
    assert resource_of("/apis/coordination.k8s.io/v1/namespaces/x/leases/l") == "leases"


def test_crud_with_raw_json_and_typed_errors(kube: Kube, recorder: Recorder) -> None:
    created = kube.create(CONFIG_MAPS, config_map("crud", a="1"))
    assert created["metadata"]["uid"] and created["data"] == {"a": "1"}
    with pytest.raises(Conflict) as exists:
        kube.create(CONFIG_MAPS, config_map("crud"))
    assert exists.value.status == 409 and exists.value.reason == "AlreadyExists"
    patched = kube.patch(f"{CONFIG_MAPS}/crud", {"data": {"b": "2"}}, "application/merge-patch+json")
    assert patched["data"] == {"a": "1", "b": "2"}
    stale = dict(created, data={"c": "3"})
    with pytest.raises(Conflict):
        kube.replace(f"{CONFIG_MAPS}/crud", stale)
    kube.delete(f"{CONFIG_MAPS}/crud", preconditions={"uid": created["metadata"]["uid"]})
    with pytest.raises(NotFound):
        kube.get(f"{CONFIG_MAPS}/crud")
    assert ("create", "configmaps", 409) in recorder.requests
    assert ("get", "configmaps", 404) in recorder.requests
    assert recorder.sleeps == []  # nothing above is retried


def test_json_patch_test_op_failure_is_invalid_and_not_retried(kube: Kube, recorder: Recorder) -> None:
    kube.create(PODS, gated_pod("patch-test"))
    remove = [
        {"op": "test", "path": "/spec/schedulingGates/0/name", "value": "sparkgate.io/allocator"},
        {"op": "remove", "path": "/spec/schedulingGates/0"},
    ]
    with pytest.raises(KubeError) as refused:
        kube.patch(f"{PODS}/patch-test", remove, "application/json-patch+json")
    assert isinstance(refused.value, (Invalid, Conflict))
    assert recorder.sleeps == []
    remove[0]["path"] = remove[1]["path"] = "/spec/schedulingGates/1"
    remove[0]["path"] += "/name"
    pod = kube.patch(f"{PODS}/patch-test", remove, "application/json-patch+json")
    assert pod["spec"]["schedulingGates"] == [{"name": "a.io/one"}]


def without_urllib3_retries(cluster: Cluster, recorder: Recorder) -> Kube:
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(config_file=str(cluster.kubeconfig()), client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.retries = False
    return Kube(
        k8s.ApiClient(configuration), on_request=recorder, sleep=recorder.sleeps.append, max_attempts=4
    )


def retried_get(cluster: Cluster, kube: Kube, recorder: Recorder, name: str, retry_after: int) -> list[int]:
    """A GET answered 500, then 429 with Retry-After, then 200: the codes kube.py saw."""
    kube.create(CONFIG_MAPS, config_map(name))
    cluster.faults.fail("get", "configmaps", 500, count=1)
    cluster.faults.fail("get", "configmaps", 429, count=1, retry_after=retry_after)
    assert kube.get(f"{CONFIG_MAPS}/{name}")["metadata"]["name"] == name
    return [code for verb, _, code in recorder.requests if verb == "get"]


def test_5xx_and_429_are_retried_with_backoff_honouring_retry_after(
    cluster: Cluster, recorder: Recorder
) -> None:
    kube = without_urllib3_retries(cluster, recorder)
    try:
        assert retried_get(cluster, kube, recorder, "retried", 3) == [500, 429, 200]
    finally:
        kube.close()
    assert len(recorder.sleeps) == 2 and recorder.sleeps[1] == 3.0
    assert 0 <= recorder.sleeps[0] <= kube.backoff_cap


def test_no_hidden_retries_under_kubes_own(cluster: Cluster, kube: Kube, recorder: Recorder) -> None:
    assert retried_get(cluster, kube, recorder, "hidden", 1) == [500, 429, 200]


def test_retries_are_bounded(cluster: Cluster, kube: Kube, recorder: Recorder) -> None:
    cluster.faults.fail("list", "configmaps", 503, count=10)
    with pytest.raises(Unavailable) as failed:
        kube.list(CONFIG_MAPS)
    assert failed.value.status == 503
    assert len(recorder.requests) == kube.max_attempts and len(recorder.sleeps) == kube.max_attempts - 1


def test_a_limited_client_waits_for_its_budget_before_each_attempt(
    cluster: Cluster, kube: Kube, recorder: Recorder
) -> None:
    """`limited` shares the client (its requests are counted by the same hook) and takes a token of the
    bucket before every attempt, the retried ones included (as client-go throttles each try); the original
    client is not limited. A burst of 2, 10 a second: the create and the GET tried 3 times wait 0, 0, then
    0.1 s each."""
    clock = Clock()
    bucket = TokenBucket(10, 2, monotonic=clock, sleep=clock.sleep)
    limited = kube.limited(bucket.wait)
    assert retried_get(cluster, limited, recorder, "budget", 1) == [500, 429, 200]
    assert clock.slept == [pytest.approx(0.1), pytest.approx(0.1)]
    kube.get(f"{CONFIG_MAPS}/budget")
    assert len(clock.slept) == 2 and kube.limiter is None
    assert limited.api is kube.api, "one connection pool"


def test_the_connection_pool_is_sized_as_asked(cluster: Cluster) -> None:
    k = Kube.from_kubeconfig(str(cluster.kubeconfig()), pool_size=40)
    try:
        assert k.api.configuration.connection_pool_maxsize == 40
        assert k.api.rest_client.pool_manager.connection_pool_kw["maxsize"] == 40
    finally:
        k.close()


def test_authentication_is_read_once_a_minute_and_again_after_a_401(cluster: Cluster) -> None:
    """The token goes through the official client's refresh hook (what reloads a kubeconfig's or a rotated
    service account's token) once per AUTH_REFRESH_SECONDS, as client-go reads a token file, not per
    request; a 401 makes the next request read it again."""
    clock = Clock()
    k = Kube.from_kubeconfig(str(cluster.kubeconfig()), monotonic=clock)
    good = k.api.configuration.api_key["BearerToken"]
    token = [good]
    reads: list[str] = []

    def refresh(configuration: k8s.Configuration) -> None:
        reads.append(token[0])
        configuration.api_key["BearerToken"] = token[0]

    k.api.configuration.refresh_api_key_hook = refresh
    try:
        k.list(CONFIG_MAPS)
        k.list(CONFIG_MAPS)
        assert reads == [good]
        token[0] = "Bearer renewed-but-wrong"
        clock.now += AUTH_REFRESH_SECONDS - 1
        k.list(CONFIG_MAPS)
        assert len(reads) == 1, "the headers of the last minute are reused"
        clock.now += 1
        with pytest.raises(KubeError) as refused:
            k.list(CONFIG_MAPS)
        assert refused.value.status == 401 and len(reads) == 2
        token[0] = good
        k.list(CONFIG_MAPS)
        assert len(reads) == 3, "read again at once after the 401"
    finally:
        k.close()


def test_backoff_is_full_jitter_under_a_cap(cluster: Cluster) -> None:
    k = Kube.from_kubeconfig(str(cluster.kubeconfig()), rand=lambda: 1.0, backoff_base=0.1, backoff_cap=1.0)
    try:
        assert [k.backoff(a) for a in (1, 2, 3, 4, 5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    finally:
        k.close()


def test_list_pages_through_everything(kube: Kube, recorder: Recorder) -> None:
    for i in range(7):
        kube.create(CONFIG_MAPS, config_map(f"page-{i}"))
    items, rv = kube.list(CONFIG_MAPS, label_selector="t=1", page_size=3)
    assert sorted(i["metadata"]["name"] for i in items if i["metadata"]["name"].startswith("page-")) == [
        f"page-{i}" for i in range(7)
    ]
    assert rv.isdecimal()
    assert sum(1 for verb, _, _ in recorder.requests if verb == "list") >= 3


def test_list_pages_reads_the_next_page_only_once_the_items_before_it_were_taken(
    kube: Kube, recorder: Recorder
) -> None:
    for i in range(7):
        kube.create(CONFIG_MAPS, config_map(f"lazy-{i}", k="v"))
    lists = lambda: sum(1 for verb, _, _ in recorder.requests if verb == "list")  # noqa: E731
    items, rv = kube.list_pages(CONFIG_MAPS, label_selector="t=1", page_size=3)
    assert rv.isdecimal() and lists() == 1  # the first page at once: the list's resourceVersion is its
    names = [next(items)["metadata"]["name"] for _ in range(3)]
    assert lists() == 1
    names.append(next(items)["metadata"]["name"])  # the fourth: the second page
    assert lists() == 2
    names += [item["metadata"]["name"] for item in items]
    lazy = [n for n in names if n.startswith("lazy-")]
    assert lazy == sorted(lazy) and len(lazy) == 7 and len(names) == len(set(names))


def test_list_pages_lets_each_object_go_once_taken() -> None:
    """A relist of 100,000 pods is ~6.5 GB of parsed objects (bench/scale.py): a caller that keeps something
    small of each object must hold one page of whole objects at most, never the list."""

    class Listed(dict[str, Any]):  # a dict that a weak reference can follow
        pass

    refs: list[weakref.ref[Listed]] = []  # every object an answer carried

    class Paged(Kube):
        def request(self, method: str, path: str, **kwargs: Any) -> Any:
            token = int((kwargs.get("query") or {}).get("continue") or 0)
            page = [Listed(metadata={"name": f"p{token}-{i}"}) for i in range(2)]
            refs.extend(weakref.ref(item) for item in page)
            more = {"continue": str(token + 1)} if token + 1 < 3 else {}
            return {"metadata": {"resourceVersion": "9", **more}, "items": page}

    kube = Paged(k8s.ApiClient(k8s.Configuration()))
    items, rv = kube.list_pages("/api/v1/pods")
    taken = []
    for item in items:
        taken.append(item["metadata"]["name"])
        del item
        gc.collect()
        alive = [r() is not None for r in refs]
        assert sum(alive) <= 1, f"after {taken[-1]}: {alive}"  # at most the rest of its page
    assert rv == "9" and taken == [f"p{page}-{i}" for page in range(3) for i in range(2)]
    assert not any(r() is not None for r in refs)


class _Meta(TypedDict, total=False):
    name: str | None
    resourceVersion: str | None
    labels: dict[str, str] | None


class Named(TypedDict, total=False):
    """A shape: the fields a caller reads (sparkgate/kube.py `decode`)."""

    metadata: _Meta | None


def test_a_shape_decodes_only_its_fields_of_lists_watches_and_answers(cluster: Cluster, kube: Kube) -> None:
    for i in range(5):
        kube.create(CONFIG_MAPS, config_map(f"shaped-{i}", big="x" * 1000))
    items, rv = kube.list_pages(CONFIG_MAPS, label_selector="t=1", page_size=2, shape=Named)
    listed = [item for item in items if item["metadata"]["name"].startswith("shaped-")]
    assert rv.isdecimal() and len(listed) == 5  # every page, through the shaped "continue"
    assert set(listed[0]) == {"metadata"}  # no data, no kind
    assert listed[0]["metadata"] == {"name": "shaped-0", "labels": {"t": "1"}, "resourceVersion": ANY}
    stream = kube.watch(
        CONFIG_MAPS, resource_version=rv, label_selector="t=1", timeout_seconds=30, shape=Named
    )
    kube.delete(f"{CONFIG_MAPS}/shaped-0")
    kind, obj = next(e for e in stream if e[0] != "BOOKMARK")
    stream.close()
    assert kind == "DELETED" and set(obj) == {"metadata"} and obj["metadata"]["name"] == "shaped-0"
    assert int(obj["metadata"]["resourceVersion"]) > int(rv)
    created = kube.create(PODS, gated_pod("shaped-answer"))
    answer = kube.patch(
        f"{PODS}/shaped-answer", [{"op": "remove", "path": "/spec/schedulingGates/0"}],
        "application/json-patch+json", shape=Unread,
    )  # fmt: skip
    assert answer == {} and "spec" in created  # the answer read as nothing; the write was made:
    assert kube.get(f"{PODS}/shaped-answer")["spec"]["schedulingGates"] == [
        {"name": "sparkgate.io/allocator"}
    ]
    # An ERROR event does not fit a shape of configmaps: it is read whole, and raised as without a shape.
    cluster.store.compact()
    with pytest.raises(Gone, match="too old"):
        next(kube.watch(CONFIG_MAPS, resource_version=rv, timeout_seconds=30, shape=Named))


def test_data_that_does_not_fit_the_shape_is_decoded_whole() -> None:
    """A shape is a saving, never a filter of what is wrong: a field of another type than the shape says
    comes out whole, for the caller to handle as it handles a whole object; what is not JSON raises as it
    does without a shape."""
    odd = b'{"metadata":{"name":"p","labels":{"n":1}},"spec":{"containers":[]}}'
    assert decode(odd, Named) == orjson.loads(odd)
    fits = b'{"metadata":{"name":"p","labels":{"n":"1"}},"spec":{"containers":[]}}'
    assert decode(fits, Named) == {"metadata": {"name": "p", "labels": {"n": "1"}}}
    with pytest.raises(orjson.JSONDecodeError):
        decode(b'{"metadata":', Named)


def test_watch_resumes_from_a_resource_version_with_bookmarks(kube: Kube, recorder: Recorder) -> None:
    _, rv = kube.list(CONFIG_MAPS, label_selector="w=1")
    kube.create(CONFIG_MAPS, {"metadata": {"name": "watched", "labels": {"w": "1"}}})
    kube.delete(f"{CONFIG_MAPS}/watched")
    seen: list[str] = []
    for kind, obj in kube.watch(CONFIG_MAPS, resource_version=rv, label_selector="w=1", timeout_seconds=30):
        seen.append(kind)
        if kind == "BOOKMARK":
            assert int(obj["metadata"]["resourceVersion"]) >= int(rv)
            break
    assert seen[:2] == ["ADDED", "DELETED"] and seen[-1] == "BOOKMARK"
    assert ("watch", "configmaps", 200) in recorder.requests


def test_watch_raises_gone_for_a_version_too_old_and_a_compacted_stream_ends(
    cluster: Cluster, kube: Kube
) -> None:
    """kube-apiserver answers a version too old with an ERROR event (kubesim's test_api_contract), which the
    client raises as Gone; a stream whose history is compacted away ends, and resuming from it is Gone."""
    _, rv = kube.list(CONFIG_MAPS)
    kube.create(CONFIG_MAPS, config_map("before-compaction"))
    cluster.store.compact()
    with pytest.raises(Gone):
        next(kube.watch(CONFIG_MAPS, resource_version=rv, timeout_seconds=30))
    _, fresh = kube.list(CONFIG_MAPS)
    stream = kube.watch(CONFIG_MAPS, resource_version=fresh, timeout_seconds=30)
    kube.create(CONFIG_MAPS, config_map("after-compaction"))
    kind, obj = next(stream)
    assert kind in ("ADDED", "BOOKMARK")
    cluster.store.compact()
    assert {kind for kind, _ in stream} <= {"ADDED", "BOOKMARK"}  # it ends: no error in the stream
    with pytest.raises(Gone):
        next(kube.watch(CONFIG_MAPS, resource_version=obj["metadata"]["resourceVersion"], timeout_seconds=30))


def test_a_dropped_watch_ends_the_stream_for_the_caller_to_resume(cluster: Cluster, kube: Kube) -> None:
    _, rv = kube.list(CONFIG_MAPS)
    stream = kube.watch(CONFIG_MAPS, resource_version=rv, timeout_seconds=30)
    kube.create(CONFIG_MAPS, config_map("drop"))
    assert next(stream)[0] in ("ADDED", "BOOKMARK")
    cluster.faults.drop_watches()
    with pytest.raises((StopIteration, Unavailable)):
        while True:
            next(stream)


def test_a_gated_client_checks_before_every_write_attempt_and_never_gates_reads(
    cluster: Cluster, kube: Kube, recorder: Recorder
) -> None:
    """The leader's client (sparkgate/leader.py): a write is not sent once `leading()` is false, and a
    retried write asks again before each attempt, so leadership lapsing during its backoff stops it."""
    answers = [True, False]
    gated = kube.gated(lambda: answers.pop(0) if answers else False, timeout=30)
    cluster.faults.fail("create", "configmaps", 503, count=1)
    with pytest.raises(NotLeading):
        gated.create(CONFIG_MAPS, config_map("gated"))
    assert [(v, c) for v, r, c in recorder.requests if r == "configmaps"] == [("create", 503)]
    assert not answers and len(recorder.sleeps) == 1  # asked twice: before the attempt and the retry
    with pytest.raises(NotFound):
        gated.get(f"{CONFIG_MAPS}/gated")  # a read goes out, gate or not
    assert kube.create(CONFIG_MAPS, config_map("gated"))["metadata"]["name"] == "gated"  # kube is not gated


def test_a_request_timeout_ends_a_hung_request_without_retrying(
    cluster: Cluster, kube: Kube, recorder: Recorder
) -> None:
    """A single attempt with a timeout (the lease requests): a hung API server costs the timeout, once."""
    cluster.faults.hang("get", "configmaps")
    with pytest.raises(Unavailable):
        kube.request("GET", f"{CONFIG_MAPS}/anything", retry=False, timeout=0.5)
    assert recorder.requests == [("get", "configmaps", 0)] and recorder.sleeps == []


JSON_PATCH = "application/json-patch+json"
MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"


@pytest.mark.parametrize(
    ("method", "query", "body", "content_type", "safe"),
    [
        ("GET", None, None, None, True),
        ("POST", {"dryRun": "All"}, {"metadata": {"generateName": "x-"}}, None, True),  # stores nothing
        ("POST", None, {"metadata": {"name": "x"}}, None, True),  # a repeat: 409 AlreadyExists
        ("POST", None, {"metadata": {"generateName": "x-"}}, None, False),  # a repeat: a second object
        ("PUT", None, {"metadata": {"name": "x", "resourceVersion": "7"}}, None, True),  # a repeat: 409
        ("PUT", None, {"metadata": {"name": "x"}}, None, False),  # unconditional: may overwrite a change
        ("DELETE", None, {"preconditions": {"uid": "u"}}, None, True),  # a repeat: 404 (or 409)
        ("DELETE", None, {"kind": "DeleteOptions"}, None, False),  # may delete a new object of that name
        ("PATCH", None, "{}", APPLY, True),  # the same configuration again changes nothing
        ("PATCH", None, {"data": {"a": "1"}}, MERGE, False),
        # sparkgate's gate removal: the test of what the patch removes fails on a repeat (422)
        ("PATCH", None, [{"op": "test", "path": "/spec/g/1", "value": {}}, {"op": "remove", "path": "/spec/g/1"}],
         JSON_PATCH, True),
        ("PATCH", None, [{"op": "test", "path": "/spec/g/1/name", "value": "x"}, {"op": "remove", "path": "/spec/g/1"}],
         JSON_PATCH, True),
        # a test of something the patch does not change passes again: a repeat adds twice
        ("PATCH", None, [{"op": "test", "path": "/a", "value": 1}, {"op": "add", "path": "/b/-", "value": 1}],
         JSON_PATCH, False),
        ("PATCH", None, [{"op": "remove", "path": "/spec/g/1"}], JSON_PATCH, False),
    ],
)  # fmt: skip
def test_a_repeat_is_safe_only_when_the_api_server_refuses_it_or_it_changes_nothing(
    method: str, query: dict[str, str] | None, body: Any, content_type: str | None, safe: bool
) -> None:
    assert repeat_is_safe(method, query, body, content_type) is safe


def gated_remove(index: int) -> list[dict[str, Any]]:
    pointer = f"/spec/schedulingGates/{index}"
    return [
        {"op": "test", "path": pointer, "value": {"name": "sparkgate.io/allocator"}},
        {"op": "remove", "path": pointer},
    ]


@pytest.mark.parametrize("answer", [0, 500, 502, 504])
def test_a_write_whose_answer_is_lost_is_repeated_only_where_safe_and_says_it_may_have_been_applied(
    cluster: Cluster, kube: Kube, recorder: Recorder, answer: int
) -> None:
    """kubesim applies each write, then loses its answer (`Faults.lose`): no answer at all, or a 5xx without
    Retry-After. A guarded write is repeated and its repeat refused (the API server's own doing: the first
    landed), an apply repeated and accepted; an unguarded one is not repeated. Every error raised says the
    write may have been applied."""
    cluster.faults.lose("*", "*", answer=answer, count=None)
    name = f"lost-{answer}"
    with pytest.raises(Conflict) as exists:  # a named create: repeated, AlreadyExists
        kube.create(CONFIG_MAPS, config_map(name, a="1"))
    assert exists.value.reason == "AlreadyExists" and exists.value.maybe_applied
    stored = cluster.store.get("configmaps", NS, name)
    with pytest.raises(Conflict) as stale:  # a PUT with its resourceVersion: repeated, 409
        kube.replace(f"{CONFIG_MAPS}/{name}", {**stored, "data": {"a": "2"}})
    assert stale.value.maybe_applied and cluster.store.get("configmaps", NS, name)["data"] == {"a": "2"}
    with pytest.raises(Unavailable) as unanswered:  # a merge patch: not repeated
        kube.patch(f"{CONFIG_MAPS}/{name}", {"data": {"b": "3"}}, MERGE)
    assert unanswered.value.maybe_applied and cluster.store.get("configmaps", NS, name)["data"]["b"] == "3"
    cluster.store.create("pods", gated_pod(f"pod-{answer}"), namespace=NS)
    with pytest.raises(Invalid) as tested:  # the gate removal: repeated, its test fails
        kube.patch(f"{PODS}/pod-{answer}", gated_remove(1), JSON_PATCH)
    assert tested.value.maybe_applied
    with pytest.raises(NotFound) as gone:  # a DELETE with a precondition: repeated, 404
        kube.delete(f"{CONFIG_MAPS}/{name}", preconditions={"uid": stored["metadata"]["uid"]})
    assert gone.value.maybe_applied
    writes = [(v, r, c) for v, r, c in recorder.requests]
    lost_code = answer
    assert writes == [
        ("create", "configmaps", lost_code), ("create", "configmaps", 409),
        ("update", "configmaps", lost_code), ("update", "configmaps", 409),
        ("patch", "configmaps", lost_code),
        ("patch", "pods", lost_code), ("patch", "pods", 422),
        ("delete", "configmaps", lost_code), ("delete", "configmaps", 404),
    ]  # fmt: skip


def test_a_write_the_api_server_did_not_do_is_retried_whatever_it_is(
    cluster: Cluster, kube: Kube, recorder: Recorder
) -> None:
    """A 429, a 5xx with Retry-After (client-go retries every verb on it) and a connection never made are
    not applied: an unguarded write is sent again, and its success carries no doubt."""
    kube.create(CONFIG_MAPS, config_map("unguarded"))
    cluster.faults.fail("patch", "configmaps", 429, count=1, retry_after=0)
    cluster.faults.fail("patch", "configmaps", 503, count=1, retry_after=0)
    cluster.faults.fail("patch", "configmaps", 503, count=1)  # no Retry-After: not repeated
    with pytest.raises(Unavailable) as refused:
        kube.patch(f"{CONFIG_MAPS}/unguarded", {"data": {"b": "1"}}, MERGE)
    assert [c for v, _, c in recorder.requests if v == "patch"] == [429, 503, 503]
    assert refused.value.maybe_applied  # a 5xx without Retry-After: from here, nobody can tell
    nowhere = Kube(kube.api, sleep=recorder.sleeps.append, max_attempts=3)
    nowhere.host = "http://127.0.0.1:1"  # nothing listens: the connection is never made
    with pytest.raises(Unavailable) as unreachable:
        nowhere.patch(f"{CONFIG_MAPS}/unguarded", {"data": {"b": "1"}}, MERGE)
    assert not unreachable.value.maybe_applied and len(recorder.sleeps) == 2 + 2


def test_a_gated_write_ends_within_the_fence_on_the_client_and_the_api_server(
    cluster: Cluster, kube: Kube
) -> None:
    """The leader's writes carry the fence's timeout as the `timeout` parameter (kube-apiserver's request
    deadline: request_deadline.go), a dry run does not; a lapsed replica asks before it waits for the budget,
    so it spends no token."""
    waited: list[int] = []
    leading = [True]
    gated = kube.gated(lambda: leading[0], timeout=2.5).limited(lambda: waited.append(1))
    gated.create(CONFIG_MAPS, config_map("fenced"))
    gated.request("POST", CONFIG_MAPS, query={"dryRun": "All"}, body=config_map("dry"))
    queries = [
        e.query for e in cluster.requests.entries() if e.verb == "create" and e.resource == "configmaps"
    ]
    assert queries[-2:] == ["timeout=2.5s", "dryRun=All"]
    leading[0] = False
    with pytest.raises(NotLeading):
        gated.create(CONFIG_MAPS, config_map("lapsed"))
    assert len(waited) == 2, "no token for a write that is not sent"
