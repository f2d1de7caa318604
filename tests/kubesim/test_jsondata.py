"""kubesim's copy of a JSON document (kubesim/jsondata.py) is copy.deepcopy's: equal, of the same types,
sharing nothing mutable, for the captured Spark pods and for what a JSON round trip would change."""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path
from typing import Any

from kubesim.cel import Typed
from kubesim.jsondata import clone, encode

DATA = Path(__file__).resolve().parents[1] / "data" / "spark-4.3"


def same(a: Any, b: Any) -> None:
    """Equal, with the same types at every node, and no dict or list shared."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict):
        assert a is not b and list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert isinstance(a, tuple) or a is not b
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    else:
        assert a == b


def test_a_captured_pod_and_its_review_are_copied_whole() -> None:
    for path in sorted(DATA.glob("*.json")):
        document = json.loads(path.read_text())
        copied = clone(document)
        same(copied, copy.deepcopy(document))
        same(copied, document)


def test_what_json_would_change_is_copied_as_deepcopy_copies_it() -> None:
    typed = Typed(("Object", "spec"), {"containers": [{"name": "spark"}]})
    document = {
        "tuple": (1, "a"),
        "typed": typed,
        "big": 2**70,
        "when": dt.datetime(2026, 11, 25, tzinfo=dt.UTC),
        "float": 1.0,
        "nested": [{"a": [1, 2.5, None, True, "x"]}],
    }
    copied = clone(document)
    same(copied, copy.deepcopy(document))
    assert copied["typed"].type_path == ("Object", "spec") and copied["typed"] is not typed
    assert clone(typed).type_path == ("Object", "spec")
    assert clone([1, {"a": 1.0}]) == [1, {"a": 1.0}] and type(clone([1.0])[0]) is float


def test_the_encoding_reads_back_as_the_document_and_is_json_dumps_but_for_non_ascii() -> None:
    for path in sorted(DATA.glob("*.json")):
        document = json.loads(path.read_text())
        assert json.loads(encode(document)) == document
        assert encode(document) == json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
    odd = {"name": "exécuteur-✓", "big": 2**70, 1: "a key that is not a string"}
    assert json.loads(encode(odd)) == {"name": "exécuteur-✓", "big": 2**70, "1": "a key that is not a string"}
