"""certs sync against kubesim over real HTTP with the official client: Secret creation, caBundle
injection and repair, a CA rollover driven by an injected clock, the certs Lease, and the CLI."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import logging
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from prometheus_client import CollectorRegistry, generate_latest

from certs.pki import make_ca
from certs.plan import CA_CRT, NEXT_CRT, PREVIOUS_CRT, TLS_CRT, Lifetimes, Step, load_certs
from certs.sync import CertsMetrics, Target, observe_expiry, run_loop, sync_guarded, sync_once
from kubesim.cluster import Cluster
from sparkgate.cli import main
from sparkgate.kube import Kube
from sparkgate.leader import LeaderElector

SA = "system:serviceaccount:sparkgate-system:sparkgate-allocator"
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
ADMISSION = "/apis/admissionregistration.k8s.io/v1"


def webhook_configuration(kind: str) -> dict[str, Any]:
    webhook = {
        "name": f"{kind}.sparkgate.io",
        "clientConfig": {"service": {"namespace": "sparkgate-system", "name": "sparkgate-webhook"}},
        "rules": [
            {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
        ],
        "failurePolicy": "Ignore",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 3,
    }
    return {"metadata": {"name": "sparkgate"}, "webhooks": [webhook, {**webhook, "name": f"other.{kind}"}]}


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with Cluster(nodes=1) as c:
        c.store.create("mutatingwebhookconfigurations", webhook_configuration("mutating"))
        c.store.create("validatingwebhookconfigurations", webhook_configuration("validating"))
        yield c


@pytest.fixture
def kube(cluster: Cluster) -> Iterator[Kube]:
    k = Kube.from_kubeconfig(str(cluster.add_user(SA)))
    yield k
    k.close()


def secret_data(cluster: Cluster) -> dict[str, bytes]:
    secret = cluster.store.get("secrets", "sparkgate-system", "sparkgate-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def bundles(cluster: Cluster) -> list[bytes]:
    found = []
    for resource in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        for webhook in cluster.store.get(resource, None, "sparkgate")["webhooks"]:
            found.append(base64.b64decode(webhook["clientConfig"].get("caBundle", "")))
    return found


def test_first_sync_creates_the_secret_and_injects_every_webhook(cluster: Cluster, kube: Kube) -> None:
    result = sync_once(kube, Target(), T0)
    assert result.steps == (Step.CREATE,) and len(result.injected) == 4 and result.missing == ()
    data = secret_data(cluster)
    assert bundles(cluster) == [data[CA_CRT]] * 4
    serving = load_certs(data[TLS_CRT])[0]
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "sparkgate-webhook.sparkgate-system.svc" in sans.get_values_for_type(x509.DNSName)
    before = cluster.store.resource_version
    again = sync_once(kube, Target(), T0 + dt.timedelta(days=1))
    assert again.steps == () and again.injected == ()
    assert cluster.store.resource_version == before  # a quiet cycle writes nothing


def test_overwritten_or_wrong_ca_bundle_is_repaired_in_one_cycle(cluster: Cluster, kube: Kube) -> None:
    sync_once(kube, Target(), T0)
    good = secret_data(cluster)[CA_CRT]
    # A re-apply of the manifests drops caBundle; someone else puts a stranger's CA into the validating one.
    mwc = cluster.store.get("mutatingwebhookconfigurations", None, "sparkgate")
    reapplied = copy.deepcopy(webhook_configuration("mutating"))
    reapplied["metadata"]["resourceVersion"] = mwc["metadata"]["resourceVersion"]
    cluster.store.replace("mutatingwebhookconfigurations", None, "sparkgate", reapplied)
    vwc = copy.deepcopy(cluster.store.get("validatingwebhookconfigurations", None, "sparkgate"))
    stranger = make_ca("stranger", T0, dt.timedelta(days=9)).cert_pem
    vwc["webhooks"][1]["clientConfig"]["caBundle"] = base64.b64encode(stranger).decode()
    cluster.store.replace("validatingwebhookconfigurations", None, "sparkgate", vwc)
    result = sync_once(kube, Target(), T0 + dt.timedelta(minutes=1))
    assert result.steps == () and len(result.injected) == 3
    assert bundles(cluster) == [good] * 4
    after = cluster.store.get("validatingwebhookconfigurations", None, "sparkgate")
    assert after["webhooks"][1]["timeoutSeconds"] == 3  # the rest of each webhook is untouched


def test_a_ca_bundle_blanked_before_a_cycle_with_a_step_is_counted_as_a_repair(
    cluster: Cluster, kube: Kube
) -> None:
    """Drift is a caBundle that differs from what the Secret as read asks for, whatever the cycle's steps
    then do: a blank met by the cycle that stages a new CA was injected but not counted (the repairs counter
    counted only cycles without a step), so SparkgateCaBundleDrift missed it. The webhooks that held the
    Secret's bundle are not drift, though the stage changes their bundle too."""
    target = Target(lifetimes=Lifetimes(ca=dt.timedelta(days=30), ca_renew_before=dt.timedelta(days=5)))
    sync_once(kube, target, T0)
    mwc = cluster.store.get("mutatingwebhookconfigurations", None, "sparkgate")
    reapplied = copy.deepcopy(webhook_configuration("mutating"))
    reapplied["metadata"]["resourceVersion"] = mwc["metadata"]["resourceVersion"]
    cluster.store.replace("mutatingwebhookconfigurations", None, "sparkgate", reapplied)
    metrics = CertsMetrics(CollectorRegistry())
    result = sync_once(kube, target, T0 + dt.timedelta(days=26), metrics)
    assert result.steps == (Step.STAGE_CA,) and len(result.injected) == 4
    assert metrics.ca_bundle_repairs._value.get() == 2  # the blanked configuration's two webhooks of the four


