"""Kubernetes resource quantities (`500m`, `2`, `1Gi`, `512M`) as integers: CPU in millicores, memory in bytes.

The scheduler sums every bound pod's requests at each attempt and a cluster's pods carry a handful of distinct
quantities, so the conversions are memoized (pure functions of their text; a malformed one is not cached
and raises each time)."""

from __future__ import annotations

import functools
from decimal import Decimal, InvalidOperation

_SUFFIXES: dict[str, int | Decimal] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip


def parse(quantity: str | int | float) -> Decimal:
    text = str(quantity).strip()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if suffix and text.endswith(suffix):
            number, factor = text[: -len(suffix)], _SUFFIXES[suffix]
            break
    else:
        number, factor = text, 1
    try:
        return Decimal(number) * Decimal(factor)
    except InvalidOperation:
        raise ValueError(f"quantities must match the regular expression: {quantity!r}") from None


@functools.lru_cache(maxsize=4096, typed=True)
def cpu_millis(quantity: str | int | float) -> int:
    return int((parse(quantity) * 1000).to_integral_value(rounding="ROUND_CEILING"))


@functools.lru_cache(maxsize=4096, typed=True)
def memory_bytes(quantity: str | int | float) -> int:
    return int(parse(quantity).to_integral_value(rounding="ROUND_CEILING"))
