"""kubesim's uids and random name suffixes, from one pseudo-random generator seeded once by the OS.

kube-apiserver makes these in nanoseconds (k8s.io/apimachinery/pkg/util/uuid, util/rand). `uuid.uuid4` and
the `secrets` module read os.urandom for every value, and os.urandom releases the GIL: in kubesim's one busy
process each call then waited for the GIL again, 112 µs on average, ~1.2 ms of the 9 ms a pod creation took
through sparkgate's webhook (cProfile of kubesim's store, one driver; ~11 such values a creation: the
request uids of each webhook's review and matchCondition, the token volume's name, the pod's uid). None of
them is a secret (the bearer tokens of kubesim's users still come from `secrets`), so a Mersenne Twister
serves; its methods are atomic under the GIL, so threads share it.
"""

from __future__ import annotations

import random
import uuid

_RANDOM = random.Random()  # seeded from os.urandom, once
HEX = "0123456789abcdef"
# apimachinery util/rand `alphanums`: names.SimpleNameGenerator's suffixes (generateName, the token volume),
# vowels left out "to reduce the chances of bad words being formed".
NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"


def uid() -> str:
    """A random (version 4) UUID, as metadata.uid and AdmissionReview's request.uid are."""
    return str(uuid.UUID(int=_RANDOM.getrandbits(128), version=4))


def suffix(length: int, alphabet: str = HEX) -> str:
    return "".join(_RANDOM.choices(alphabet, k=length))
