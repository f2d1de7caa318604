"""Refill latency, ramp-up and API requests per released executor, on kubesim with the real processes.

Everything is the production path, installed by `sandbox.localsystem.LocalSystem`: simulated Spark drivers
create executor pods over HTTP, the real webhook (gunicorn, TLS) gates them at CREATE and checks every gate
removal at UPDATE, and `sparkgate allocator` runs as its own process with its own service account. The
measurement itself is in-process and exact: kubesim's store calls `subscribe` listeners after every committed
change, in order, so each creation, bind, start and gate removal gets a timestamp from one clock with no watch
latency of our own in between.

Two runs:
- refill: apps of 200 executors with batchSize 10, maxPendingPerApp 20 and batchDelaySeconds 0, so what is
  measured is the allocator's reaction, not a configured pace. Refill latency, per app, runs from the last
  event that could have unblocked the app (a bind, which completes the previous batch, or a start, which frees
  an in-flight slot) to the first gate removal after it; a release that follows the creation of a gated pod
  (room was already there) is reported apart. The refills are also split by whether the allocator was busy
  sending another app's PATCHes meanwhile (it sends a step's PATCHes one after the other). Requests are
  counted per verb for the allocator's user.
- ramp-up: one app of N = 200 executors, batchSize 20, batchDelaySeconds 1 (maxPendingPerApp does not bind).
  The policy's own minimum from the first release to the last is (N / batch - 1) x batchDelaySeconds; the
  measured time is compared with it, with the allocator's production tick (1 s) and with a fast one.

Targets (issue 7): refill p99 <= 50 ms; ramp-up <= 1.1 x the minimum; one write per released executor and no
periodic LIST in steady state.

    python -m bench.refill [--apps 3] [--executors 200] [--smoke]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubesim.apiserver
from allocator.deletions import HISTORY_LABEL
from sandbox.localsystem import LocalSystem
from sparkgate import contract

from . import common
from .common import Row

NAME = "refill"
NAMESPACE = "spark-bench"
REFILL_P99_TARGET_MS = 50.0
RAMP_RATIO_TARGET = 1.1
PRODUCTION_TICK = 1.0  # sparkgate allocator --tick's default

POLICY = """\
apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation:
  batchSize: {batch}
  batchDelaySeconds: {delay}
  maxPendingPerApp: {pending}
  maxPendingPerNamespace: {cluster_pending}
  maxPendingCluster: {cluster_pending}
caps:
  batchSize: {batch}
  maxPendingPerApp: {pending}
profiles:
  - name: default
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--apps", type=int, default=3, help="refill run: applications")
    parser.add_argument("--executors", type=int, default=200, help="refill run: executors per app")
    parser.add_argument("--batch-size", type=int, default=10, help="refill run: batchSize")
    parser.add_argument("--max-pending", type=int, default=20, help="refill run: maxPendingPerApp")
    parser.add_argument("--spark-batch", type=int, default=10, help="refill run: the drivers' batch size")
    parser.add_argument("--ramp-executors", type=int, default=200, help="ramp-up run: N")
    parser.add_argument("--ramp-batch", type=int, default=20, help="ramp-up run: batchSize")
    parser.add_argument("--ramp-delay", type=float, default=1.0, help="ramp-up run: batchDelaySeconds")
    parser.add_argument(
        "--ramp-ticks",
        type=float,
        nargs="+",
        default=[PRODUCTION_TICK, 0.1],
        help="ramp-up run: the allocator's --tick, one run each",
    )
    parser.add_argument("--start-delay", type=float, default=0.2, help="kubelet: bind to Running, seconds")
    parser.add_argument("--keep-nagle", action="store_true", help="leave kubesim's ~40 ms Nagle stall in")
    parser.add_argument("--timeout", type=float, default=600.0)


