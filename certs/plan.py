"""What the certificate controller must do next: a pure function of what it sees and the time.

The webhook's TLS material lives in one Secret (type kubernetes.io/tls) in the install namespace:

    tls.crt, tls.key        the serving certificate, signed by ca.crt (the webhook container mounts these two)
    ca.crt, ca.key          the CA that signs serving certificates
    ca-next.crt, ca-next.key    a new CA staged for a rollover (present only during one)
    ca-previous.crt         the CA replaced by the last rollover, still trusted for a grace period

The trust bundle (what every webhook's `caBundle` must hold) is ca.crt + ca-next.crt + ca-previous.crt.
A CA rollover never fails an admission because its steps are ordered by what the API server already trusts:
stage the new CA (bundle = old + new); switch the serving certificate to it only once every webhook's
caBundle holds it and `overlap` has passed; keep the old CA in the bundle for `keep_previous` after the
switch, so that replicas still serving the old certificate keep working (a Secret volume takes a minute or
two to update, and one on a node whose kubelet is down or cut off is not updated until it is back; the old
CA, valid for about a year more, costs nothing to trust meanwhile); then drop it. Renewing the serving certificate under the same CA needs no bundle change.

Times are read from the certificates themselves (issue time = notBefore + pki.BACKDATE), so the Secret
needs no bookkeeping fields and the plan is a function of (Secret data, caBundles, now, lifetimes).
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization

from .pki import BACKDATE

TLS_CRT, TLS_KEY = "tls.crt", "tls.key"
CA_CRT, CA_KEY = "ca.crt", "ca.key"
NEXT_CRT, NEXT_KEY = "ca-next.crt", "ca-next.key"
PREVIOUS_CRT = "ca-previous.crt"


@dataclass(frozen=True)
class Lifetimes:
    """How long certificates live and when they are replaced (see docs/operations.md for the why)."""

    ca: dt.timedelta = dt.timedelta(days=3 * 365)
    ca_renew_before: dt.timedelta = dt.timedelta(days=365)
    serving: dt.timedelta = dt.timedelta(days=90)
    serving_renew_before: dt.timedelta = dt.timedelta(days=30)
    overlap: dt.timedelta = dt.timedelta(minutes=10)
    keep_previous: dt.timedelta = dt.timedelta(days=7)


class Step(enum.Enum):
    CREATE = "create"  # no usable CA: start afresh (a new install, or a Secret broken beyond repair)
    STAGE_CA = "stage-ca"  # the CA nears its end: add a new one next to it
    SWITCH_CA = "switch-ca"  # the new CA is trusted everywhere: sign the serving certificate with it
    DROP_PREVIOUS_CA = "drop-previous-ca"  # the grace period after a switch is over
    RENEW_SERVING = "renew-serving"  # the serving certificate nears its end, is broken or has wrong names
    INJECT = "inject"  # some webhook's caBundle differs from the trust bundle


@dataclass(frozen=True)
class WebhookRef:
    """One webhook entry of a (Mutating|Validating)WebhookConfiguration."""

    kind: str  # "mutating" or "validating"
    configuration: str
    webhook: str


def load_certs(pem: bytes) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle; [] when it is empty or not PEM."""
    try:
        return x509.load_pem_x509_certificates(pem) if pem.strip() else []
    except ValueError:
        return []


def issued_at(cert: x509.Certificate) -> dt.datetime:
    return cert.not_valid_before_utc + BACKDATE


def trust_bundle(data: Mapping[str, bytes]) -> bytes:
    """The caBundle the webhooks must carry for this Secret: current, next and previous CA."""
    return b"".join(_pem(data.get(k, b"")) for k in (CA_CRT, NEXT_CRT, PREVIOUS_CRT) if data.get(k))


def _pem(value: bytes) -> bytes:
    return value if value.endswith(b"\n") else value + b"\n"


def _single(data: Mapping[str, bytes], key: str) -> x509.Certificate | None:
    certs = load_certs(data.get(key, b""))
    return certs[0] if len(certs) == 1 else None


def _key_matches(cert: x509.Certificate, key_pem: bytes) -> bool:
    """Whether `key_pem` is the private key of `cert` (a hand-edited or truncated Secret may hold junk)."""
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return False
    public = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return bool(key.public_key().public_bytes(*public) == cert.public_key().public_bytes(*public))


