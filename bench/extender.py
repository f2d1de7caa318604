"""Scheduler extender latency: how long the allocator takes to answer kube-scheduler's filter and prioritize.

The allocator's placement index (allocator/placement.py) holds 10,000 executor pods of 500 applications on
1,000 nodes in 4 zones, each app's driver placed, and 300 recent executor failures (OOMKilled, exit codes)
on 100 nodes, enough for some nodes to be refused to some apps and a few to be suspect. The request is what
kube-scheduler sends with `nodeCacheCapable: true`: the captured Spark 4.3 executor pod admitted by the real
webhook (gate removed, profile `spark` with `packing: app` and `driverZone: prefer`, so prioritize does all
its work) and the names of all 1,000 nodes.

- in-process: `allocator.extender.Extender.handle(verb, body)`, parsing of the body and building of the
  answer document included;
  the thread's CPU time is reported beside the wall-clock time (on a shared 2-core machine the p99 of the
  latter is mostly other processes' time slices);
- over HTTP: the allocator's own HTTP listener (allocator/http.py, its StatusServer and handler) in a
  separate process, called by one keep-alive client, as kube-scheduler's HTTPExtender does (one request at a
  time per scheduling cycle); the client's time to send and read is in the figure.

Each round times 2,000 requests of each verb in-process, then over HTTP; the figures are the medians of the
rounds' percentiles (the range of the p99 beside them).

Targets (issue 15): p99 <= 2 ms in-process, <= 5 ms over HTTP, for each verb.

    python -m bench.extender [--nodes 1000] [--pods 10000] [--requests 2000] [--rounds 5] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

from allocator.extender import VERBS, Extender
from allocator.http import StatusServer
from allocator.loop import Controller
from allocator.metrics import AllocatorMetrics
from allocator.model import PodRecord
from allocator.placement import Placement
from sandbox.local_webhook import free_port
from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.json_patch import apply_patch
from sparkgate.mutation import mutate
from sparkgate.policy import Policy, load_policy

from . import common
from .common import Row, fmt

NAME = "extender"
IN_PROCESS_P99_MS = 2.0
HTTP_P99_MS = 5.0
FIXTURE = "etl-nightly-exec-1.admissionreview.json"
ZONES = ("zone-a", "zone-b", "zone-c", "zone-d")
POLICY = """\
apiVersion: sparkgate.io/v1alpha1
kind: Policy
scheduling: {failuresPerApp: 2, suspectNodeApps: 3, failureWindowSeconds: 600}
profiles:
  - name: spark
    scheduling: {schedulerName: sparkgate, packing: app, driverZone: prefer}
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10_000, help="executor pods, 20 per application")
    parser.add_argument("--failures", type=int, default=300, help="recent executor failures")
    parser.add_argument("--requests", type=int, default=2000, help="timed requests per verb, path and round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the figures are their medians")


class Source:
    """What PolicySource offers the extender: the policy in force."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def current(self) -> Policy:
        return self.policy


@dataclass
class World:
    placement: Placement
    policy: Policy
    apps: list[AppKey]
    nodes: list[str]


def build(nodes: int, pods: int, failures: int, seed: int = 7) -> World:
    rng = random.Random(seed)
    placement = Placement(retention=lambda: 3600.0)
    names = [f"node-{i:04d}" for i in range(nodes)]
    placement.nodes_replace(
        [
            {"metadata": {"name": n, "labels": {"topology.kubernetes.io/zone": ZONES[i % len(ZONES)]}}}
            for i, n in enumerate(names)
        ]
    )
    apps = [AppKey(f"spark-{i % 50}", f"spark-{i:032x}") for i in range(max(1, pods // 20))]
    for app in apps:
        placement.driver_event(
            "ADDED",
            {
                "metadata": {"namespace": app.namespace, "labels": {contract.LABEL_APP_ID: app.app_id}},
                "spec": {"nodeName": rng.choice(names)},
            },
        )
    for i in range(pods):
        app = apps[i % len(apps)]
        placement.observe(None, _record(app, f"{app.app_id}-exec-{i}", rng.choice(names), "Running"))
    bad = rng.sample(names, min(len(names), max(1, failures // 3)))
    for i in range(failures):
        app, node = rng.choice(apps[: max(1, len(apps) // 5)]), rng.choice(bad)
        running = _record(app, f"failed-{i}", node, "Running")
        placement.observe(None, running)
        oom = i % 2 == 0
        placement.observe(
            running,
            _record(app, f"failed-{i}", node, "Failed", "OOMKilled" if oom else "Error", 137 if oom else 1),
        )
    return World(placement, load_policy(POLICY), apps, names)


def _record(
    app: AppKey, name: str, node: str, phase: str, reason: str | None = None, exit_code: int | None = None
) -> PodRecord:
    return PodRecord(
        app.namespace,
        name,
        f"uid-{name}",
        app.app_id,
        1,
        "0",
        False,
        "spark",
        node,
        phase,
        False,
        0.0,
        reason=reason,
        exit_code=exit_code,
    )


def request_body(world: World, app: AppKey) -> bytes:
    """ExtenderArgs for one executor of `app`: the captured pod as the webhook admitted it, released."""
    review = json.loads((common.FIXTURES / FIXTURE).read_text())
    pod = apply_patch(review["request"]["object"], mutate(review["request"], world.policy).ops)
    pod["metadata"]["namespace"] = app.namespace
    pod["metadata"]["labels"][contract.LABEL_APP_ID] = app.app_id
    pod["spec"]["schedulingGates"] = []
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": world.nodes}).encode()


def in_process(world: World, bodies: list[bytes], verb: str, n: int) -> tuple[list[float], list[float]]:
    """(wall-clock times, CPU times of the thread) of `n` requests."""
    extender = Extender(world.placement, Source(world.policy), AllocatorMetrics())  # type: ignore[arg-type]
    for body in bodies[:50]:
        extender.handle(verb, body)  # warm-up
    wall, cpu = [], []
    for i in range(n):
        body = bodies[i % len(bodies)]
        started, started_cpu = time.perf_counter(), time.thread_time()
        code, _ = extender.handle(verb, body)
        cpu.append(time.thread_time() - started_cpu)
        wall.append(time.perf_counter() - started)
        assert code == 200
    return wall, cpu


def _serve(world: World, port: int, ready: Any) -> None:
    # Only the extender routes are asked for: no controller behind them.
    extender = Extender(world.placement, Source(world.policy), AllocatorMetrics())  # type: ignore[arg-type]
    server = StatusServer(cast(Controller, None), extender, "127.0.0.1", port)
    server.start()
    ready.set()
    while True:
        time.sleep(3600)


@contextlib.contextmanager
def http_server(world: World) -> Iterator[int]:
    """The allocator's HTTP listener on `world`, in a process of its own; yields its port."""
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    port = free_port()
    process = context.Process(target=_serve, args=(world, port, ready), daemon=True)
    process.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the extender's HTTP server did not start")
        yield port
    finally:
        process.kill()
        process.join(10)


