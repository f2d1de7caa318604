"""Carrying out the Secret steps of a plan: new keys and certificates, as the Secret's next data.

Kept apart from certs/plan.py because it is the one place that makes keys (random) while the plan is a
pure decision; `sparkgate certs generate` uses the same functions to write files.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from .pki import KeyPair, make_ca, make_serving_cert
from .plan import (
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
    served_ca,
)

CA_COMMON_NAME = "sparkgate-webhook-ca"


def _ca_name(now: dt.datetime) -> str:
    # A distinct subject per CA, so that a client never confuses the old and the new one in a bundle.
    return f"{CA_COMMON_NAME} {now:%Y-%m-%dT%H:%M:%SZ}"


def fresh(dns_names: Sequence[str], now: dt.datetime, lifetimes: Lifetimes) -> dict[str, bytes]:
    """A new CA and a serving certificate for `dns_names`, as Secret data."""
    ca = make_ca(_ca_name(now), now, lifetimes.ca)
    return _with_serving({CA_CRT: ca.cert_pem, CA_KEY: ca.key_pem}, dns_names, now, lifetimes)


def _with_serving(
    data: Mapping[str, bytes], dns_names: Sequence[str], now: dt.datetime, lifetimes: Lifetimes
) -> dict[str, bytes]:
    ca = KeyPair(data[CA_CRT], data[CA_KEY])
    serving = make_serving_cert(ca, list(dns_names), now, lifetimes.serving)
    return {**data, TLS_CRT: serving.cert_pem, TLS_KEY: serving.key_pem}


def advance(
    data: Mapping[str, bytes] | None,
    steps: Sequence[Step],
    dns_names: Sequence[str],
    now: dt.datetime,
    lifetimes: Lifetimes,
    ca_bundles: Mapping[WebhookRef, bytes] | None = None,
) -> dict[str, bytes]:
    """The Secret data after `steps` (from plan.secret_steps), other keys kept. `ca_bundles`: the webhooks'
    caBundles now, which decide whether a CREATE keeps the old CA trusted (plan.served_ca)."""
    result = dict(data or {})
    for step in steps:
        if step is Step.CREATE:
            ours = (CA_CRT, CA_KEY, NEXT_CRT, NEXT_KEY, PREVIOUS_CRT, TLS_CRT, TLS_KEY)
            kept = {k: v for k, v in result.items() if k not in ours}
            served = served_ca(result, now, ca_bundles or {})
            result = kept | fresh(dns_names, now, lifetimes)
            if served is not None:  # still trusted until the replicas serve the new certificate
                result[PREVIOUS_CRT] = served
        elif step is Step.STAGE_CA:
            staged = make_ca(_ca_name(now), now, lifetimes.ca)
            result[NEXT_CRT], result[NEXT_KEY] = staged.cert_pem, staged.key_pem
        elif step is Step.SWITCH_CA:
            result[PREVIOUS_CRT] = result[CA_CRT]
            result[CA_CRT], result[CA_KEY] = result.pop(NEXT_CRT), result.pop(NEXT_KEY)
            result = _with_serving(result, dns_names, now, lifetimes)
        elif step is Step.DROP_PREVIOUS_CA:
            result.pop(PREVIOUS_CRT, None)
        elif step is Step.RENEW_SERVING:
            result = _with_serving(result, dns_names, now, lifetimes)
    return result
