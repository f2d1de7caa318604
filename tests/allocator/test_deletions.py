"""Deletion classification and per-app history: the reason of every way an executor goes away, the
counts and recent records kept, and the persisted form read back (also from a newer version)."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from allocator import deletions
from allocator.deletions import DATA_KEY, EXECUTOR_IDS, RECENT, History, HistoryStore, classify, history_name
from allocator.model import DeletionReason, DeletionRecord, PodRecord
from allocator.workqueue import Backoff
from kubesim.cluster import Cluster
from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.kube import Kube, KubeError, NotFound


def pod(
    *,
    gated: bool = False,
    node: str | None = "node-1",
    phase: str = "Running",
    reason: str | None = None,
    exit_code: int | None = None,
    exec_id: int | None = 7,
) -> PodRecord:
    return PodRecord(
        "spark",
        "app-exec-7",
        "uid-7",
        "spark-app",
        exec_id,
        "0",
        gated,
        "default",
        None if gated else node,
        phase,
        True,
        1000.0,
        reason=reason,
        exit_code=exit_code,
    )


@pytest.mark.parametrize(
    ("record", "finishing", "expected"),
    [
        (pod(gated=True, phase="Pending"), False, DeletionReason.GATED),
        (pod(node=None, phase="Pending"), False, DeletionReason.PENDING),
        (pod(phase="Pending"), False, DeletionReason.PENDING),  # bound, not started
        (pod(), False, DeletionReason.RUNNING),
        (pod(phase="Failed", reason="Error", exit_code=1), False, DeletionReason.FAILED),
        (pod(phase="Failed", reason="OOMKilled", exit_code=137), False, DeletionReason.OOM_KILLED),
        (pod(phase="Failed", reason="Evicted"), False, DeletionReason.EVICTED),
        (pod(phase="Failed", reason="Preempted"), False, DeletionReason.PREEMPTED),
        (pod(phase="Failed", reason="PreemptionByScheduler"), False, DeletionReason.PREEMPTED),
        (pod(phase="Succeeded", reason="Completed", exit_code=0), False, DeletionReason.SUCCEEDED),
        # the driver went away: whatever was still alive was ended by the app finishing...
        (pod(gated=True, phase="Pending"), True, DeletionReason.APP_FINISHED),
        (pod(), True, DeletionReason.APP_FINISHED),
        # ...but an executor that had already failed or succeeded keeps its own story
        (pod(phase="Failed", reason="OOMKilled", exit_code=137), True, DeletionReason.OOM_KILLED),
        (pod(phase="Succeeded"), True, DeletionReason.SUCCEEDED),
    ],
)
def test_classify(record: PodRecord, finishing: bool, expected: DeletionReason) -> None:
    entry = classify(record, 2000.5, app_finishing=finishing)
    assert entry.reason is expected
    assert (entry.exec_id, entry.pod, entry.node, entry.at) == (7, "app-exec-7", record.node, 2000.5)
    assert (entry.exit_code, entry.detail) == (record.exit_code, record.reason)


def test_history_counts_by_reason_keeps_recent_records_and_every_exec_id() -> None:
    history = History()
    for i in range(RECENT + 10):
        reason = DeletionReason.RUNNING if i % 3 else DeletionReason.OOM_KILLED
        history.record(DeletionRecord(i, f"exec-{i}", "node-1", 100.0 + i, reason))
    history.record(DeletionRecord(None, "exec-bad-id", None, 500.0, DeletionReason.GATED))
    assert history.counts == {
        DeletionReason.OOM_KILLED: 20,
        DeletionReason.RUNNING: 40,
        DeletionReason.GATED: 1,
    }
    assert len(history.recent) == RECENT
    assert history.recent[-1].pod == "exec-bad-id"
    assert history.recent[0].exec_id == 11  # the oldest ones dropped
    assert history.exec_ids == set(range(RECENT + 10))  # ids are never forgotten: reuse is refused


def test_history_round_trips_through_json() -> None:
    history = History(finished_at=3000.0)
    history.record(DeletionRecord(3, "exec-3", "node-2", 10.25, DeletionReason.OOM_KILLED, 137, "OOMKilled"))
    history.record(DeletionRecord(None, "exec-x", None, 11.0, DeletionReason.ID_REUSE))
    history.record(DeletionRecord(4, "exec-4", None, 12.0, DeletionReason.GATED))
    data = json.loads(json.dumps(history.to_dict()))
    assert data["counts"] == {"deleted_while_gated": 1, "id_reuse_refused": 1, "oom_killed": 1}
    back = History.from_dict(data)
    assert back.counts == history.counts
    assert list(back.recent) == list(history.recent)
    assert back.exec_ids == {3, 4}
    assert back.finished_at == 3000.0
    assert back.to_dict() == history.to_dict()


def test_history_from_a_newer_version_skips_unknown_reasons_and_keeps_the_rest() -> None:
    data: dict[str, Any] = {
        "counts": {"failed": 2, "reason_from_the_future": 5},
        "recent": [
            {"execId": 1, "pod": "exec-1", "node": "n", "at": 5, "reason": "failed", "exitCode": 1},
            {"execId": 2, "pod": "exec-2", "node": "n", "at": 6, "reason": "reason_from_the_future"},
        ],
        "execIds": [1, 2],
        "somethingNew": True,
    }
    back = History.from_dict(data)
    assert back.counts == {DeletionReason.FAILED: 2}
    assert [r.exec_id for r in back.recent] == [1]
    assert back.recent[0].at == 5.0 and back.recent[0].detail is None
    assert back.exec_ids == {1, 2} and back.finished_at is None


def test_history_from_an_empty_document() -> None:
    back = History.from_dict({})
    assert not back.counts and not back.recent and not back.exec_ids and back.finished_at is None
    assert len(History.from_dict({"recent": []}).recent) == 0


def test_a_history_of_100000_deletions_of_one_app_stays_far_below_the_configmap_limit() -> None:
    """Issue 18: every executor id was kept and the whole ConfigMap rewritten on each change, so a long
    dynamic-allocation app reached the API server's 1 MiB object limit. Written to the API server and read
    back, 100,000 deletions of one app stay a few tens of KiB; the ids dropped are counted."""
    with Cluster(nodes=1) as cluster:
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig("admin")))
        dropped: list[int] = []
        store = HistoryStore(
            kube,
            contract.INSTALL_NAMESPACE,
            retention=3600,
            backoff=Backoff(1, 10),
            on_truncate=dropped.append,
        )
        key = AppKey("spark", "spark-long")
        for i in range(1, 100_001):
            record = DeletionRecord(i, f"spark-long-exec-{i}", "node-1", 1000.0 + i, DeletionReason.SUCCEEDED)
            assert store.record(key, f"uid-{i}", record)
        # A deletion seen after its app ended (a late gone event) starts a finished history, which expires.
        late = AppKey("spark", "spark-over")
        assert store.record(late, "uid-late", record, ended_at=50.0)
        assert (view := store.view(late)) is not None and view.finished_at == 50.0
        store.flush()
        saved = kube.get(f"/api/v1/namespaces/{contract.INSTALL_NAMESPACE}/configmaps/{history_name(key)}")
        kube.close()
    size = len(json.dumps(saved).encode())
    assert size < 64 * 1024, size  # the limit is 1 MiB (etcd's request limit: 1.5 MiB)
    back = History.from_dict(json.loads(saved["data"][DATA_KEY]))
    assert back.counts[DeletionReason.SUCCEEDED] == 100_000
    assert back.exec_ids == set(
        range(100_001 - EXECUTOR_IDS, 100_001)
    )  # the latest ids: Spark counts upwards
    assert back.dropped == sum(dropped) == 100_000 - EXECUTOR_IDS
    assert len(back.recent) == RECENT


def test_the_uids_recorded_are_bounded_and_the_oldest_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deletions, "RECORDED_UIDS", 4)
    store = HistoryStore(cast(Kube, None), contract.INSTALL_NAMESPACE, retention=60, backoff=Backoff(1, 10))
    key = AppKey("spark", "a")
    record = DeletionRecord(1, "p", None, 1.0, DeletionReason.SUCCEEDED)
    for i in range(5):
        assert store.record(key, f"uid-{i}", record)
    assert not store.record(key, "uid-4", record)  # seen: counted once
    assert store.record(key, "uid-0", record)  # forgotten past the bound: the oldest half went


def test_a_replica_whose_leadership_lapses_mid_flush_writes_nothing_more_and_counts_no_failure() -> None:
    """The histories are written through the leader's gated client (allocator/commands.py `assemble`). Once
    `leading()` is false the flush stops, the rest stays unsaved in memory, and no failed write is counted
    (a write already in flight is kept from overwriting the new leader's by its resourceVersion: below)."""
    with Cluster(nodes=1) as cluster:
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig("admin")))
        leading, failures = [True], []
        store = HistoryStore(
            kube.gated(lambda: leading[0], timeout=30),
            contract.INSTALL_NAMESPACE,
            retention=3600,
            backoff=Backoff(1, 10),
            on_write_failure=lambda: failures.append(1),
        )
        record = DeletionRecord(1, "p", None, 1.0, DeletionReason.SUCCEEDED)
        for app in ("a", "b", "c"):
            store.record(AppKey("spark", app), f"uid-{app}", record)
        sent = cluster.requests.count(resource="configmaps")
        real = store.kube.request

        def lapse_after_one(method: str, path: str, **kwargs: Any) -> Any:
            answer = real(method, path, **kwargs)
            if method != "GET":
                leading[0] = False  # the lease lapses once the first write is through
            return answer

        store.kube.request = lapse_after_one  # type: ignore[method-assign]
        store.flush()
        writes = [e for e in cluster.requests.entries() if e.resource == "configmaps"][sent:]
        assert [(e.verb, e.code) for e in writes] == [("create", 201)]  # one history saved
        assert failures == []
        assert store.unsaved() == 2
        store.kube.request = real  # type: ignore[method-assign]
        leading[0] = True  # leading again (or a new leader holding these records): the rest is saved
        store.flush()
        assert store.unsaved() == 0 and failures == []
        kube.close()


