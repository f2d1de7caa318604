"""`certs sync`: bring the cluster's certificate Secret and webhook caBundles to what the plan says.

The thin I/O around certs/plan.py. One cycle reads the Secret and the two webhook configurations, writes
the Secret if the plan has steps (create, or replace with its resourceVersion, so two replicas racing
cannot both win), then re-injects `caBundle` into every webhook whose bundle differs from the Secret's
trust bundle, by read-modify-replace with the configuration's resourceVersion: never a merge patch, which
would replace the whole `webhooks` list. Because every cycle compares, a caBundle overwritten by a re-apply
of the manifests or by GitOps is repaired at the next cycle.

`certs_task` makes the cycle a leader-elected periodic task under the `sparkgate-certs` Lease (the allocator
runs it in every replica, one replica rotates at a time); `run_loop` runs that task alone (`certs sync
--loop`). Optimistic concurrency on every write keeps even a lease overlap harmless. A caBundle found
different from the Secret's trust bundle when the Secret did not just change is drift (a re-apply, GitOps,
a hand edit): repaired in that cycle and counted.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge
from prometheus_client.core import Metric

from sparkgate import contract
from sparkgate.kube import Conflict, Kube, KubeError, NotFound
from sparkgate.leader import LeaderElector, LeaderTask

from .material import advance
from .pki import service_dns_names
from .plan import (
    CA_CRT,
    TLS_CRT,
    Lifetimes,
    Step,
    WebhookRef,
    load_certs,
    needs_injection,
    secret_steps,
    trust_bundle,
)

log = logging.getLogger(__name__)

ADMISSION_API = "/apis/admissionregistration.k8s.io/v1"
KINDS = {"mutating": "mutatingwebhookconfigurations", "validating": "validatingwebhookconfigurations"}


class ExpiryGauge(Gauge):
    """A timestamp gauge without a sample until it is first set. An unlabelled Gauge exports 0 from its
    creation, and an expiry of 0 reads as a certificate that expired in 1970: SparkgateCertificateExpiresSoon
    would fire on it and the dashboard's min() would show -56 years. An expiry not known yet (before the
    first cycle, or in a replica that could not read the Secret) is no series at all; once known, the last
    value read stays."""

    _known = False

    def set(self, value: float) -> None:
        super().set(value)
        self._known = True  # after the value: a scrape never sees the 0

    def collect(self) -> Iterable[Metric]:
        # The family without samples until then (its HELP and TYPE): the name stays registered and listed.
        return super().collect() if self._known else self.describe()


class CertsMetrics:
    """The certificate metrics, in the registry of the process that runs the sync (the allocator has its
    own; `certs sync --loop --metrics-port` uses the default one)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.ca_expiry = ExpiryGauge(
            "sparkgate_certs_ca_expiry_timestamp_seconds",
            "When the CA signing the serving certificate expires",
            registry=registry,
        )
        self.serving_expiry = ExpiryGauge(
            "sparkgate_certs_serving_expiry_timestamp_seconds",
            "When the serving certificate in the Secret expires",
            registry=registry,
        )
        self.syncs = Counter(
            "sparkgate_certs_syncs", "certs sync cycles by result", ["result"], registry=registry
        )
        self.steps = Counter(
            "sparkgate_certs_steps", "Certificate steps carried out, by step", ["step"], registry=registry
        )
        self.ca_bundle_repairs = Counter(
            "sparkgate_certs_ca_bundle_repairs",
            "Webhooks whose caBundle had drifted from the Secret (blanked or replaced) and was repaired",
            registry=registry,
        )


Obj = dict[str, Any]


@dataclass(frozen=True)
class Target:
    """Where the certificates live and which webhook configurations trust them."""

    namespace: str = contract.INSTALL_NAMESPACE
    secret: str = contract.CERT_SECRET
    service: str = contract.WEBHOOK_SERVICE
    mutating: tuple[str, ...] = (contract.WEBHOOK_CONFIGURATION,)
    validating: tuple[str, ...] = (contract.WEBHOOK_CONFIGURATION,)
    lifetimes: Lifetimes = field(default_factory=Lifetimes)

    @property
    def secret_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/secrets/{self.secret}"

    def configurations(self) -> list[tuple[str, str]]:
        return [("mutating", n) for n in self.mutating] + [("validating", n) for n in self.validating]


@dataclass(frozen=True)
class SyncResult:
    steps: tuple[Step, ...]
    injected: tuple[WebhookRef, ...]
    missing: tuple[str, ...]  # mutating webhook configurations that do not exist (yet): the install has one
    # Validating ones that do not exist: only the validating-webhook component creates one.
    optional_missing: tuple[str, ...] = ()


