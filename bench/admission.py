"""Admission: the real webhook against its floor, over TLS, fed the captured Spark 4.3 AdmissionReviews.

Both servers are `LocalWebhook`-started processes with the same gunicorn/TLS settings (webhook/server.py):
the real one is `sparkgate webhook` with the example policy (manifests/components/example-policy/policy.yaml, every feature);
the floor (bench/floor.py) reads the review and answers "allowed" with no patch. They run pinned to one CPU
and the load generators to another (on a machine with at least two), alternately, several rounds back to
back; the summary holds the medians and the median of the per-round ratios.

- saturated throughput: `wrk` with keep-alive (bench/post.lua cycles through the nine reviews), and with
  `Connection: close` (a TLS handshake per request);
- latency at a fixed offered rate (300/s by default): bench/paced.py, open-loop, with keep-alive and without.

Then where an admission's CPU goes, stage by stage, in-process (bench/admission_cpu.py): the two WSGI apps
whole, the parse both pay, and the webhook's own stages (policy match, shaping the pod, the JSON Patch, its
encoding with the answer's, the metrics).

Targets (issues 7, 38): throughput >= 0.85 x the floor; p99 <= 10 ms at 300 admissions/s with keep-alive.

    python -m bench.admission [--rounds 7] [--duration 3] [--paced-duration 5] [--rate 300] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox.local_webhook import LocalWebhook

from . import common
from .common import Row, fmt, median
from .floor import FloorServer
from .paced import paced

NAME = "admission"
LUA = Path(__file__).with_name("post.lua")
THROUGHPUT_RATIO_TARGET = 0.85
P99_TARGET_MS = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=7, help="rounds of every measurement, back to back")
    parser.add_argument("--duration", type=int, default=3, help="seconds of each wrk run")
    parser.add_argument("--paced-duration", type=float, default=5.0, help="seconds of each fixed-rate run")
    parser.add_argument("--rate", type=float, default=300.0, help="offered rate of the latency runs, per s")
    parser.add_argument("--connections", type=int, default=8, help="wrk's connections (saturated runs)")
    parser.add_argument("--workers", type=int, default=1, help="gunicorn workers of both servers")
    parser.add_argument("--threads", type=int, default=4, help="gunicorn threads per worker")
    parser.add_argument("--policy", type=Path, default=common.EXAMPLE_POLICY)


def wrk(
    server: LocalWebhook,
    bodies: list[Path],
    *,
    keepalive: bool,
    duration: int,
    connections: int,
    cpu: int | None,
) -> dict[str, Any]:
    """One saturated wrk run: requests/s, wrk's latency percentiles (ms), and the server's CPU time per request
    (all processes of its group, from /proc: steadier than throughput on a shared machine)."""
    env = {
        **os.environ,
        "BENCH_BODIES": ":".join(str(p) for p in bodies),
        "BENCH_CLOSE": "" if keepalive else "1",
    }
    command = [
        *common.taskset(cpu), "wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--timeout", "5s",
        "-s", str(LUA), f"{server.url}/mutate",
    ]  # fmt: skip
    assert server.pid is not None
    user_before, system_before = common.group_cpu_seconds(server.pid)
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=duration + 60)
    user, system = common.group_cpu_seconds(server.pid)
    line = next((x for x in done.stdout.splitlines() if x.startswith("BENCH-JSON ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout[-2000:]} {done.stderr[-2000:]}")
    raw = json.loads(line.removeprefix("BENCH-JSON "))
    seconds = raw["duration_us"] / 1e6
    errors = sum(raw["errors"].values())
    return {
        "requests": raw["requests"],
        "rps": round(raw["requests"] / seconds, 1),
        "errors": errors,
        "latency_ms": {k: round(v / 1000, 3) for k, v in raw["latency_us"].items()},
        "server_cpu_us_per_request": {
            "user": round((user - user_before) / max(1, raw["requests"]) * 1e6, 1),
            "system": round((system - system_before) / max(1, raw["requests"]) * 1e6, 1),
            "total": round((user + system - user_before - system_before) / max(1, raw["requests"]) * 1e6, 1),
        },
    }


def at_rate(
    server: LocalWebhook,
    bodies: list[bytes],
    *,
    rate: float,
    duration: float,
    keepalive: bool,
    cpu: int | None,
) -> dict[str, Any]:
    """One paced run: latency percentiles (ms) at the offered rate."""
    with common.pinned({cpu} if cpu is not None else None):
        result = paced(
            "127.0.0.1",
            server.port,
            "/mutate",
            bodies,
            server.ssl_context(),
            rate=rate,
            duration=duration,
            keepalive=keepalive,
        )
    ms = [x * 1000 for x in result.latencies]
    return {
        "offered_rps": rate,
        "achieved_rps": round(result.achieved_rate, 1),
        "requests": len(ms),
        "errors": result.errors,
        "connections_opened": result.connections_opened,
        "latency_ms": {
            "p50": round(common.percentile(ms, 0.50), 3),
            "p90": round(common.percentile(ms, 0.90), 3),
            "p99": round(common.percentile(ms, 0.99), 3),
            "max": round(max(ms, default=float("nan")), 3),
        },
    }


def check_answers(webhook: LocalWebhook, floor: LocalWebhook, body: bytes) -> dict[str, Any]:
    """One review through each server: the webhook patches (gate included), the floor does not."""
    import http.client

    answers = {}
    for name, server in (("webhook", webhook), ("floor", floor)):
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=server.ssl_context(), timeout=10)
        conn.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        data = answer.read()
        conn.close()
        if answer.status != 200:
            raise RuntimeError(f"{name} answered {answer.status}: {data[:300]!r}")
        answers[name] = json.loads(data)["response"]
    if "patch" not in answers["webhook"] or "patch" in answers["floor"]:
        raise RuntimeError(f"unexpected answers: {answers}")
    return {"webhook_patch_base64_bytes": len(answers["webhook"]["patch"])}


def cpu_by_stage(policy: Path, paths: list[Path], cpu: set[int] | None) -> dict[str, float]:
    """bench/admission_cpu.py in a process of its own, pinned where the servers run."""
    with tempfile.TemporaryDirectory(prefix="sparkgate-bench-cpu-") as metrics_dir:
        done = subprocess.run(
            [sys.executable, "-m", "bench.admission_cpu", str(policy), *map(str, paths)],
            capture_output=True, text=True, timeout=300, cwd=common.REPO,
            env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": metrics_dir},
            preexec_fn=(lambda: os.sched_setaffinity(0, cpu)) if cpu else None,
        )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"bench.admission_cpu failed: {done.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(done.stdout)
    return figures


def run(args: argparse.Namespace) -> dict[str, Any]:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (make tools, or apt-get install wrk)")
    rounds, duration, paced_duration, rate = args.rounds, args.duration, args.paced_duration, args.rate
    if args.smoke:
        rounds, duration, paced_duration, rate = 1, 1, 1.0, 50.0
    available = common.cpus()
    server_cpus = {available[0]} if len(available) >= 2 else None
    client_cpu = available[1] if len(available) >= 2 else None
    paths = sorted(common.FIXTURES.glob("*.admissionreview.json"))
    bodies = [p.read_bytes() for p in paths]
    with tempfile.TemporaryDirectory(prefix="sparkgate-bench-admission-") as tmp:
        workdir = Path(tmp)
        servers: dict[str, LocalWebhook] = {
            "webhook": LocalWebhook(
                args.policy, workdir / "webhook", workers=args.workers, threads=args.threads
            ),
            "floor": FloorServer(args.policy, workdir / "floor", workers=args.workers, threads=args.threads),
        }
        try:
            with common.pinned(server_cpus):
                for server in servers.values():
                    server.start()
            checks = check_answers(servers["webhook"], servers["floor"], bodies[0])
            for server in servers.values():  # warm-up, not counted
                wrk(
                    server,
                    paths,
                    keepalive=True,
                    duration=1,
                    connections=args.connections,
                    cpu=client_cpu,
                )
            measured: list[dict[str, dict[str, Any]]] = []
            for n in range(rounds):
                order = ("floor", "webhook") if n % 2 == 0 else ("webhook", "floor")
                this: dict[str, dict[str, Any]] = {name: {} for name in order}
                # The two servers of a comparison run one right after the other.
                for keepalive in (True, False):
                    for name in order:
                        key = "saturated_" + ("keepalive" if keepalive else "no_keepalive")
                        this[name][key] = wrk(
                            servers[name], paths, keepalive=keepalive, duration=duration,
                            connections=args.connections, cpu=client_cpu,
                        )  # fmt: skip
                for keepalive in (True, False):
                    for name in order:
                        key = "at_rate_" + ("keepalive" if keepalive else "no_keepalive")
                        this[name][key] = at_rate(
                            servers[name],
                            bodies,
                            rate=rate,
                            duration=paced_duration,
                            keepalive=keepalive,
                            cpu=client_cpu,
                        )
                measured.append(this)
                print(f"# admission round {n + 1}/{rounds}: {_round_line(this)}", file=sys.stderr)
        finally:
            for server in servers.values():
                server.stop()
        # gunicorn's arbiter kills a worker that has not checked in for 30 s: a stalled server, not a slow one.
        timeouts = {
            name: (server.workdir / "webhook.log").read_text(errors="replace").count("WORKER TIMEOUT")
            for name, server in servers.items()
        }
    return {
        "config": {
            "rounds": rounds,
            "seconds_per_wrk_run": duration,
            "seconds_per_paced_run": paced_duration,
            "offered_rate": rate,
            "wrk_connections": args.connections,
            "gunicorn_workers": args.workers,
            "gunicorn_threads": args.threads,
            "policy": str(Path(args.policy).resolve().relative_to(common.REPO))
            if Path(args.policy).resolve().is_relative_to(common.REPO)
            else str(args.policy),
            "reviews": [p.name for p in paths],
            "server_cpus": sorted(server_cpus) if server_cpus else None,
            "client_cpu": client_cpu,
            **checks,
        },
        "summary": summarize(measured),
        "cpu_us_by_stage": cpu_by_stage(args.policy, paths, server_cpus),
        "worker_timeouts": timeouts,
        "targets": {"throughput_ratio_min": THROUGHPUT_RATIO_TARGET, "p99_keepalive_ms_max": P99_TARGET_MS},
        "rounds": measured,
    }


def _round_line(this: dict[str, dict[str, Any]]) -> str:
    return ", ".join(
        f"{name} {r['saturated_keepalive']['rps']:.0f}/s p99@rate {r['at_rate_keepalive']['latency_ms']['p99']:.2f} ms"
        for name, r in this.items()
    )


def summarize(measured: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    def series(name: str, key: str, get: Callable[[dict[str, Any]], float]) -> list[float]:
        return [get(r[name][key]) for r in measured if r[name][key]["requests"]]

    def ratios(key: str, get: Callable[[dict[str, Any]], float]) -> list[float]:
        return [
            get(r["webhook"][key]) / get(r["floor"][key])
            for r in measured
            if get(r["floor"][key]) and get(r["webhook"][key]) and answered(r, key)
        ]

    def answered(r: dict[str, dict[str, Any]], key: str) -> bool:
        """Both servers answered in this round's run (a stalled server is reported, not averaged in)."""
        return all(r[name][key]["requests"] for name in ("webhook", "floor"))

    summary: dict[str, Any] = {
        "runs_without_answers": sum(
            1 for r in measured for runs in r.values() for x in runs.values() if not x["requests"]
        )
    }
    for key in ("saturated_keepalive", "saturated_no_keepalive"):

        def rps(x: dict[str, Any]) -> float:
            return float(x["rps"])

        def cpu(x: dict[str, Any]) -> float:
            return float(x["server_cpu_us_per_request"]["total"])

        summary[key] = {
            "webhook_rps": round(median(series("webhook", key, rps)), 1),
            "floor_rps": round(median(series("floor", key, rps)), 1),
            "ratio": round(median(ratios(key, rps)), 3),
            "ratio_per_round": [round(x, 3) for x in ratios(key, rps)],
            "webhook_server_cpu_us_per_request": round(median(series("webhook", key, cpu)), 1),
            "floor_server_cpu_us_per_request": round(median(series("floor", key, cpu)), 1),
            "cpu_ratio": round(median(ratios(key, cpu)), 3),
            "errors": sum(
                series("webhook", key, lambda x: x["errors"]) + series("floor", key, lambda x: x["errors"])
            ),
        }
    for key in ("at_rate_keepalive", "at_rate_no_keepalive"):
        entry: dict[str, Any] = {}
        for name in ("webhook", "floor"):
            entry[name] = {q: round(median(series(name, key, _latency(q))), 3) for q in ("p50", "p90", "p99")}
            entry[name]["achieved_rps"] = round(median(series(name, key, lambda x: x["achieved_rps"])), 1)
        for q in ("p50", "p99"):
            entry[f"{q}_ratio"] = round(median(ratios(key, _latency(q))), 3)
        entry["errors"] = sum(
            series("webhook", key, lambda x: x["errors"]) + series("floor", key, lambda x: x["errors"])
        )
        summary[key] = entry
    return summary