def test_a_finished_history_of_an_app_that_lives_again_no_longer_expires() -> None:
    """A client-mode app said over (its grace passed) whose driver creates pods again: its history is
    unfinished again, so its deleted executor ids stay refused while it runs (registry.py's revival)."""
    store = HistoryStore(cast(Kube, None), contract.INSTALL_NAMESPACE, retention=60, backoff=Backoff(1, 10))
    key = AppKey("spark", "a")
    store.record(key, "uid-1", DeletionRecord(1, "p", None, 1.0, DeletionReason.SUCCEEDED))
    store.finished(key, 100.0)
    assert key not in store.unfinished()
    store.unfinished_again(key)
    assert key in store.unfinished() and store.view(key) is not None
    store.unfinished_again(AppKey("spark", "none"))  # an app with no history: nothing to do
    assert store.count() == 1


class RefusingKube:
    """An API server that refuses every ConfigMap write (a `count/configmaps` quota reached) and records what
    it was asked; `during_delete` runs while a DELETE is in flight."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.during_delete: Any = None

    def replace(self, path: str, body: Any) -> Any:
        self.sent.append("PUT")
        raise KubeError(403, "Forbidden", "exceeded quota: count/configmaps")

    def create(self, path: str, body: Any) -> Any:
        self.sent.append("POST")
        raise KubeError(403, "Forbidden", "exceeded quota: count/configmaps")

    def delete(self, path: str, **kwargs: Any) -> Any:
        self.sent.append("DELETE")
        if self.during_delete is not None:
            self.during_delete()
        raise NotFound(404, "NotFound", "not found")


def test_a_finished_history_that_cannot_be_saved_still_expires_and_leaves_nothing_unsaved() -> None:
    """Expiry skipped the histories with unsaved changes: with every write refused for good, each history
    ever recorded was held and retried at each flush for the rest of the process's life. A finished one past
    the retention now goes whether saved or not; and a deletion recorded for it while it is being deleted
    (a late gone event) goes with it instead of leaving an unsaved change with no history behind it."""
    now = [1000.0]
    kube = RefusingKube()
    store = HistoryStore(
        cast(Kube, kube),
        contract.INSTALL_NAMESPACE,
        retention=60,
        backoff=Backoff(0, 0),
        clock=lambda: now[0],
    )
    record = DeletionRecord(1, "p", None, 1.0, DeletionReason.SUCCEEDED)
    for app in ("a", "b"):
        store.record(AppKey("spark", app), f"uid-{app}", record)
    store.finished(AppKey("spark", "a"), 1000.0)
    store.flush()
    assert store.unsaved() == 2 and store.count() == 2  # refused: kept, to be retried
    now[0] = 1061.0
    late = DeletionRecord(2, "p2", None, 2.0, DeletionReason.SUCCEEDED)
    kube.during_delete = lambda: store.record(AppKey("spark", "a"), "uid-late", late)
    kube.sent.clear()
    store.flush()
    assert kube.sent == ["POST", "DELETE"]  # b retried; a, expired, deleted and not written again
    assert store.count() == 1 and store.unsaved() == 1  # b, live, still held and retried
    assert store.view(AppKey("spark", "a")) is None


HISTORIES = f"/api/v1/namespaces/{contract.INSTALL_NAMESPACE}/configmaps"


def saving_store(kube: Kube, **options: Any) -> HistoryStore:
    """A store that saves to kubesim, retrying a failed write at its next flush (no backoff)."""
    return HistoryStore(kube, contract.INSTALL_NAMESPACE, retention=3600, backoff=Backoff(0, 0), **options)


def deletion(exec_id: int, reason: DeletionReason = DeletionReason.SUCCEEDED) -> DeletionRecord:
    """Executor `exec_id`'s deletion (its pod `p<exec_id>`), at second `exec_id`."""
    return DeletionRecord(exec_id, f"p{exec_id}", None, float(exec_id), reason)