def _decode(data: Mapping[str, str] | None) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (data or {}).items()}


def _encode(data: Mapping[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode() for k, v in sorted(data.items())}


def _config_path(kind: str, name: str) -> str:
    return f"{ADMISSION_API}/{KINDS[kind]}/{name}"


def _read_configurations(
    kube: Kube, target: Target
) -> tuple[dict[tuple[str, str], Obj], dict[WebhookRef, bytes], list[str]]:
    configs: dict[tuple[str, str], Obj] = {}
    bundles: dict[WebhookRef, bytes] = {}
    missing: list[str] = []
    for kind, name in target.configurations():
        try:
            config = kube.get(_config_path(kind, name))
        except NotFound:
            missing.append(f"{KINDS[kind]}/{name}")
            continue
        configs[(kind, name)] = config
        for webhook in config.get("webhooks") or []:
            raw = (webhook.get("clientConfig") or {}).get("caBundle") or ""
            bundles[WebhookRef(kind, name, webhook["name"])] = base64.b64decode(raw)
    return configs, bundles, missing


def _write_secret(kube: Kube, target: Target, current: Obj | None, data: Mapping[str, bytes]) -> None:
    if current is None:
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": target.secret,
                "namespace": target.namespace,
                "labels": {"app.kubernetes.io/name": "sparkgate", "app.kubernetes.io/component": "certs"},
            },
            "type": "kubernetes.io/tls",
            "data": _encode(data),
        }
        kube.create(f"/api/v1/namespaces/{target.namespace}/secrets", body)
    else:
        kube.replace(target.secret_path, {**current, "data": _encode(data)})


def _inject(kube: Kube, kind: str, name: str, config: Obj, bundle: bytes) -> None:
    encoded = base64.b64encode(bundle).decode()
    for attempt in range(5):
        for webhook in config.get("webhooks") or []:
            webhook.setdefault("clientConfig", {})["caBundle"] = encoded
        try:
            kube.replace(_config_path(kind, name), config)
            return
        except Conflict:
            if attempt == 4:
                raise
            config = kube.get(_config_path(kind, name))


def sync_once(
    kube: Kube, target: Target, now: dt.datetime, metrics: CertsMetrics | None = None
) -> SyncResult:
    """One cycle: plan, write the Secret if needed, inject caBundles. A Conflict on the Secret means
    another replica wrote it first (two pods' init containers on a fresh install): re-read and re-plan from
    what it wrote. Raises KubeError on failures that retries did not absorb."""
    for attempt in range(3):
        try:
            return _cycle(kube, target, now, metrics)
        except Conflict:
            if attempt == 2:
                raise
            log.info("the certificate Secret changed under us; planning again")
    raise AssertionError("unreachable")


def _cycle(kube: Kube, target: Target, now: dt.datetime, metrics: CertsMetrics | None) -> SyncResult:
    try:
        secret: Obj | None = kube.get(target.secret_path)
    except NotFound:
        secret = None
    data = _decode(secret.get("data")) if secret is not None else None
    configs, bundles, missing = _read_configurations(kube, target)
    names = service_dns_names(target.service, target.namespace)
    # Drift: a caBundle that differs from what the Secret as read asks for (a replace, a GitOps tool), whether
    # or not this cycle's steps then change what it asks for.
    drifted = set(needs_injection(trust_bundle(data), bundles)) if data is not None else set()
    steps = secret_steps(data, bundles, names, now, target.lifetimes)
    if steps:
        data = advance(data, steps, names, now, target.lifetimes, bundles)
        _write_secret(kube, target, secret, data)
        for step in steps:
            if metrics is not None:
                metrics.steps.labels(step.value).inc()
        log.info("certificate steps done: %s", ", ".join(s.value for s in steps))
    assert data is not None
    bundle = trust_bundle(data)
    injected = needs_injection(bundle, bundles)
    for kind, name in sorted({(ref.kind, ref.configuration) for ref in injected}):
        _inject(kube, kind, name, configs[(kind, name)], bundle)
        log.info("caBundle injected into %s/%s", KINDS[kind], name)
    repaired = drifted & set(injected)
    if repaired:
        log.warning("caBundle had drifted from the Secret in %d webhooks: repaired", len(repaired))
        if metrics is not None:
            metrics.ca_bundle_repairs.inc(len(repaired))
    if metrics is not None:
        metrics.ca_expiry.set(load_certs(data[CA_CRT])[0].not_valid_after_utc.timestamp())
        metrics.serving_expiry.set(load_certs(data[TLS_CRT])[0].not_valid_after_utc.timestamp())
    optional = tuple(m for m in missing if m.startswith(KINDS["validating"] + "/"))
    return SyncResult(steps, injected, tuple(m for m in missing if m not in optional), optional)


