"""Where an admission's CPU goes, in-process: the production functions of each stage, timed one by one.

bench/admission.py runs this in a process of its own (prometheus-client's multiprocess mode must be chosen
before its import, as gunicorn's workers have it) and prints the figures beside the throughput. Each stage
is the code the webhook runs (webhook/app.py's WSGI app, the floor's, and the functions they call), on the
captured reviews in turn, timed by the thread's CPU clock (`time.thread_time`: other processes' time slices
are not counted); each figure is the median of several passes. What these leave out and the wrk runs pay:
gunicorn's HTTP parsing, TLS, the sockets and the kernel.

    python -m bench.admission_cpu POLICY REVIEW...    (prints one JSON document)
"""

from __future__ import annotations

import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any


def per_call_us(fn: Callable[[int], object], calls: int = 300, passes: int = 7) -> float:
    times = []
    for _ in range(passes):
        started = time.thread_time_ns()
        for i in range(calls):
            fn(i)
        times.append((time.thread_time_ns() - started) / calls / 1000)
    return round(statistics.median(times), 1)


def stages(policy_path: str, bodies: list[bytes]) -> dict[str, Callable[[int], object]]:
    """Each stage's production code as a function of the call's number (which picks the review, in turn);
    bench/admission_instructions.py counts the same stages' instructions."""
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="sparkgate-bench-cpu-"))
    from bench.floor import create_floor_app
    from sparkgate.mutation import desired_pod
    from sparkgate.mutation.patch import diff
    from sparkgate.policy_file import PolicySource
    from webhook import app as webhook_app
    from webhook import metrics
    from webhook.review import parse_review

    source = PolicySource(policy_path, "sparkgate-system")
    policy = source.current()
    assert policy is not None, source.last_error
    apps = {"floor": create_floor_app(), "webhook": webhook_app.create_app(source)}
    n = len(bodies)
    requests = [parse_review(b) for b in bodies]
    pods = [r["object"] for r in requests]
    profiles = [
        policy.profile_for(r["namespace"], p["metadata"]["labels"], p["metadata"].get("annotations") or {})
        for r, p in zip(requests, pods, strict=True)
    ]
    wanted = [desired_pod(p, profile) for p, profile in zip(pods, profiles, strict=True)]
    ops = [diff(p, w) for p, w in zip(pods, wanted, strict=True)]

    def call(app: Any, body: bytes) -> bytes:
        environ = {
            "REQUEST_METHOD": "POST", "PATH_INFO": "/mutate", "SCRIPT_NAME": "", "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "443", "SERVER_PROTOCOL": "HTTP/1.1",
            "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)), "HTTP_HOST": "127.0.0.1",
            "wsgi.input": io.BytesIO(body), "wsgi.url_scheme": "https", "wsgi.errors": sys.stderr,
            "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False, "wsgi.version": (1, 0),
        }  # fmt: skip
        return b"".join(app(environ, lambda status, headers, exc_info=None: None))

    def encode(i: int) -> None:
        webhook_app._answer(requests[i]["uid"], webhook_app._patched(ops[i]))

    def count(i: int) -> None:
        metrics.requests("mutate", "mutated").inc()
        metrics.latency("mutate").observe(0.0004)

    return {
        "floor_app": lambda i: call(apps["floor"], bodies[i % n]),
        "webhook_app": lambda i: call(apps["webhook"], bodies[i % n]),
        "parse_review": lambda i: parse_review(bodies[i % n]),
        "policy_match": lambda i: policy.profile_for(
            requests[i % n]["namespace"],
            pods[i % n]["metadata"]["labels"],
            pods[i % n]["metadata"].get("annotations") or {},
        ),
        "desired_pod": lambda i: desired_pod(pods[i % n], profiles[i % n]),
        "patch_diff": lambda i: diff(pods[i % n], wanted[i % n]),
        "encode_patch_and_response": lambda i: encode(i % n),
        "metrics": count,
    }


def measure(policy_path: str, bodies: list[bytes]) -> dict[str, float]:
    figures = {name: per_call_us(fn) for name, fn in stages(policy_path, bodies).items()}
    figures["webhook_beyond_floor"] = round(figures["webhook_app"] - figures["floor_app"], 1)
    return figures


def main(argv: list[str]) -> int:
    policy, *reviews = argv
    bodies = []
    for path in reviews:
        with open(path, "rb") as f:
            bodies.append(f.read())
    print(json.dumps(measure(policy, bodies)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
