"""The certificate plan and its execution: creation, renewal, repair, and a CA rollover that never leaves
the API server without trust in the certificate a webhook replica may be serving."""

from __future__ import annotations

import datetime as dt

from cryptography import x509

from certs.material import advance, fresh
from certs.pki import make_ca, make_serving_cert, service_dns_names
from certs.plan import (
    CA_CRT,
    CA_KEY,
    NEXT_CRT,
    NEXT_KEY,
    PREVIOUS_CRT,
    TLS_CRT,
    TLS_KEY,
    Lifetimes,
    Step,
    WebhookRef,
    load_certs,
    needs_injection,
    secret_steps,
    trust_bundle,
)

NAMES = service_dns_names("sparkgate-webhook", "sparkgate-system")
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
LIFE = Lifetimes()
HOOKS = (
    WebhookRef("mutating", "sparkgate", "executors.sparkgate.io"),
    WebhookRef("validating", "sparkgate", "gate.sparkgate.io"),
)


def verifies(serving_pem: bytes, bundle: bytes, now: dt.datetime) -> bool:
    """Whether a client trusting `bundle` accepts `serving_pem` for the Service name at `now`."""
    store = x509.verification.Store(load_certs(bundle))
    verifier = (
        x509.verification.PolicyBuilder().store(store).time(now).build_server_verifier(x509.DNSName(NAMES[2]))
    )
    try:
        verifier.verify(load_certs(serving_pem)[0], [])
    except x509.verification.VerificationError:
        return False
    return True


def test_nothing_yet_creates_and_then_is_stable() -> None:
    assert secret_steps(None, {}, NAMES, T0, LIFE) == (Step.CREATE,)
    data = advance(None, (Step.CREATE,), NAMES, T0, LIFE)
    assert verifies(data[TLS_CRT], data[CA_CRT], T0)
    assert trust_bundle(data) == data[CA_CRT]
    bundles = {ref: trust_bundle(data) for ref in HOOKS}
    assert secret_steps(data, bundles, NAMES, T0 + dt.timedelta(days=1), LIFE) == ()
    assert needs_injection(trust_bundle(data), bundles) == ()


def test_serving_renewed_before_expiry_under_the_same_ca() -> None:
    data = fresh(NAMES, T0, LIFE)
    later = T0 + LIFE.serving - LIFE.serving_renew_before + dt.timedelta(minutes=1)
    assert secret_steps(data, {}, NAMES, later, LIFE) == (Step.RENEW_SERVING,)
    renewed = advance(data, (Step.RENEW_SERVING,), NAMES, later, LIFE)
    assert renewed[CA_CRT] == data[CA_CRT] and renewed[TLS_CRT] != data[TLS_CRT]
    assert verifies(renewed[TLS_CRT], data[CA_CRT], later)


def test_serving_with_other_names_or_another_ca_is_reissued() -> None:
    data = fresh(NAMES, T0, LIFE)
    assert secret_steps(data, {}, service_dns_names("other", "ns"), T0, LIFE) == (Step.RENEW_SERVING,)
    stranger = make_ca("stranger", T0, LIFE.ca)
    foreign = make_serving_cert(stranger, list(NAMES), T0, LIFE.serving)
    broken = {**data, TLS_CRT: foreign.cert_pem}
    assert secret_steps(broken, {}, NAMES, T0, LIFE) == (Step.RENEW_SERVING,)
    assert secret_steps({**data, TLS_CRT: b"garbage"}, {}, NAMES, T0, LIFE) == (Step.RENEW_SERVING,)


def test_expired_or_missing_ca_starts_afresh_and_keeps_foreign_keys() -> None:
    data = fresh(NAMES, T0, LIFE)
    assert secret_steps(data, {}, NAMES, T0 + LIFE.ca + dt.timedelta(days=1), LIFE) == (Step.CREATE,)
    assert secret_steps({TLS_CRT: data[TLS_CRT]}, {}, NAMES, T0, LIFE) == (Step.CREATE,)
    redone = advance({"extra": b"x", **data}, (Step.CREATE,), NAMES, T0, LIFE)
    assert redone["extra"] == b"x" and redone[CA_CRT] != data[CA_CRT]


