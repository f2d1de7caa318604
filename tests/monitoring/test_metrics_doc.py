"""docs/metrics.md lists exactly the metrics that the code registers, with the same types and labels, each
under its process's section, so the documentation cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "metrics.md"
SECTIONS = {"Webhook": "webhook", "Allocator": "allocator", "Certificate sync": "certs"}
ROW = re.compile(r"^\| `(sparkgate_[a-z_]+)` \| (counter|gauge|histogram) \| ([^|]+) \| (.+) \|$")


def documented() -> list[tuple[str, str, tuple[str, ...], str, str]]:
    """(name, type, labels, component, meaning) of every metric row of the document."""
    rows = []
    section = ""
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        if not line.startswith("| `sparkgate_"):
            continue
        match = ROW.match(line)
        assert match, f"a metric row that does not read `| name | type | labels | meaning |`: {line}"
        name, type_, labels, meaning = match.groups()
        label_names = () if labels.strip() == "—" else tuple(re.findall(r"`([a-z_]+)`", labels))
        assert section in SECTIONS, f"{name} is documented outside the per-process sections ({section})"
        rows.append((name, type_, label_names, SECTIONS[section], meaning.strip()))
    return rows


def test_the_document_lists_exactly_the_registered_metrics(families: list[Any]) -> None:
    rows = documented()
    names = [row[0] for row in rows]
    assert len(names) == len(set(names)), "a metric documented twice"
    in_code = {(f.name, f.type, f.labels, f.component) for f in families}
    in_doc = {row[:4] for row in rows}
    assert in_doc - in_code == set(), "documented but not in the code (or with other type/labels)"
    assert in_code - in_doc == set(), "in the code but not documented (or with other type/labels)"


def test_every_label_is_explained(families: list[Any]) -> None:
    for name, _type, labels, _component, meaning in documented():
        assert len(meaning) > 20, name
        for label in labels:
            assert f"`{label}`" in meaning, f"{name}: the meaning does not say what `{label}` is"
