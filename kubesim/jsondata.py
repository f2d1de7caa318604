"""kubesim's JSON documents: their deep copy and their encoding, one definition each.

`clone`: a deep copy of a JSON document (kubesim's stored objects, requests and patches).

`copy.deepcopy` walks a document in Python with a memo of every node: ~600 µs for a captured Spark executor
pod, and kubesim copies each stored object at every write it makes from it (11 % of kubesim's CPU while the
demo's executors were admitted and released, py-spy). orjson's encoding and parsing of the same pod takes
~50 µs, and gives the same document: dicts (key order kept), lists, str, int, float, bool and None are
exactly what it round-trips. Most else (a tuple, a subclass such as a CEL `Typed` object, a dataclass, a
datetime, an integer past 64 bits) is refused by the encoder and copied by `copy.deepcopy`. What is not a
JSON document's may still be changed: a NaN or an infinity becomes None, a UUID or an Enum member its
value; no kubesim document holds one (JSON has none).

`encode`: a document's JSON text as kubesim sends it (answers, watch events, the AdmissionReview it sends a
webhook): orjson, 11 µs for a captured AdmissionReview where `json.dumps` took 124 µs (JSON encoding was 9 %
of kubesim's CPU in the same run). For a JSON document the text differs from `json.dumps(separators=(",",
":"))`'s only in writing non-ASCII characters as UTF-8 rather than `\\u` escapes, as kube-apiserver does
too; one orjson refuses (an integer past 64 bits, a key that is not a string) is written by `json.dumps`.
"""

from __future__ import annotations

import copy
import json
from typing import Any, TypeVar

import orjson

_T = TypeVar("_T")
# Types orjson would otherwise write as something else (a subclass as its base, a dataclass as a dict, a
# datetime as a string): refused, so copy.deepcopy copies them as they are.
_REFUSE = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def clone(document: _T) -> _T:
    """A copy of `document` that shares nothing mutable with it."""
    try:
        out: _T = orjson.loads(orjson.dumps(document, option=_REFUSE))
    except TypeError:
        return copy.deepcopy(document)
    return out


def encode(document: Any) -> bytes:
    """The document's compact JSON text."""
    try:
        return orjson.dumps(document)
    except TypeError:
        return json.dumps(document, separators=(",", ":")).encode()