def test_expired_ca_is_replaced_and_reinjected(cluster: Cluster, kube: Kube) -> None:
    target = Target(lifetimes=Lifetimes(ca=dt.timedelta(days=30), ca_renew_before=dt.timedelta(days=1)))
    sync_once(kube, target, T0)
    old = secret_data(cluster)[CA_CRT]
    result = sync_once(kube, target, T0 + dt.timedelta(days=31))
    assert result.steps == (Step.CREATE,) and len(result.injected) == 4
    assert secret_data(cluster)[CA_CRT] != old and bundles(cluster) == [secret_data(cluster)[CA_CRT]] * 4


def test_rollover_cycle_by_cycle(cluster: Cluster, kube: Kube) -> None:
    life = Lifetimes()
    target = Target(lifetimes=life)
    sync_once(kube, target, T0)
    first = secret_data(cluster)
    stage_at = T0 + life.ca - life.ca_renew_before + dt.timedelta(hours=1)
    assert Step.STAGE_CA in sync_once(kube, target, stage_at).steps
    staged = secret_data(cluster)
    assert bundles(cluster) == [first[CA_CRT] + staged[NEXT_CRT]] * 4
    # Staging does not change who signs the serving certificate.
    assert load_certs(staged[TLS_CRT])[0].issuer == load_certs(first[CA_CRT])[0].subject
    assert sync_once(kube, target, stage_at + dt.timedelta(minutes=1)).steps == ()
    switched_at = stage_at + life.overlap
    assert sync_once(kube, target, switched_at).steps == (Step.SWITCH_CA,)
    switched = secret_data(cluster)
    assert switched[CA_CRT] == staged[NEXT_CRT] and switched[PREVIOUS_CRT] == first[CA_CRT]
    assert load_certs(switched[TLS_CRT])[0].issuer == load_certs(switched[CA_CRT])[0].subject
    assert bundles(cluster) == [first[CA_CRT] + switched[CA_CRT]] * 4  # nothing to inject
    assert sync_once(kube, target, switched_at + life.keep_previous - dt.timedelta(minutes=1)).steps == ()
    result = sync_once(kube, target, switched_at + life.keep_previous)
    assert result.steps == (Step.DROP_PREVIOUS_CA,) and len(result.injected) == 4
    assert bundles(cluster) == [switched[CA_CRT]] * 4


def test_missing_configuration_is_reported_not_fatal(cluster: Cluster, kube: Kube) -> None:
    cluster.store.delete("validatingwebhookconfigurations", None, "sparkgate")
    result = sync_once(kube, Target(), T0)
    assert result.missing == () and result.optional_missing == ("validatingwebhookconfigurations/sparkgate",)
    assert len(result.injected) == 2
    cluster.store.delete("mutatingwebhookconfigurations", None, "sparkgate")
    result = sync_once(kube, Target(), T0)
    assert result.missing == ("mutatingwebhookconfigurations/sparkgate",) and result.injected == ()