def stored_history(kube: Kube, app: AppKey) -> History:
    return History.from_dict(json.loads(kube.get(f"{HISTORIES}/{history_name(app)}")["data"][DATA_KEY]))


def configmap_writes(cluster: Cluster, since: int) -> list[tuple[str, int]]:
    return [(e.verb, e.code) for e in cluster.requests.entries()[since:] if e.resource == "configmaps"]


def test_a_deposed_leaders_late_write_is_merged_not_overwritten() -> None:
    """A history is written with the resourceVersion last read or written, as kube-apiserver's optimistic
    concurrency expects (a PUT whose metadata.resourceVersion is stale is a 409). A write of the previous
    leader that lands after the new leader read the histories (sent before its lease lapsed, answered late)
    made the new leader's next PUT overwrite it: executor ids it recorded were forgotten and could be reused.
    Now the new leader's PUT is refused, it reads what is stored, folds it in and writes the union."""
    app = AppKey("spark", "a")
    with Cluster(nodes=1) as cluster:
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig("admin")))
        old, new = saving_store(kube), saving_store(kube)
        old.record(app, "uid-1", deletion(1))
        old.flush()
        assert new.load()
        old.record(app, "uid-2", deletion(2, DeletionReason.FAILED))
        old.flush()  # the late write
        new.record(app, "uid-3", deletion(3))
        sent = len(cluster.requests.entries())
        new.flush()
        assert configmap_writes(cluster, sent) == [("update", 409), ("get", 200)]
        assert new.unsaved() == 1
        new.flush()
        assert new.unsaved() == 0
        history = stored_history(kube, app)
        kube.close()
    assert history.exec_ids == {1, 2, 3}
    assert [r.pod for r in history.recent] == ["p1", "p2", "p3"]
    assert history.counts[DeletionReason.FAILED] == 1 and history.counts[DeletionReason.SUCCEEDED] >= 1