def test_wrong_or_empty_ca_bundles_are_reinjected() -> None:
    data = fresh(NAMES, T0, LIFE)
    other = make_ca("other", T0, LIFE.ca).cert_pem
    bundles = {HOOKS[0]: other, HOOKS[1]: trust_bundle(data)}
    assert needs_injection(trust_bundle(data), bundles) == (HOOKS[0],)
    assert needs_injection(trust_bundle(data), {HOOKS[1]: b""}) == (HOOKS[1],)
    # Order and whitespace do not matter, the set of certificates does.
    assert needs_injection(trust_bundle(data), {HOOKS[0]: b"\n" + data[CA_CRT]}) == ()


# How long after the Secret changed a replica may still serve the certificate it replaced (docs/operations.md,
# "Lifetimes and rotation schedule": a node cut off from the API server for days).
SERVED_STALE = dt.timedelta(days=7)


def test_rollover_keeps_every_recent_serving_certificate_trusted() -> None:
    """Walk three CA lifetimes in daily sync cycles (10 minutes around the rollover steps), injecting
    after each Secret write as `certs sync` does, with the API server lagging one cycle behind. At every
    instant, each serving certificate replaced less than SERVED_STALE ago (what a replica whose Secret
    volume has not caught up yet still serves: a minute or two, days on a node cut off from the API server)
    verifies against every caBundle the API server holds."""
    data = advance(None, (Step.CREATE,), NAMES, T0, LIFE)
    bundles = {ref: trust_bundle(data) for ref in HOOKS}
    # Each serving certificate and when the Secret stopped holding it (None: it still does).
    served: list[tuple[bytes, dt.datetime | None]] = [(data[TLS_CRT], None)]
    seen_steps: list[Step] = []
    now = T0
    while now < T0 + 3 * LIFE.ca:
        steps = secret_steps(data, bundles, NAMES, now, LIFE)
        seen_steps += steps
        if steps:
            data = advance(data, steps, NAMES, now, LIFE)
            if data[TLS_CRT] != served[-1][0]:
                served[-1] = (served[-1][0], now)
                served.append((data[TLS_CRT], None))
        for ref in needs_injection(trust_bundle(data), bundles):
            bundles[ref] = trust_bundle(data)
        # What a replica may still serve: the current one, and any replaced less than keep_previous ago.
        recent = [pem for pem, replaced in served if replaced is None or now - replaced < SERVED_STALE]
        for pem in recent:
            for bundle in bundles.values():
                assert verifies(pem, bundle, now), (now, seen_steps[-3:])
        if NEXT_CRT in data:
            now += dt.timedelta(minutes=10)
        else:
            now += dt.timedelta(hours=6) if PREVIOUS_CRT in data else dt.timedelta(days=1)
    for step in (Step.STAGE_CA, Step.SWITCH_CA, Step.DROP_PREVIOUS_CA, Step.RENEW_SERVING):
        assert seen_steps.count(step) >= 2, step
    assert Step.CREATE not in seen_steps


def test_switch_waits_until_every_webhook_trusts_the_new_ca() -> None:
    data = fresh(NAMES, T0, LIFE)
    near_end = T0 + LIFE.ca - LIFE.ca_renew_before
    staged = advance(data, (Step.STAGE_CA,), NAMES, near_end, LIFE)
    assert load_certs(trust_bundle(staged)) == load_certs(data[CA_CRT] + staged[NEXT_CRT])
    later = near_end + LIFE.overlap
    half = {HOOKS[0]: trust_bundle(staged), HOOKS[1]: data[CA_CRT]}
    assert Step.SWITCH_CA not in secret_steps(staged, half, NAMES, later, LIFE)
    full = {ref: trust_bundle(staged) for ref in HOOKS}
    assert Step.SWITCH_CA not in secret_steps(staged, full, NAMES, near_end, LIFE)
    assert secret_steps(staged, full, NAMES, later, LIFE) == (Step.SWITCH_CA,)