def test_the_optional_validating_configuration_is_told_once_at_debug_and_a_missing_mutating_one_warns(
    cluster: Cluster, kube: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    """The base installs no validating webhook configuration: nothing to warn about, every cycle."""
    cluster.store.delete("validatingwebhookconfigurations", None, "sparkgate")
    reported: set[str] = set()
    with caplog.at_level(logging.DEBUG, logger="certs.sync"):
        for _ in range(3):
            assert sync_guarded(kube, Target(), T0, reported=reported) is not None
    missing = [r for r in caplog.records if "not found" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in missing] == [
        (
            logging.DEBUG,
            "webhook configuration validatingwebhookconfigurations/sparkgate not found "
            "(optional: components/validating-webhook)",
        )
    ]
    caplog.clear()
    cluster.store.delete("mutatingwebhookconfigurations", None, "sparkgate")
    with caplog.at_level(logging.DEBUG, logger="certs.sync"):
        for _ in range(2):
            assert sync_guarded(kube, Target(), T0, reported=reported) is not None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        warnings
        == [
            "webhook configuration mutatingwebhookconfigurations/sparkgate not found: nothing to inject there"
        ]
        * 2
    )


def test_one_lease_holder_at_a_time_taken_over_after_locally_observed_expiry(
    cluster: Cluster, kube: Kube
) -> None:
    """The certificate Lease uses the allocator's elector (client-go's rules): a candidate takes a Lease
    only once it has seen it unchanged for leaseDurationSeconds on its own clock."""
    now = [0.0]

    def elector(identity: str) -> LeaderElector:
        return LeaderElector(
            kube, "sparkgate-system", "sparkgate-certs", identity, lease_duration=15, monotonic=lambda: now[0]
        )

    a, b = elector("pod-a"), elector("pod-b")
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    now[0] = 10
    assert a.try_acquire_or_renew()
    now[0] = 20
    assert not b.try_acquire_or_renew()  # it changed since b last looked: b's 15 s start again
    now[0] = 34
    assert not b.try_acquire_or_renew()
    now[0] = 36
    assert b.try_acquire_or_renew() and not a.try_acquire_or_renew()
    b.release()
    assert a.try_acquire_or_renew()
    lease = cluster.store.get("leases", "sparkgate-system", "sparkgate-certs")
    assert lease["spec"]["holderIdentity"] == "pod-a" and lease["spec"]["leaseTransitions"] == 2


def test_a_renew_time_from_a_skewed_clock_does_not_hand_the_lease_over(cluster: Cluster, kube: Kube) -> None:
    """The holder's clock is years behind: its renewTime says expired, but it keeps renewing. The remote
    wall clock is never compared with ours."""
    cluster.store.create(
        "leases",
        {
            "metadata": {"name": "sparkgate-certs", "namespace": "sparkgate-system"},
            "spec": {
                "holderIdentity": "skewed",
                "leaseDurationSeconds": 15,
                "renewTime": "2001-01-01T00:00:00.000000Z",
            },
        },
    )
    now = [0.0]
    b = LeaderElector(
        kube, "sparkgate-system", "sparkgate-certs", "pod-b", lease_duration=15, monotonic=lambda: now[0]
    )
    assert not b.try_acquire_or_renew()
    now[0] = 14
    assert not b.try_acquire_or_renew()
    now[0] = 15  # seen unchanged for a whole lease duration here: the holder is gone
    assert b.try_acquire_or_renew()