def test_a_merge_keeps_the_union_of_both_records_within_the_bound() -> None:
    mine, stored = History(), History()
    for exec_id in (1, 2, 5):
        mine.record(deletion(exec_id), keep=3)
    for exec_id in (1, 3, 4):
        stored.record(deletion(exec_id), keep=3)
    mine.merge(stored, keep=3)
    assert mine.exec_ids == {3, 4, 5} and mine.dropped == 2  # 1 and 2, the lowest, no longer kept
    assert [r.exec_id for r in mine.recent] == [1, 2, 3, 4, 5]  # in time order, p1 once
    assert mine.counts[DeletionReason.SUCCEEDED] == 3  # each side's larger: a lower bound of the 5
    mine.merge(stored, keep=3)  # the same copy again (a second conflict, a load): nothing changes
    assert mine.exec_ids == {3, 4, 5} and mine.dropped == 2 and len(mine.recent) == 5
    mine.record(deletion(6), keep=3)
    assert mine.exec_ids == {4, 5, 6} and mine.dropped == 3


def test_a_corrupt_history_met_on_a_conflict_is_set_aside_once_and_overwritten() -> None:
    """A history whose stored copy does not parse, met when its first write finds it already there (409
    AlreadyExists), and whose deletion is refused (403): copied aside once, then overwritten without a
    precondition, instead of a new copy aside at every flush."""
    app = AppKey("spark", "a")
    with Cluster(nodes=1) as cluster:
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig("admin")))
        corrupt = HistoryStore._body(app, History())
        corrupt["data"][DATA_KEY] = "{not json"
        kube.create(HISTORIES, corrupt)
        aside: list[int] = []
        store = saving_store(kube, on_corrupt=lambda: aside.append(1))
        store.record(app, "uid-1", deletion(1))
        cluster.faults.fail("delete", "configmaps", 403, count=None)
        for _ in range(3):
            store.flush()
        assert aside == [1] and store.unsaved() == 0
        history = stored_history(kube, app)
        copies, _ = kube.list(HISTORIES, label_selector="sparkgate.io/history=corrupt")
        kube.close()
    assert history.exec_ids == {1}
    assert len(copies) == 1


