"""`sparkgate allocator` (run the controller) and `sparkgate status` (show what it is doing: status_output.py).

The allocator's parts are wired here (`assemble`), not in the controller: what feeds what, which callbacks
the cache calls (the one list of pod observers), and the leader-elected periodic tasks (certificate
rotation under its own Lease; a task for the allocator's leader is a `LeaderTask(own_lease=False)` on the
controller's elector).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import logging
import signal
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkgate import contract

from .status_output import OUTPUTS, run_status

if TYPE_CHECKING:
    from certs.sync import Target
    from sparkgate.kube import Kube
    from sparkgate.leader import LeaderTask
    from sparkgate.policy_file import PolicySource
    from sparkgate.ratelimit import TokenBucket

    from .extender import Extender
    from .loop import Controller, Options
    from .metrics import AllocatorMetrics
    from .probe import PolicyProbe


def register(subparsers: Any) -> None:
    from certs.commands import add_target_options
    from sparkgate.cli_options import (
        FromEnv,
        FromEnvSwitch,
        client_options,
        install_namespace,
        server_options,
    )

    from .loop import Options
    from .probe import DEFAULT_INTERVAL, DEFAULT_MAX_DRY_RUNS

    a = subparsers.add_parser("allocator", help="run the allocator controller (and certificate rotation)")
    client_options(a, "the Leases")
    server_options(a)
    install_namespace(a)
    a.add_argument(
        "--http",
        action=FromEnv,
        env="SPARKGATE_ALLOCATOR_HTTP",
        default="0.0.0.0:8080",
        metavar="HOST:PORT",
        help="where /metrics, /apps, the probes and the scheduler extender are served",
    )
    a.add_argument(
        "--lease-name",
        action=FromEnv,
        env="SPARKGATE_LEASE",
        default=contract.ALLOCATOR_LEASE,
        metavar="NAME",
        help="the controller's Lease, in the install namespace",
    )
    a.add_argument(
        "--tick",
        type=float,
        default=Options.tick,
        metavar="SECONDS",
        help="seconds between full decisions (time-based conditions)",
    )
    a.add_argument(
        "--batch-period",
        type=float,
        default=Options.batch_period,
        metavar="SECONDS",
        help="seconds an app's decision waits after the first watch event that changed it, so that a burst's "
        "events are decided once",
    )
    a.add_argument(
        "--lease-duration",
        type=float,
        default=Options.lease_duration,
        metavar="SECONDS",
        help="a replica takes the Lease when its holder has not renewed it for this long",
    )
    a.add_argument(
        "--renew-deadline",
        type=float,
        default=Options.renew_deadline,
        metavar="SECONDS",
        help="the leader stops leading (and writing) when its last renewal is this old",
    )
    a.add_argument(
        "--retry-period",
        type=float,
        default=Options.retry_period,
        metavar="SECONDS",
        help="the leader renews its Lease, and a follower tries to take it, this often",
    )
    a.add_argument(
        "--stall-after",
        type=float,
        action=FromEnv,
        env="SPARKGATE_STALL_AFTER",
        default=Options.stall_after,
        metavar="SECONDS",
        help="/healthz fails when a watch or the loop made no progress for this many seconds",
    )
    a.add_argument(
        "--backoff-base",
        type=float,
        default=Options.backoff_base,
        metavar="SECONDS",
        help="an app's first retry after a failed write; doubles per failure",
    )
    a.add_argument(
        "--backoff-cap",
        type=float,
        default=Options.backoff_cap,
        metavar="SECONDS",
        help="the longest backoff of an app",
    )
    a.add_argument(
        "--client-app-grace",
        type=float,
        action=FromEnv,
        env="SPARKGATE_CLIENT_APP_GRACE",
        default=Options.client_grace,
        metavar="SECONDS",
        help="a client-mode app (no driver pod) with no sign of life this many seconds is over",
    )
    a.add_argument(
        "--history-retention",
        type=float,
        action=FromEnv,
        env="SPARKGATE_HISTORY_RETENTION",
        default=Options.history_retention,
        metavar="SECONDS",
        help="seconds a finished app's deletion history is kept",
    )
    a.add_argument(
        "--history-executor-ids",
        type=int,
        action=FromEnv,
        env="SPARKGATE_HISTORY_EXECUTOR_IDS",
        default=Options.history_executor_ids,
        metavar="IDS",
        help="deleted executor ids kept per app (their reuse is refused)",
    )
    a.add_argument(
        "--certs",
        action=FromEnvSwitch,
        env="SPARKGATE_CERTS_SYNC",
        default=True,
        help="run certificate rotation under the sparkgate-certs Lease",
    )
    add_target_options(a)
    a.add_argument(
        "--kube-api-qps",
        type=float,
        default=100.0,
        metavar="WRITES_PER_SECOND",
        help="the allocator's writes (gate removals, config maps, deletions, events) per second, on average",
    )
    a.add_argument(
        "--kube-api-burst",
        type=int,
        default=200,
        metavar="WRITES",
        help="the allocator's writes sent at once, above the QPS",
    )
    a.add_argument(
        "--probe-interval",
        type=float,
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help="seconds between dry-run probes of the policy's profiles while leading (0: never)",
    )
    a.add_argument(
        "--probe-max-dry-runs",
        type=_dry_runs,
        default=DEFAULT_MAX_DRY_RUNS,
        metavar="DRY_RUNS",
        help="at most this many dry-run pod creations per probe run (>= 2); the pairs left over are "
        "probed by the next runs, rotating through the namespaces",
    )
    a.add_argument(
        "--admission",
        choices=("webhook", "policy"),
        action=FromEnv,
        env="SPARKGATE_ADMISSION",
        default="webhook",
        help="policy: keep the MutatingAdmissionPolicy rendered from the policy applied while leading, for the "
        "install without the webhook (docs/install.md)",
    )
    a.set_defaults(run=run_allocator)

    s = subparsers.add_parser("status", help="show the allocator's view of every app")
    s.add_argument(
        "--url",
        action=FromEnv,
        env="SPARKGATE_ALLOCATOR_URL",
        default="http://127.0.0.1:8080",
        help="the allocator to ask (its --http)",
    )
    s.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default="table",
        help="table, wide (more columns), or the /apps document as json or yaml",
    )
    s.set_defaults(run=run_status)


@dataclass
class Allocator:
    """Every part of a running allocator, wired; `start` starts their threads, `run` the loop."""

    controller: Controller
    extender: Extender
    tasks: list[LeaderTask]
    stop: threading.Event
    probe: PolicyProbe | None = None

    def start(self) -> None:
        for reflector in self.controller.reflectors:
            reflector.start()
        threading.Thread(target=self.controller.lead, name="leader-election", daemon=True).start()
        for task in self.tasks:
            task.start()

    def shutdown(self) -> None:
        """Stop everything; the lease is given up last, once no task of this replica can write any more (a
        task still running when a follower took the lease would write beside the new leader)."""
        self.stop.set()
        for task in self.tasks:
            task.thread.join(timeout=10)
        self.controller.shutdown()


def _dry_runs(text: str) -> int:
    """--probe-max-dry-runs: one probe takes up to two dry runs, so fewer than two would probe nothing."""
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{value}: at least 2 (one probe takes up to two dry runs)")
    return value


def driver_fields(pod: dict[str, Any]) -> dict[str, Any]:
    """What the cache's driver records and the placement read of a driver pod (cache.driver_record,
    placement.driver_event): a relist keeps this of each driver, not the whole pod."""
    meta = pod.get("metadata") or {}
    return {
        "metadata": {
            k: meta[k] for k in ("namespace", "name", "uid", "labels", "deletionTimestamp") if k in meta
        },
        "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName")},
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }


def provisioning_served(kube: Kube) -> bool:
    """Whether the API server serves ProvisioningRequests (discovery: cluster-autoscaler's CRD is installed),
    said once in the log: without them a `provisioning` class in the policy is not used, and the held pods
    are marked for the autoscaler instead (allocator/demand.py; `sparkgate status` says it too). Asked at the
    start only: a CRD installed later is used after the allocator's next restart."""
    from sparkgate.kube import KubeError

    log = logging.getLogger("sparkgate.allocator")
    try:
        resources = kube.get("/apis/autoscaling.x-k8s.io/v1").get("resources") or []
    except KubeError as e:
        if e.status != 404:
            log.warning("could not tell whether ProvisioningRequests are served (%s): not using them", e)
            return False
        resources = []
    if any(r.get("name") == "provisioningrequests" for r in resources):
        log.info("ProvisioningRequests (autoscaling.x-k8s.io/v1) are served: `provisioning` classes are used")
        return True
    log.info(
        "ProvisioningRequests (autoscaling.x-k8s.io/v1) are not served: a `provisioning` class is not used, "
        "the executors sparkgate holds are shown to the autoscaler by their condition alone"
    )
    return False


def assemble(
    kube: Kube,
    policy: PolicySource,
    options: Options,
    metrics: AllocatorMetrics,
    *,
    certs: Target | None = None,
    certs_interval: float = 60.0,
    probe_interval: float = 0.0,
    probe_max_dry_runs: int = 100,
    admission_policy: bool = False,
    stop: threading.Event | None = None,
    write_budget: TokenBucket | None = None,
) -> Allocator:
    """The allocator's parts and who feeds whom (the threading model is in allocator/loop.py):
    reflectors -> cache -> (work queue, expectations, release-to-bind times, gone pods) -> loop -> actor."""
    from sparkgate.kube import Reflector
    from sparkgate.leader import LeaderElector, LeaderTask

    from .actor import Actor
    from .cache import Cache, ExecutorPod
    from .deletions import HISTORY_LABEL, HistoryStore
    from .expectations import BindTimes, Expectations
    from .extender import Extender
    from .health import Health
    from .loop import Controller
    from .placement import DEFAULT_RETENTION, Placement
    from .workqueue import Backoff, WorkQueue

    stop = stop or threading.Event()
    queue = WorkQueue(Backoff(options.backoff_base, options.backoff_cap))
    # The controller's callbacks are bound after it exists; the parts reach it through these.
    parts: dict[str, Controller] = {}
    # A release whose answer was lost is counted when the watch shows it (Expectations.answered).
    expectations = Expectations(
        on_confirmed=lambda action: parts["controller"].on_release(action, parts["controller"].clock())
    )

    def bound(namespace: str, seconds: float) -> None:
        with metrics.in_namespace(namespace):
            metrics.release_to_bind.labels(namespace).observe(seconds)

    bind_times = BindTimes(bound)
    elector = LeaderElector(
        kube,
        options.install_namespace,
        options.lease_name,
        options.identity,
        lease_duration=options.lease_duration,
        renew_deadline=options.renew_deadline,
        retry_period=options.retry_period,
        on_error=metrics.leader_errors.inc,
    )
    # The leader thread turns every retry period and a turn ends within the renew deadline.
    health = Health(options.stall_after, bounds={"leader": options.lease_duration + options.renew_deadline})
    # Every write only the leader may make goes through this client: it asks the elector before each attempt
    # (a replica whose leadership lapsed mid-flush or mid-task sends nothing more) and ends within the fence
    # (LeaderElector.gate).
    leader_writes = elector.gate(kube)
    histories = HistoryStore(
        leader_writes,
        options.install_namespace,
        retention=options.history_retention,
        backoff=Backoff(options.history_flush, options.backoff_cap),
        executor_ids=options.history_executor_ids,
        on_corrupt=metrics.history_corrupt.inc,
        on_truncate=metrics.history_ids_dropped.inc,
        on_write_failure=metrics.history_write_failures.inc,
    )
    cache = Cache(
        lambda apps: parts["controller"].on_change(apps),
        lambda record, removed: parts["controller"].on_gone(record, removed),
    )

    # What the scheduler extender answers from (every replica keeps it, followers included).
    def retention() -> float:
        current = policy.current()
        return DEFAULT_RETENTION if current is None else current.longest_failure_window()

    placement = Placement(retention=retention)
    # The one place where every executor pod change is observed: add observers here.
    cache.pod_observers += [expectations.observe, bind_times.observe, placement.observe]
    cache.confirms = expectations.confirms
    # The actor's writes wait for the client-side budget; watches, the Lease and the histories do not.
    writes = leader_writes if write_budget is None else leader_writes.limited(write_budget.wait)
    actor = Actor(
        writes,
        options.install_namespace,
        identity=options.identity,
        on_release=lambda action, at: parts["controller"].on_release(action, at),
        # Before the PATCH: its bind (or its deletion) may be watched before the PATCH returns, and an entry
        # made after that would never be taken (release-to-bind times, expectations.BindTimes).
        on_sending=lambda action: bind_times.released(action.pod.uid),
        on_delete=lambda action: parts["controller"].on_delete(action),
        on_gate_removed=metrics.gate_removal.observe,
        on_mark=lambda action, outcome: metrics.demand_marks.labels(outcome).inc(),
    )
    cache.pod_observers.append(actor.observe)

    def driver_event(kind: str, obj: dict[str, Any]) -> None:  # one drivers' watch feeds both
        cache.driver_event(kind, obj)
        placement.driver_event(kind, obj)

    def drivers_replace(items: Iterable[dict[str, Any]]) -> None:
        # The list comes page by page and is read once: what both read of each driver pod is kept.
        drivers = [driver_fields(obj) for obj in items]
        cache.drivers_replace(drivers)
        placement.drivers_replace(drivers)

    ns = options.install_namespace
    common: dict[str, Any] = {
        "stop": stop,
        "on_restart": lambda watch, cause: metrics.watch_restarts.labels(watch, cause).inc(),
        "on_crash": lambda watch: metrics.reflector_crashes.labels(watch).inc(),
        "on_progress": lambda watch: health.beat(f"watch {watch}"),
        "timeout_seconds": options.watch_timeout,
    }
    reflectors = [
        Reflector(
            kube, "executors", "/api/v1/pods", "spark-role=executor", cache.pod_event, cache.pods_replace,
            shape=ExecutorPod, **common,
        ),
        Reflector(
            kube, "drivers", "/api/v1/pods", "spark-role=driver", driver_event, drivers_replace, **common
        ),
        Reflector(
            kube,
            "copies",
            "/api/v1/configmaps",
            f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY},{contract.LABEL_APP_ID}",
            lambda k, o: cache.config_map_event(k, o, source=False),
            lambda items: cache.config_maps_replace(items, source=False),
            **common,
        ),
        Reflector(
            kube,
            "sources",
            f"/api/v1/namespaces/{ns}/configmaps",
            f"!{HISTORY_LABEL}",
            lambda k, o: cache.config_map_event(k, o, source=True),
            lambda items: cache.config_maps_replace(items, source=True),
            **common,
        ),
        # The nodes' zones and names, for the scheduler extender.
        Reflector(kube, "nodes", "/api/v1/nodes", None, placement.node_event, placement.nodes_replace, **common),
    ]  # fmt: skip
    for reflector in reflectors:
        metrics.reflector_crashes.labels(reflector.name)
    if options.provisioning_served:
        # sparkgate's ProvisioningRequests and PodTemplates, labelled as the copies are (allocator/provisioning.py).
        cache.provisioning()
        owned = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY},{contract.LABEL_APP_ID}"
        reflectors += [
            Reflector(
                kube, "requests", "/apis/autoscaling.x-k8s.io/v1/provisioningrequests", owned,
                cache.request_event, cache.requests_replace, **common,
            ),
            Reflector(
                kube, "templates", "/api/v1/podtemplates", owned, cache.template_event, cache.templates_replace,
                **common,
            ),
        ]  # fmt: skip
    controller = parts["controller"] = Controller(
        cache=cache,
        reflectors=reflectors,
        queue=queue,
        expectations=expectations,
        bind_times=bind_times,
        histories=histories,
        actor=actor,
        elector=elector,
        policy=policy,
        metrics=metrics,
        health=health,
        options=options,
        stop=stop,
    )
    # Leader-elected periodic tasks: each under its own Lease, or under the allocator's (own_lease=False).
    tasks: list[LeaderTask] = []
    on_run = lambda task, result: metrics.task_runs.labels(task, result).inc()  # noqa: E731
    if certs is not None:
        from certs.sync import CertsMetrics, certs_task

        tasks.append(
            certs_task(
                kube,
                certs,
                identity=options.identity,
                interval=certs_interval,
                stop=stop,
                clock=lambda: dt.datetime.now(dt.UTC),
                metrics=CertsMetrics(metrics.registry),
                lease_duration=options.lease_duration,
                renew_deadline=options.renew_deadline,
                retry_period=options.retry_period,
                on_run=on_run,
            )
        )
    probe = None
    if probe_interval > 0:
        from .probe import PolicyProbe

        probe = PolicyProbe(
            leader_writes,
            policy,
            metrics,
            options.install_namespace,
            options.identity,
            interval=probe_interval,
            max_dry_runs=probe_max_dry_runs,
        )
        # Polled every few seconds so that a policy change is probed at once; `due` says when to run.
        tasks.append(
            LeaderTask(
                "policy-probe",
                min(5.0, probe_interval),
                probe.run_if_due,
                elector=elector,
                own_lease=False,
                stop=stop,
                on_run=on_run,
                follow=probe.forget,
            )
        )
    if admission_policy:
        from .admission_policy import TASK, AdmissionPolicySync

        sync = AdmissionPolicySync(leader_writes, policy, options.install_namespace)
        # Polled like the probe, so that a policy change reaches the API server within seconds.
        tasks.append(
            LeaderTask(TASK, 2.0, sync.run_if_due, elector=elector, own_lease=False, stop=stop, on_run=on_run)
        )
    for task in tasks:
        for result in ("ok", "error"):
            metrics.task_runs.labels(task.name, result)
    placement_watches = [r for r in reflectors if r.name in ("executors", "drivers", "nodes")]
    extender = Extender(
        placement, policy, metrics, synced=lambda: all(r.resource_version for r in placement_watches)
    )
    return Allocator(controller, extender, tasks, stop, probe)