def test_cli_sync_once_and_generate(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = str(cluster.add_user(SA))
    assert main(["certs", "sync", "--once", "--kubeconfig", kubeconfig]) == 0
    assert "create" in capsys.readouterr().out
    assert bundles(cluster) == [secret_data(cluster)[CA_CRT]] * 4
    assert main(["certs", "sync", "--once", "--kubeconfig", kubeconfig]) == 0
    assert "nothing to do" in capsys.readouterr().out

    out = tmp_path / "tls"
    assert main(["certs", "generate", "--out", str(out), "--namespace", "ns", "--service", "hook"]) == 0
    printed = capsys.readouterr().out
    assert base64.b64decode(printed.split("caBundle: ")[1]) == (out / "ca.crt").read_bytes()
    assert (out / "tls.key").stat().st_mode & 0o777 == 0o600
    leaf = load_certs((out / "tls.crt").read_bytes())[0]
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "hook",
        "hook.ns",
        "hook.ns.svc",
        "hook.ns.svc.cluster.local",
    ]
    assert main(["certs", "generate", "--out", str(out)]) == 1  # no silent overwrite


def test_metrics_report_the_expiry_in_the_given_registry(cluster: Cluster, kube: Kube) -> None:
    registry = CollectorRegistry()
    metrics = CertsMetrics(registry)
    sync_once(kube, Target(), T0, metrics)
    data = secret_data(cluster)
    ca_end = load_certs(data[CA_CRT])[0].not_valid_after_utc.timestamp()
    serving_end = load_certs(data[TLS_CRT])[0].not_valid_after_utc.timestamp()
    assert registry.get_sample_value("sparkgate_certs_ca_expiry_timestamp_seconds") == ca_end
    assert registry.get_sample_value("sparkgate_certs_serving_expiry_timestamp_seconds") == serving_end
    assert registry.get_sample_value("sparkgate_certs_steps_total", {"step": "create"}) == 1


EXPIRY_GAUGES = (
    "sparkgate_certs_ca_expiry_timestamp_seconds",
    "sparkgate_certs_serving_expiry_timestamp_seconds",
)


def test_the_expiry_is_exported_only_once_known(cluster: Cluster, kube: Kube) -> None:
    """An unlabelled gauge would say 0 (expired in 1970) before the first cycle, and in a replica whose
    Secret reads fail: the expiry alert would fire and the dashboard's min() show -56 years. No sample
    instead, until a value is read; the family itself stays listed."""
    registry = CollectorRegistry()
    metrics = CertsMetrics(registry)
    text = generate_latest(registry).decode()
    for name in EXPIRY_GAUGES:
        assert registry.get_sample_value(name) is None
        assert f"# TYPE {name} gauge" in text and f"\n{name} " not in text
    # A replica that does not rotate: no Secret yet, then a read refused.
    observe_expiry(kube, Target(), metrics)
    cluster.faults.fail("get", "secrets", 403, count=1)
    observe_expiry(kube, Target(), metrics)
    assert [registry.get_sample_value(name) for name in EXPIRY_GAUGES] == [None, None]
    # A cycle that fails before it has read the certificates sets nothing either.
    cluster.faults.fail("get", "secrets", 403, count=1)
    assert sync_guarded(kube, Target(), T0, metrics) is None
    assert [registry.get_sample_value(name) for name in EXPIRY_GAUGES] == [None, None]
    # Once the Secret exists, the follower's read reports it, and a later failed read keeps it.
    sync_once(kube, Target(), T0)
    data = secret_data(cluster)
    ends = [load_certs(data[key])[0].not_valid_after_utc.timestamp() for key in (CA_CRT, TLS_CRT)]
    observe_expiry(kube, Target(), metrics)
    assert [registry.get_sample_value(name) for name in EXPIRY_GAUGES] == ends
    cluster.faults.fail("get", "secrets", 403, count=1)
    observe_expiry(kube, Target(), metrics)
    assert [registry.get_sample_value(name) for name in EXPIRY_GAUGES] == ends


def test_the_allocators_metrics_text_has_no_expiry_before_it_is_known() -> None:
    """The allocator serves the certificate metrics from its own registry, through its own text writer."""
    from allocator.metrics import AllocatorMetrics

    allocator = AllocatorMetrics()
    metrics = CertsMetrics(allocator.registry)
    assert [allocator.sample(name) for name in EXPIRY_GAUGES] == [None, None]
    metrics.ca_expiry.set(1.5e9)
    assert [allocator.sample(name) for name in EXPIRY_GAUGES] == [1.5e9, None]