def _latency(quantile: str) -> Callable[[dict[str, Any]], float]:
    def get(run: dict[str, Any]) -> float:
        return float(run["latency_ms"][quantile])

    return get


def rows(result: dict[str, Any]) -> list[Row]:
    s = result["summary"]
    stage = result["cpu_us_by_stage"]
    stalls = [
        Row(
            "runs without a single answer / worker timeouts",
            f"{s['runs_without_answers']} / {result['worker_timeouts']}",
            "none",
            False,
        )
    ]
    if not s["runs_without_answers"] and not any(result["worker_timeouts"].values()):
        stalls = []
    rate = result["config"]["offered_rate"]
    sat, sat_close = s["saturated_keepalive"], s["saturated_no_keepalive"]
    ka, close = s["at_rate_keepalive"], s["at_rate_no_keepalive"]
    return [
        *stalls,
        Row(
            "throughput, keep-alive (webhook / floor)",
            f"{sat['webhook_rps']:,.0f} / {sat['floor_rps']:,.0f} req/s",
        ),
        Row(
            "  ratio",
            fmt(sat["ratio"], 3),
            f">= {THROUGHPUT_RATIO_TARGET}",
            sat["ratio"] >= THROUGHPUT_RATIO_TARGET,
        ),
        Row(
            "server CPU per admission (webhook / floor)",
            f"{sat['webhook_server_cpu_us_per_request']:,.0f} / {sat['floor_server_cpu_us_per_request']:,.0f} us"
            f" (x{sat['cpu_ratio']:.3f})",
        ),
        Row(
            "  in-process: the WSGI app (webhook / floor), beyond it",
            f"{stage['webhook_app']:,.0f} / {stage['floor_app']:,.0f} us, {stage['webhook_beyond_floor']:,.0f} us",
        ),
        Row(
            "  parse (both) / match / shape / diff / encode / metrics",
            " / ".join(
                f"{stage[k]:,.1f}"
                for k in (
                    "parse_review",
                    "policy_match",
                    "desired_pod",
                    "patch_diff",
                    "encode_patch_and_response",
                    "metrics",
                )
            )
            + " us",
        ),
        Row(
            "throughput, no keep-alive (webhook / floor)",
            f"{sat_close['webhook_rps']:,.0f} / {sat_close['floor_rps']:,.0f} req/s (x{sat_close['ratio']:.3f})",
        ),
        Row(
            f"p50 / p99 at {rate:g}/s, keep-alive, webhook",
            f"{ka['webhook']['p50']:.2f} / {ka['webhook']['p99']:.2f} ms",
            f"p99 <= {P99_TARGET_MS:g} ms",
            ka["webhook"]["p99"] <= P99_TARGET_MS,
        ),
        Row(
            f"p50 / p99 at {rate:g}/s, keep-alive, floor",
            f"{ka['floor']['p50']:.2f} / {ka['floor']['p99']:.2f} ms (p99 x{ka['p99_ratio']:.2f})",
        ),
        Row(
            f"p50 / p99 at {rate:g}/s, no keep-alive, webhook",
            f"{close['webhook']['p50']:.2f} / {close['webhook']['p99']:.2f} ms",
        ),
        Row(
            f"p50 / p99 at {rate:g}/s, no keep-alive, floor",
            f"{close['floor']['p50']:.2f} / {close['floor']['p99']:.2f} ms (p99 x{close['p99_ratio']:.2f})",
        ),
    ]


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