def test_a_history_written_while_the_histories_are_listed_is_not_rolled_back_by_the_list() -> None:
    """`load` runs on the loop's thread, the flushes on the histories thread: a history a flush writes
    between the list's read and its swap is newer than its listed copy, so memory keeps it (and its
    resourceVersion), instead of forgetting the deletions written meanwhile until the next conflict."""
    app = AppKey("spark", "a")
    with Cluster(nodes=1) as cluster:
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig("admin")))
        store = saving_store(kube)
        store.record(app, "uid-1", deletion(1))
        store.flush()
        listing = kube.list

        def list_then_a_flush(path: str, **kwargs: Any) -> Any:
            answer = listing(path, **kwargs)
            store.record(app, "uid-2", deletion(2))
            store.flush()  # the histories thread, while the loop's load holds the older listing
            return answer

        store.kube.list = list_then_a_flush  # type: ignore[method-assign]
        assert store.load()
        store.kube.list = listing  # type: ignore[method-assign]
        history = store.view(app)
        assert history is not None and history.exec_ids == {1, 2}
        store.record(app, "uid-3", deletion(3))
        sent = len(cluster.requests.entries())
        store.flush()  # written with the version the flush got, not the listed one: no conflict
        writes = configmap_writes(cluster, sent)
        kube.close()
    assert writes == [("update", 200)]