def run_allocator(args: argparse.Namespace) -> int:
    from certs.commands import target_from
    from sparkgate.kube import Kube
    from sparkgate.policy_file import PolicySource
    from sparkgate.ratelimit import TokenBucket

    from .actor import PARALLEL_APPS, WRITERS
    from .http import StatusServer
    from .loop import Options
    from .metrics import AllocatorMetrics

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        budget = TokenBucket(args.kube_api_qps, args.kube_api_burst)
    except ValueError as e:
        print(f"sparkgate allocator: --kube-api-qps, --kube-api-burst: {e}", file=sys.stderr)
        return 2
    metrics = AllocatorMetrics()
    # One connection for each thread that may send at once: the actor's apps and writers, the 5 watches,
    # the Lease, the histories, the policy probe and certificate rotation, and a spare.
    kube = Kube.from_kubeconfig(
        args.kubeconfig,
        on_request=lambda verb, resource, code: metrics.api_requests.labels(verb, resource, str(code)).inc(),
        pool_size=PARALLEL_APPS + WRITERS + 10,
    )
    policy = PolicySource(args.policy, args.namespace, on_reload=metrics.on_reload)
    served = provisioning_served(kube)
    options = Options(
        provisioning_served=served,
        install_namespace=args.namespace,
        identity=args.identity,
        lease_name=args.lease_name,
        tick=args.tick,
        batch_period=args.batch_period,
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        stall_after=args.stall_after,
        backoff_base=args.backoff_base,
        backoff_cap=args.backoff_cap,
        client_grace=args.client_app_grace,
        history_retention=args.history_retention,
        history_executor_ids=args.history_executor_ids,
    )
    try:
        allocator = assemble(
            kube,
            policy,
            options,
            metrics,
            certs=target_from(args, args.namespace) if args.certs else None,
            certs_interval=args.certs_interval,
            probe_interval=args.probe_interval,
            probe_max_dry_runs=args.probe_max_dry_runs,
            write_budget=budget,
            admission_policy=args.admission == "policy",
        )
    except ValueError as e:  # durations the elector refuses (sparkgate/leader.py)
        print(f"sparkgate allocator: {e}", file=sys.stderr)
        return 2
    controller = allocator.controller
    # What exists now (the modules, the client's classes, the assembled parts) lives as long as the process:
    # the cyclic GC's full collections need not walk it again. With the records untracked too
    # (model.py `PodRecord`, gc=False), a full collection of an allocator holding 100,000 pods took 8 ms, against
    # 54 ms without this and 100 ms with neither; it stops every thread (bench/scale.py, docs/performance.md).
    gc.freeze()
    host, _, port = args.http.rpartition(":")
    server = StatusServer(controller, allocator.extender, host or "0.0.0.0", int(port), probe=allocator.probe)
    signal.signal(signal.SIGTERM, lambda *_: allocator.stop.set())
    server.start()
    allocator.start()
    try:
        controller.run()
    except KeyboardInterrupt:
        pass
    finally:
        lost = controller.lost_lease.is_set()
        allocator.shutdown()
        server.stop()
    if lost:
        logging.getLogger("sparkgate.allocator").error(
            "lost the lease: exiting so that no write happens without it"
        )
        return 1
    return 0