def test_a_ca_whose_key_was_lost_is_replaced_and_stays_trusted_until_the_replicas_serve_the_new_one() -> None:
    """CREATE over a still-valid CA that signed the serving certificate (its key junk: a hand edit) and that
    the caBundles trust: the old CA certificate is kept as ca-previous.crt, so the bundle injected still verifies what the replicas serve
    until their volume is updated, and it goes keep_previous later, as after a switch. Without a Secret (the
    documented start-over) or with an expired CA, nothing old is kept."""
    data = fresh(NAMES, T0, LIFE)
    broken = {**data, CA_KEY: b"junk"}
    later = T0 + dt.timedelta(days=30)
    trusted = {ref: trust_bundle(data) for ref in HOOKS}  # what the API server trusts now
    assert secret_steps(broken, trusted, NAMES, later, LIFE) == (Step.CREATE,)
    # A CA no caBundle holds (written in from elsewhere) is not made trusted by the start afresh.
    assert PREVIOUS_CRT not in advance(broken, (Step.CREATE,), NAMES, later, LIFE, {})
    redone = advance(broken, (Step.CREATE,), NAMES, later, LIFE, trusted)
    assert redone[PREVIOUS_CRT] == data[CA_CRT] and redone[CA_CRT] != data[CA_CRT]
    bundle = trust_bundle(redone)
    assert verifies(data[TLS_CRT], bundle, later) and verifies(redone[TLS_CRT], bundle, later)
    bundles = {ref: bundle for ref in HOOKS}
    assert (
        secret_steps(redone, bundles, NAMES, later + LIFE.keep_previous - dt.timedelta(minutes=1), LIFE) == ()
    )
    settled = later + LIFE.keep_previous
    assert secret_steps(redone, bundles, NAMES, settled, LIFE) == (Step.DROP_PREVIOUS_CA,)
    assert PREVIOUS_CRT not in advance(None, (Step.CREATE,), NAMES, later, LIFE, trusted)
    expired = T0 + LIFE.ca + dt.timedelta(days=1)
    assert PREVIOUS_CRT not in advance(data, (Step.CREATE,), NAMES, expired, LIFE, trusted)
    foreign = {**broken, TLS_CRT: fresh(NAMES, T0, LIFE)[TLS_CRT]}  # a serving certificate it did not sign
    assert PREVIOUS_CRT not in advance(foreign, (Step.CREATE,), NAMES, later, LIFE, trusted)


def test_keys_that_do_not_match_their_certificates_are_replaced() -> None:
    data = fresh(NAMES, T0, LIFE)
    other = fresh(NAMES, T0, LIFE)
    assert secret_steps({**data, CA_KEY: b"junk"}, {}, NAMES, T0, LIFE) == (Step.CREATE,)
    assert secret_steps({**data, CA_KEY: other[CA_KEY]}, {}, NAMES, T0, LIFE) == (Step.CREATE,)
    assert secret_steps({**data, TLS_KEY: other[TLS_KEY]}, {}, NAMES, T0, LIFE) == (Step.RENEW_SERVING,)
    near_end = T0 + LIFE.ca - LIFE.ca_renew_before
    staged = advance(data, (Step.STAGE_CA,), NAMES, near_end, LIFE)
    broken = {**staged, NEXT_KEY: b"junk"}
    bundles = {ref: trust_bundle(broken) for ref in HOOKS}
    # A staged CA without its key cannot be switched to: it is staged afresh instead.
    steps = secret_steps(broken, bundles, NAMES, near_end + LIFE.overlap, LIFE)
    assert Step.STAGE_CA in steps and Step.SWITCH_CA not in steps
    assert advance(broken, steps, NAMES, near_end + LIFE.overlap, LIFE)[NEXT_KEY] != b"junk"
