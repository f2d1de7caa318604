"""The webhook's Prometheus metrics, shared by gunicorn's worker processes.

gunicorn forks workers, so the metrics live in prometheus-client's multiprocess mode: the directory named
by PROMETHEUS_MULTIPROC_DIR is wiped by the master before the first fork (webhook/server.py, its `on_starting` hook), each
worker writes its own files, and `/metrics` aggregates them with a fresh registry per scrape. Without that
directory (tests calling the Flask app in-process) the default registry is used.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

# 0.25 ms .. 1 s: an admission takes well under a millisecond of handler time; the API server gives up at
# the webhook's timeoutSeconds.
LATENCY_BUCKETS = (
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)

REQUESTS = Counter(
    "sparkgate_webhook_requests",
    "Admission requests by endpoint and outcome (mutated, unchanged, skipped, allowed, denied, error, bad_request).",
    ["endpoint", "outcome"],
)
LATENCY = Histogram(
    "sparkgate_webhook_request_duration_seconds",
    "Time spent handling one admission request, from body read to response.",
    ["endpoint"],
    buckets=LATENCY_BUCKETS,
)
POLICY_RELOADS = Counter(
    "sparkgate_webhook_policy_reloads",
    "Policy file loads by result (success, failure); a failure keeps the last good policy in force.",
    ["result"],
)
# Set by each worker as its policy source loads a file (on_reload), never at a scrape: the worker answering
# a scrape is one of several, and every worker's own value counts.
POLICY_GENERATION = Gauge(
    "sparkgate_webhook_policy_generation",
    "How many times the policy in force has been (re)loaded successfully by a worker.",
    multiprocess_mode="max",
)
POLICY_LOADED = Gauge(
    "sparkgate_webhook_policy_loaded",
    "1 when a worker has a valid policy in force, else 0.",
    multiprocess_mode="livemin",
)
CERT_EXPIRY = Gauge(
    "sparkgate_webhook_certificate_expiry_timestamp_seconds",
    "notAfter of the serving certificate the webhook presents, as a Unix timestamp.",
    multiprocess_mode="mostrecent",
)


# The labelled children of the two metrics written at every admission, by their label values: `labels()`
# takes the metric's lock and builds a key at each call. Written by the request threads of a worker (a race
# stores the same child twice: prometheus-client hands out one child per label values).
_REQUESTS: dict[tuple[str, str], Counter] = {}
_LATENCY: dict[str, Histogram] = {}


def requests(endpoint: str, outcome: str) -> Counter:
    """REQUESTS' child for (endpoint, outcome)."""
    child = _REQUESTS.get((endpoint, outcome))
    if child is None:
        child = _REQUESTS[endpoint, outcome] = REQUESTS.labels(endpoint, outcome)
    return child


def latency(endpoint: str) -> Histogram:
    """LATENCY's child for the endpoint."""
    child = _LATENCY.get(endpoint)
    if child is None:
        child = _LATENCY[endpoint] = LATENCY.labels(endpoint)
    return child


def on_reload(result: str, error: str | None) -> None:
    """PolicySource's hook, in the worker whose source loaded the file. A refused file leaves the policy in
    force (if any) as it was; a success puts a new one in force (the gauges are set before the count, so a
    scrape that counts a worker's load also sees its gauges)."""
    if result == "success":
        POLICY_LOADED.set(1)
        POLICY_GENERATION.inc()
    POLICY_RELOADS.labels(result).inc()


def exposition() -> tuple[bytes, str]:
    """The metrics document and its content type, aggregated over all workers when multiprocess."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry(support_collectors_without_names=True)
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