def over_http(port: int, bodies: list[bytes], n: int) -> dict[str, list[float]]:
    """Wall-clock times of `n` filter and `n` prioritize requests, alternating, on one keep-alive connection."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    times: dict[str, list[float]] = {"filter": [], "prioritize": []}
    for i in range(n + 50):
        for verb in VERBS:
            body = bodies[i % len(bodies)]
            started = time.perf_counter()
            connection.request("POST", f"/scheduler/{verb}", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            elapsed = time.perf_counter() - started
            assert response.status == 200
            if i >= 50:  # warm-up
                times[verb].append(elapsed)
    connection.close()
    return times


def summary(times: list[float]) -> dict[str, float]:
    ms = [t * 1000 for t in times]
    return {
        "count": len(ms),
        "p50": round(common.percentile(ms, 0.5), 3),
        "p90": round(common.percentile(ms, 0.9), 3),
        "p99": round(common.percentile(ms, 0.99), 3),
        "max": round(max(ms), 3),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.smoke:
        args.nodes, args.pods, args.failures, args.requests, args.rounds = 50, 500, 30, 100, 1
    world = build(args.nodes, args.pods, args.failures)
    rng = random.Random(11)
    bodies = [request_body(world, app) for app in rng.sample(world.apps, min(20, len(world.apps)))]
    extender = Extender(world.placement, Source(world.policy), AllocatorMetrics())  # type: ignore[arg-type]
    refused = [len(extender.excluded(app, "spark", world.policy)) for app in world.apps]
    rounds: list[dict[str, dict[str, dict[str, float]]]] = []
    with http_server(world) as port:
        for _ in range(args.rounds):
            found: dict[str, dict[str, dict[str, float]]] = {"in_process_ms": {}, "in_process_cpu_ms": {}}
            for verb in VERBS:
                wall, cpu = in_process(world, bodies, verb, args.requests)
                found["in_process_ms"][verb], found["in_process_cpu_ms"][verb] = summary(wall), summary(cpu)
            found["http_ms"] = {
                verb: summary(t) for verb, t in over_http(port, bodies, args.requests).items()
            }
            rounds.append(found)
    medians: dict[str, Any] = {}
    for key in ("in_process_ms", "in_process_cpu_ms", "http_ms"):
        medians[key] = {}
        for verb in VERBS:
            p99s = [r[key][verb]["p99"] for r in rounds]
            medians[key][verb] = {
                "count": rounds[0][key][verb]["count"],
                **{
                    f: round(common.median([r[key][verb][f] for r in rounds]), 3)
                    for f in ("p50", "p90", "p99")
                },
                "p99_range": [min(p99s), max(p99s)],
            }
    return {
        "config": {
            "nodes": args.nodes,
            "pods": args.pods,
            "apps": len(world.apps),
            "failures": args.failures,
            "requests": args.requests,
            "rounds": args.rounds,
            "body_bytes": len(bodies[0]),
            "apps_with_refused_nodes": sum(1 for n in refused if n),
            "most_refused_nodes": max(refused),
        },
        **medians,
        "rounds": rounds,
    }


def rows(result: dict[str, Any]) -> list[Row]:
    out = []
    for where, key, target in (
        ("in-process", "in_process_ms", IN_PROCESS_P99_MS),
        ("HTTP", "http_ms", HTTP_P99_MS),
    ):
        for verb in ("filter", "prioritize"):
            s = result[key][verb]
            low, high = s["p99_range"]
            cpu = (
                f", CPU p99 {fmt(result['in_process_cpu_ms'][verb]['p99'], 2)}"
                if key == "in_process_ms"
                else ""
            )
            out.append(
                Row(
                    f"{verb} {where}, p50 / p99",
                    f"{fmt(s['p50'], 2)} / {fmt(s['p99'], 2)} ms (p99 {fmt(low, 2)}-{fmt(high, 2)}{cpu})",
                    f"p99 <= {target:g} ms",
                    s["p99"] <= target,
                )
            )
    return out


if __name__ == "__main__":
    import sys

    sys.exit(common.main(sys.modules[__name__]))