class Timeline:
    """Per-app creation/bind/start/release times, recorded by a store listener."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.state: dict[tuple[str, str], tuple[bool, bool, bool]] = {}  # (gated, bound, running)
        # app -> (kind, time) of the app's last bind or start: what frees room
        self.trigger: dict[str, tuple[str, float]] = {}
        self.consumed: set[str] = set()  # apps whose last bind or start already counted a release
        self.created_at: dict[tuple[str, str], float] = {}  # (namespace, pod) -> creation time
        self.latencies: dict[str, list[float]] = collections.defaultdict(list)  # trigger kind -> seconds
        self.refills: list[tuple[str, float, float, str]] = []  # (trigger kind, trigger at, released at, app)
        self.app_of: dict[tuple[str, str], str] = {}  # (namespace, pod) -> app
        self.releases: dict[str, list[float]] = collections.defaultdict(list)  # app -> times of removals
        self.created: dict[str, list[float]] = collections.defaultdict(list)
        self.running: dict[str, list[float]] = collections.defaultdict(list)

    def on_change(self, kind: str, resource: str, obj: dict[str, Any]) -> None:
        if resource != "pods" or kind == "DELETED":
            return
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(contract.LABEL_ROLE) != contract.ROLE_EXECUTOR:
            return
        now = self.clock()
        app = labels.get(contract.LABEL_APP_ID, "")
        spec = obj.get("spec") or {}
        gated = any(g.get("name") == contract.GATE for g in spec.get("schedulingGates") or ())
        bound = bool(spec.get("nodeName"))
        running = (obj.get("status") or {}).get("phase") == "Running"
        key = (meta.get("namespace", ""), meta.get("name", ""))
        with self.lock:
            self.app_of[key] = app
            if key not in self.state:
                self.created[app].append(now)
                self.created_at[key] = now
            was_gated, was_bound, was_running = self.state.get(key, (gated, False, False))
            self.state[key] = (gated, bound, running)
            if bound and not was_bound:
                self.trigger[app] = ("bind", now)
                self.consumed.discard(app)
            if running and not was_running:
                self.trigger[app] = ("start", now)
                self.consumed.discard(app)
                self.running[app].append(now)
            if was_gated and not gated:
                self.releases[app].append(now)
                # What unblocked this pod: the app's last bind or start, if the pod was already waiting
                # then (only the first removal after it counts: the rest of a batch follow as consecutive
                # PATCHes); else its own creation (room was already there). Another pod's creation
                # unblocks nothing.
                created = self.created_at.get(key, now)
                trigger = self.trigger.get(app)
                if trigger is None or created > trigger[1]:
                    trigger = ("create", created)
                elif app in self.consumed:
                    return
                else:
                    self.consumed.add(app)
                self.latencies[trigger[0]].append(now - trigger[1])
                self.refills.append((trigger[0], trigger[1], now, app))

    def released(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.releases.values())


def _policy(workdir: Path, *, batch: int, delay: float, pending: int, cluster_pending: int) -> Path:
    path = workdir / "policy.yaml"
    path.write_text(POLICY.format(batch=batch, delay=delay, pending=pending, cluster_pending=cluster_pending))
    return path


def _ms(values: list[float]) -> dict[str, float | None]:
    """count, median, p99 and max in milliseconds (None when there are no values)."""
    ms = [v * 1000 for v in values]
    if not ms:
        return {"count": 0, "median": None, "p99": None, "max": None}
    return {
        "count": len(ms),
        "median": round(statistics.median(ms), 2),
        "p99": round(common.percentile(ms, 0.99), 2),
        "max": round(max(ms), 2),
    }


def _median_p99(figures: dict[str, Any]) -> str:
    if not figures["count"]:
        return "none"
    return f"{figures['median']:.1f} / {figures['p99']:.1f} ms (n={figures['count']})"


def measure(
    *,
    apps: int,
    executors: int,
    batch: int,
    delay: float,
    pending: int,
    spark_batch: int,
    spark_delay: float,
    tick: float,
    start_delay: float,
    timeout: float,
) -> tuple[Timeline, list[Any], float]:
    """Run `apps` drivers of `executors` each to all Running; the timeline, the allocator's requests during
    the run, and the seconds it took."""
    executors_per_node = 40
    nodes = max(1, -(-apps * (executors + 1) // executors_per_node))  # + the driver pods
    with tempfile.TemporaryDirectory(prefix="sparkgate-bench-refill-") as tmp:
        workdir = Path(tmp)
        policy = _policy(workdir, batch=batch, delay=delay, pending=pending, cluster_pending=1000)
        system = LocalSystem(
            policy,
            workdir,
            namespaces=(NAMESPACE,),
            allocator_tick=tick,
            allocator_log_level="warning",
            nodes=nodes,
            node_cpu="64",
            node_memory="256Gi",
            node_pods=executors_per_node,
            start_delay=start_delay,
        )
        with system:
            cluster, allocator = system.cluster, system.allocator
            assert allocator is not None
            cluster.wait_for(
                lambda: allocator.get("/readyz")[0] == 200, timeout=60, what="the allocator's cache to sync"
            )
            # The steady state starts once the allocator leads and has made a leader's start reads: its
            # predecessor's deletion histories and the policy probe's namespaces (a list each), before which
            # the probe has no document (/apps "policyProbe").
            cluster.wait_for(
                lambda: "policy" in json.loads(allocator.get("/apps")[1]).get("policyProbe", {}),
                timeout=60,
                what="the allocator to lead and probe its policy",
            )
            timeline = Timeline()
            unsubscribe = cluster.store.subscribe(timeline.on_change)
            try:
                cluster.requests.clear()
                started = time.monotonic()
                drivers = [
                    cluster.spark_driver(
                        NAMESPACE,
                        f"bench-{i}",
                        executors=executors,
                        batch_size=spark_batch,
                        batch_delay=spark_delay,
                        cpu="100m",
                        memory="256Mi",
                    )
                    for i in range(apps)
                ]
                total = apps * executors
                try:
                    cluster.wait_for(
                        lambda: sum(d.running() for d in drivers) == total,
                        timeout=timeout,
                        what=f"{total} executors running",
                    )
                except TimeoutError:
                    print(allocator.log.read_text()[-4000:], file=sys.stderr)
                    raise
                elapsed = time.monotonic() - started
                requests = [e for e in cluster.requests.entries() if e.user == contract.ALLOCATOR_USER]
                for driver in drivers:
                    driver.stop()
            finally:
                unsubscribe()
    return timeline, requests, elapsed


def refill_run(args: argparse.Namespace) -> dict[str, Any]:
    timeline, requests, elapsed = measure(
        apps=args.apps,
        executors=args.executors,
        batch=args.batch_size,
        delay=0.0,
        pending=args.max_pending,
        spark_batch=args.spark_batch,
        spark_delay=0.2,
        tick=PRODUCTION_TICK,
        start_delay=args.start_delay,
        timeout=args.timeout,
    )
    released = timeline.released()
    # The policy probe's creations with dryRun=All (allocator/probe.py, when the policy comes into force
    # and every --probe-interval) persist nothing: counted apart, not as pod writes.
    dry_runs = [e for e in requests if "dryRun=All" in e.query]
    by_verb = collections.Counter(f"{e.verb} {e.resource}" for e in requests if e not in dry_runs)
    writes = {k: n for k, n in by_verb.items() if k.split()[0] in ("create", "update", "patch", "delete")}
    pod_writes = sum(n for k, n in writes.items() if k.endswith(" pods"))
    lease = sum(n for k, n in by_verb.items() if k.endswith(" leases"))
    # A new leader reads its predecessor's deletion histories once, at its first decision (allocator/loop.py
    # `_read_histories`, here when the first executors come): a start read, not the steady state's.
    listed = [e for e in requests if e.verb == "list"]
    start_reads = [e for e in listed if urllib.parse.quote(HISTORY_LABEL, safe="") in e.query][:1]
    lists = len(listed) - len(start_reads)
    result: dict[str, Any] = {
        "apps": args.apps,
        "executors": args.apps * args.executors,
        "policy": {
            "batchSize": args.batch_size,
            "batchDelaySeconds": 0,
            "maxPendingPerApp": args.max_pending,
        },
        "allocator_tick_s": PRODUCTION_TICK,
        "released": released,
        "seconds_to_all_running": round(elapsed, 2),
        "api_requests": len(requests),
        "api_requests_per_released_executor": round(len(requests) / max(1, released), 3),
        "api_requests_per_released_executor_without_lease": round(
            (len(requests) - lease) / max(1, released), 3
        ),
        "pod_writes_per_released_executor": round(pod_writes / max(1, released), 3),
        "lease_requests_per_second": round(lease / max(elapsed, 1e-9), 2),
        "lists_during_run": lists,
        "lists": [f"{e.path}?{e.query}" for e in listed],
        "leader_start_reads": len(start_reads),
        "probe_dry_runs": len(dry_runs),
        "requests_by_verb": dict(by_verb.most_common()),
        # Gate removals applied: a PATCH whose answer came late on a busy machine is sent again (kube.py
        # `repeat_is_safe`) and that repeat fails its test (422), so the PATCHes may outnumber the releases.
        "pod_patches_applied": sum(
            1 for e in requests if (e.verb, e.resource) == ("patch", "pods") and 200 <= e.code < 300
        ),
    }
    for kind, values in sorted(timeline.latencies.items()):
        result[f"refill_after_{kind}_ms"] = _ms(values)
    unblocked = timeline.latencies.get("bind", []) + timeline.latencies.get("start", [])
    result["refill_ms"] = _ms(unblocked)
    # The allocator sends a step's PATCHes one after the other: a slot freed in one app while it releases
    # another app's batch waits for that batch. Split the refills by whether that happened.
    patches = sorted(
        (e.time, timeline.app_of.get((e.namespace or "", e.name or ""), ""))
        for e in requests
        if e.verb == "patch" and e.resource == "pods"
    )
    behind: list[float] = []
    alone: list[float] = []
    for kind, triggered, released_at, app in timeline.refills:
        if kind == "create":
            continue
        waited = any(triggered < t < released_at and other != app for t, other in patches)
        (behind if waited else alone).append(released_at - triggered)
    result["refill_ms_actor_idle"] = _ms(alone)
    result["refill_ms_behind_other_apps_patches"] = _ms(behind)
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(patches) if b[0] - a[0] < 0.1]
    result["allocator_patch_interval_ms"] = _ms(gaps)
    return result


def ramp_run(args: argparse.Namespace, tick: float) -> dict[str, Any]:
    n, batch, delay = args.ramp_executors, args.ramp_batch, args.ramp_delay
    timeline, requests, elapsed = measure(
        apps=1,
        executors=n,
        batch=batch,
        delay=delay,
        pending=min(100, max(batch, n)),
        spark_batch=50,
        spark_delay=0.1,
        tick=tick,
        start_delay=args.start_delay,
        timeout=args.timeout,
    )
    (app,) = timeline.releases
    releases = timeline.releases[app]
    # A batch's gate removals are consecutive PATCHes, milliseconds apart; batches are a delay apart.
    batches: list[list[float]] = []
    for at in releases:
        if batches and at - batches[-1][-1] < delay / 2:
            batches[-1].append(at)
        else:
            batches.append([at])
    starts = [batch[0] for batch in batches]
    minimum = (-(-n // batch) - 1) * delay
    ramp = releases[-1] - releases[0]
    return {
        "executors": n,
        "batch": batch,
        "batch_delay_s": delay,
        "allocator_tick_s": tick,
        "policy_minimum_s": round(minimum, 3),
        "first_to_last_release_s": round(ramp, 3),
        "ratio_to_minimum": round(ramp / minimum, 3) if minimum else None,
        "batches": len(batches),
        "batch_sizes": [len(b) for b in batches],
        "batch_intervals_s": [round(b - a, 3) for a, b in itertools.pairwise(starts)],
        "first_creation_to_all_running_s": round(max(timeline.running[app]) - min(timeline.created[app]), 3),
        "seconds_to_all_running": round(elapsed, 2),
        "api_requests": len(requests),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.smoke:
        args.apps, args.executors, args.ramp_executors, args.ramp_batch = 1, 20, 20, 10
        # Half the executors must wait for room (maxPendingPerApp 10 of 20, all requested at once, 2 s from
        # bind to Running), so that a refill after a start is measured however slow the machine is.
        args.max_pending, args.spark_batch, args.start_delay = 10, 20, 2.0
        args.ramp_delay, args.ramp_ticks = 0.3, [PRODUCTION_TICK]
    # kubesim's handler writes the headers and the body of an answer in two send()s without TCP_NODELAY:
    # Nagle holds the body until the client's delayed ACK (~40 ms), so every request costs ~44 ms instead
    # of ~1 ms. That measures the simulator, not the allocator: switch Nagle off unless asked to keep it.
    kubesim.apiserver._Handler.disable_nagle_algorithm = not args.keep_nagle
    refill = refill_run(args)
    ramps = [ramp_run(args, tick) for tick in args.ramp_ticks]
    return {
        "refill": refill,
        "ramp_up": ramps,
        "targets": {
            "refill_p99_ms_max": REFILL_P99_TARGET_MS,
            "ramp_up_ratio_max": RAMP_RATIO_TARGET,
            "pod_writes_per_released_executor": 1,
            "lists_in_steady_state": 0,
        },
    }


def rows(result: dict[str, Any]) -> list[Row]:
    r = result["refill"]
    p99 = r["refill_ms"]["p99"]
    out = [
        Row(
            "refill after bind/start median / p99",
            _median_p99(r["refill_ms"]),
            f"p99 <= {REFILL_P99_TARGET_MS:g} ms",
            p99 is not None and p99 <= REFILL_P99_TARGET_MS,
        ),
        Row("  with the allocator's actor idle", _median_p99(r["refill_ms_actor_idle"])),
        Row("  behind another app's PATCHes", _median_p99(r["refill_ms_behind_other_apps_patches"])),
        Row("allocator PATCH interval median", f"{r['allocator_patch_interval_ms']['median'] or 0:.1f} ms"),
        Row(
            "pod writes per released executor",
            f"{r['pod_writes_per_released_executor']:.3f}",
            "1",
            r["pod_writes_per_released_executor"] <= 1.0,
        ),
        Row(
            "API requests per released executor (without lease)",
            f"{r['api_requests_per_released_executor']:.3f} ({r['api_requests_per_released_executor_without_lease']:.3f})",
        ),
        Row(
            "LISTs during the run (the new leader's one read of the histories apart)",
            str(r["lists_during_run"]),
            "0",
            r["lists_during_run"] == 0,
        ),
    ]
    for ramp in result["ramp_up"]:
        out.append(
            Row(
                f"ramp-up {ramp['executors']} by {ramp['batch']}, tick {ramp['allocator_tick_s']:g}s",
                f"{ramp['first_to_last_release_s']:.2f} s vs minimum {ramp['policy_minimum_s']:.2f} s"
                f" (x{ramp['ratio_to_minimum']:.3f}; {ramp['batches']} batches, the first of"
                f" {ramp['batch_sizes'][0]})",
                f"<= x{RAMP_RATIO_TARGET}",
                ramp["ratio_to_minimum"] is not None and ramp["ratio_to_minimum"] <= RAMP_RATIO_TARGET,
            )
        )
    return out


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