def test_loop_syncs_while_holding_the_lease_and_releases_it(cluster: Cluster, kube: Kube) -> None:
    registry = CollectorRegistry()
    stop = threading.Event()
    loop = threading.Thread(
        target=run_loop,
        args=(kube, Target()),
        kwargs={
            "identity": "pod-a",
            "interval": 3600.0,
            "stop": stop,
            "clock": lambda: dt.datetime.now(dt.UTC),
            "metrics": CertsMetrics(registry),
        },
    )
    loop.start()

    def injected() -> bool:
        config = cluster.store.get("validatingwebhookconfigurations", None, "sparkgate")
        return all(w["clientConfig"].get("caBundle") for w in config["webhooks"])

    try:
        cluster.wait_for(injected, timeout=30, what="caBundle injected by the loop")
        lease = cluster.store.get("leases", "sparkgate-system", "sparkgate-certs")
        assert lease["spec"]["holderIdentity"] == "pod-a"
    finally:
        stop.set()
        loop.join(timeout=30)
    assert not loop.is_alive()
    assert cluster.store.get("leases", "sparkgate-system", "sparkgate-certs")["spec"]["holderIdentity"] == ""
    assert registry.get_sample_value("sparkgate_certs_syncs_total", {"result": "ok"}) == 1


def test_a_failing_cycle_is_counted_not_raised(cluster: Cluster, kube: Kube) -> None:
    registry = CollectorRegistry()
    cluster.faults.fail("get", "secrets", 403, count=1)
    assert sync_guarded(kube, Target(), T0, CertsMetrics(registry)) is None
    assert registry.get_sample_value("sparkgate_certs_syncs_total", {"result": "error"}) == 1
    assert sync_guarded(kube, Target(), T0, CertsMetrics(CollectorRegistry())) is not None


def test_a_ca_bundle_holding_only_an_expired_ca_is_repaired(cluster: Cluster, kube: Kube) -> None:
    sync_once(kube, Target(), T0)
    expired = make_ca("sparkgate-webhook-ca old", T0 - dt.timedelta(days=400), dt.timedelta(days=365))
    config = copy.deepcopy(cluster.store.get("mutatingwebhookconfigurations", None, "sparkgate"))
    for webhook in config["webhooks"]:
        webhook["clientConfig"]["caBundle"] = base64.b64encode(expired.cert_pem).decode()
    cluster.store.replace("mutatingwebhookconfigurations", None, "sparkgate", config)
    result = sync_once(kube, Target(), T0 + dt.timedelta(minutes=1))
    assert [r.kind for r in result.injected] == ["mutating", "mutating"]
    assert bundles(cluster) == [secret_data(cluster)[CA_CRT]] * 4


def test_losing_the_secret_creation_race_replans_from_the_winner(cluster: Cluster, kube: Kube) -> None:
    winner = Kube.from_kubeconfig(str(cluster.add_user("system:serviceaccount:sparkgate-system:other")))
    original = kube.create

    def create_after_the_other_replica(path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path.endswith("/secrets"):
            sync_once(winner, Target(), T0)  # the other replica's init container gets there first
        return original(path, body)

    kube.create = create_after_the_other_replica  # type: ignore[method-assign]
    result = sync_once(kube, Target(), T0)
    winner.close()
    assert result.steps == () and result.injected == ()  # nothing left to do after the winner
    assert bundles(cluster) == [secret_data(cluster)[CA_CRT]] * 4


def test_cli_loop_runs_until_sigterm_and_releases_the_lease(cluster: Cluster) -> None:
    kubeconfig = str(cluster.add_user(SA))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sparkgate.cli",
            "certs",
            "sync",
            "--loop",
            "--interval",
            "3600",
            "--kubeconfig",
            kubeconfig,
            "--identity",
            "pod-cli",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        cluster.wait_for(lambda: len([b for b in bundles(cluster) if b]) == 4, timeout=60, what="injection")
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    lease = cluster.store.get("leases", "sparkgate-system", "sparkgate-certs")
    assert lease["spec"]["holderIdentity"] == "" and lease["spec"]["leaseTransitions"] == 0


def test_an_unexpected_error_does_not_end_the_loop(kube: Kube, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = CollectorRegistry()

    def broken(path: str) -> dict[str, Any]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(kube, "get", broken)
    assert sync_guarded(kube, Target(), T0, CertsMetrics(registry)) is None
    assert registry.get_sample_value("sparkgate_certs_syncs_total", {"result": "error"}) == 1