def _ca_usable(data: Mapping[str, bytes], now: dt.datetime) -> bool:
    ca = _single(data, CA_CRT)
    return ca is not None and ca.not_valid_after_utc > now and _key_matches(ca, data.get(CA_KEY, b""))


def served_ca(
    data: Mapping[str, bytes] | None, now: dt.datetime, ca_bundles: Mapping[WebhookRef, bytes]
) -> bytes | None:
    """The CA certificate that signed the serving certificate the webhook's replicas may still be serving,
    while it is still valid and a webhook's caBundle already trusts it: what a CREATE keeps as
    ca-previous.crt when it starts afresh over a broken CA (its key lost or replaced by a hand edit or a
    GitOps tool), so that the API server goes on trusting those replicas until their Secret volume is
    updated, instead of failing open meanwhile. None when there is none: no Secret (a deliberate
    start-over, docs/operations.md, trusts nothing old), an expired CA, a serving certificate it did not
    sign, or a CA no caBundle holds (one written in from elsewhere is never made trusted by this)."""
    if data is None:
        return None
    ca, serving = _single(data, CA_CRT), _single(data, TLS_CRT)
    if ca is None or serving is None or ca.not_valid_after_utc <= now or serving.not_valid_after_utc <= now:
        return None
    if not any(ca in load_certs(bundle) for bundle in ca_bundles.values()):
        return None
    try:
        serving.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return None
    return _pem(data[CA_CRT])


def _serving_needs_renewal(
    data: Mapping[str, bytes], dns_names: Sequence[str], now: dt.datetime, lifetimes: Lifetimes
) -> bool:
    serving, ca = _single(data, TLS_CRT), _single(data, CA_CRT)
    if serving is None or ca is None or serving.issuer != ca.subject:
        return True
    if not _key_matches(serving, data.get(TLS_KEY, b"")):
        return True
    try:
        serving.verify_directly_issued_by(ca)
        sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
        return True
    if set(sans.get_values_for_type(x509.DNSName)) != set(dns_names):
        return True
    if serving.not_valid_after_utc >= ca.not_valid_after_utc:
        # Already as long as the CA allows: only the CA rollover can extend it.
        return serving.not_valid_after_utc <= now
    return serving.not_valid_after_utc - now <= lifetimes.serving_renew_before


def secret_steps(
    data: Mapping[str, bytes] | None,
    ca_bundles: Mapping[WebhookRef, bytes],
    dns_names: Sequence[str],
    now: dt.datetime,
    lifetimes: Lifetimes,
) -> tuple[Step, ...]:
    """The changes the Secret needs, given its data (None when it does not exist) and each webhook's
    caBundle. One call moves a rollover at most one CA step forward; the next sync cycle does the next."""
    if data is None or not _ca_usable(data, now):
        return (Step.CREATE,)
    ca = _single(data, CA_CRT)
    assert ca is not None
    steps: list[Step] = []
    staged = _single(data, NEXT_CRT)
    if staged is not None and _key_matches(staged, data.get(NEXT_KEY, b"")):
        bundled = all(staged in load_certs(b) for b in ca_bundles.values())
        if bundled and now - issued_at(staged) >= lifetimes.overlap:
            return (Step.SWITCH_CA,)
    elif ca.not_valid_after_utc - now <= lifetimes.ca_renew_before:
        steps.append(Step.STAGE_CA)
    previous = _single(data, PREVIOUS_CRT)
    serving = _single(data, TLS_CRT)
    if previous is not None:
        settled = serving is not None and now - issued_at(serving) >= lifetimes.keep_previous
        if settled or previous.not_valid_after_utc <= now:
            steps.append(Step.DROP_PREVIOUS_CA)
    if _serving_needs_renewal(data, dns_names, now, lifetimes):
        steps.append(Step.RENEW_SERVING)
    return tuple(steps)


def needs_injection(bundle: bytes, ca_bundles: Mapping[WebhookRef, bytes]) -> tuple[WebhookRef, ...]:
    """The webhooks whose caBundle does not hold exactly the certificates of `bundle`, in a stable order."""
    wanted = _fingerprints(bundle)
    return tuple(
        ref
        for ref in sorted(ca_bundles, key=lambda r: (r.kind, r.configuration, r.webhook))
        if _fingerprints(ca_bundles[ref]) != wanted
    )


def _fingerprints(bundle: bytes) -> set[bytes]:
    return {c.fingerprint(hashes.SHA256()) for c in load_certs(bundle)}