def sync_guarded(
    kube: Kube,
    target: Target,
    now: dt.datetime,
    metrics: CertsMetrics | None = None,
    reported: set[str] | None = None,
) -> SyncResult | None:
    """sync_once for loops: failures are logged and counted, never raised. A missing mutating webhook
    configuration is a warning every cycle; a missing optional one is logged at debug level, once while it
    lasts, when the caller keeps `reported` across cycles (the names already reported; owned by the loop's
    thread)."""
    try:
        result = sync_once(kube, target, now, metrics)
    except KubeError as e:
        if metrics is not None:
            metrics.syncs.labels("error").inc()
        log.warning("certs sync failed (retried next cycle): %s", e)
        return None
    except Exception:
        # A bug must not end rotation for the life of the process: log it, count it, try next cycle.
        if metrics is not None:
            metrics.syncs.labels("error").inc()
        log.exception("certs sync failed unexpectedly (retried next cycle)")
        return None
    if metrics is not None:
        metrics.syncs.labels("ok").inc()
    for name in result.missing:
        log.warning("webhook configuration %s not found: nothing to inject there", name)
    for name in result.optional_missing:
        if reported is None or name not in reported:
            log.debug("webhook configuration %s not found (optional: components/validating-webhook)", name)
    if reported is not None:
        reported.intersection_update(result.optional_missing)  # one that comes back and goes is told again
        reported.update(result.optional_missing)
    return result


def certs_task(
    kube: Kube,
    target: Target,
    *,
    identity: str,
    interval: float,
    stop: threading.Event,
    clock: Callable[[], dt.datetime],
    metrics: CertsMetrics | None = None,
    lease_duration: float = 15.0,
    renew_deadline: float = 10.0,
    retry_period: float = 2.0,
    on_run: Callable[[str, str], None] = lambda name, result: None,
) -> LeaderTask:
    """Certificate rotation as a periodic task under its own Lease (`sparkgate-certs`): a cycle every
    `interval` seconds in the replica that holds it. A cycle's writes check the Lease first, each one
    (`Kube.gated`): a cycle that outlives the Lease (a hung API server) writes nothing more."""
    elector = LeaderElector(
        kube,
        target.namespace,
        contract.CERTS_LEASE,
        identity,
        lease_duration=lease_duration,
        renew_deadline=renew_deadline,
        retry_period=retry_period,
    )
    reported: set[str] = set()  # touched by the task's thread only
    leader_kube = elector.gate(kube)
    return LeaderTask(
        "certs",
        interval,
        lambda: _cycle_for_task(leader_kube, target, clock, metrics, reported),
        elector=elector,
        own_lease=True,
        stop=stop,
        on_run=on_run,
        follow=None if metrics is None else lambda: observe_expiry(kube, target, metrics),
    )


def observe_expiry(kube: Kube, target: Target, metrics: CertsMetrics) -> None:
    """What a replica that does not rotate reports: the expiry of the certificates in the Secret (read only),
    so that every replica's gauges are true. Until a read succeeds, the gauges have no sample (ExpiryGauge)."""
    try:
        secret = kube.get(target.secret_path)
    except KubeError as e:
        log.debug("certificate Secret not read: %s", e)
        return
    data = _decode(secret.get("data"))
    for key, gauge in ((CA_CRT, metrics.ca_expiry), (TLS_CRT, metrics.serving_expiry)):
        certs = load_certs(data.get(key, b""))
        if certs:
            gauge.set(certs[0].not_valid_after_utc.timestamp())


def _cycle_for_task(
    kube: Kube,
    target: Target,
    clock: Callable[[], dt.datetime],
    metrics: CertsMetrics | None,
    reported: set[str],
) -> None:
    if sync_guarded(kube, target, clock(), metrics, reported) is None:
        raise RuntimeError("certs sync cycle failed (see above)")


def run_loop(
    kube: Kube,
    target: Target,
    *,
    identity: str,
    interval: float,
    stop: threading.Event,
    clock: Callable[[], dt.datetime],
    metrics: CertsMetrics | None = None,
) -> None:
    """`certs sync --loop`: the certificate task in this thread, until `stop` is set; the Lease is given up
    at the end."""
    certs_task(
        kube, target, identity=identity, interval=interval, stop=stop, clock=clock, metrics=metrics
    ).run()
