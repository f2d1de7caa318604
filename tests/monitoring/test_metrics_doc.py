"""docs/metrics.md lists exactly the metrics that the code registers, with the same types and labels, each
under its process's section, so the documentation cannot drift from the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "metrics.md"
OPERATIONS = REPO / "docs" / "operations.md"
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


def meaning(name: str) -> str:
    return next(row[4] for row in documented() if row[0] == name)


def reading_replicas() -> str:
    """The "Several replicas" rule of "Reading them"."""
    text = DOC.read_text()
    start = text.index("- **Several replicas.**")
    return text[start : text.index("\n- **", start + 1)]


def test_the_replica_rule_places_every_allocator_histogram(families: list[Any]) -> None:
    """Which replicas observe a histogram decides how to read it: the rule names each one."""
    rule = reading_replicas()
    for family in families:
        if family.component == "allocator" and family.type == "histogram":
            short = family.name.removeprefix("sparkgate_allocator")
            assert f"`{short}`" in rule or f"`{family.name}`" in rule, family.name


def test_a_counter_every_replica_counts_is_read_with_max(panel_queries: list[Any]) -> None:
    """A counter every replica increments for the same event (documented so in its row, and named in the
    replica rule) is summed once per replica: the dashboard takes the max over the replicas."""
    every = [row[0] for row in documented() if "Counted by every replica" in row[4]]
    assert every == ["sparkgate_allocator_apps_ended_total"]
    for name in every:
        assert f"`{name}`" in reading_replicas()
        queries = [q.expr for q in panel_queries if name in q.expr]
        assert queries, name
        for expr in queries:
            assert re.search(rf"\bmax by \([^)]*\) \((rate|increase)\({name}\b", expr), expr
            assert not re.search(rf"\bsum\b[^{{]*\b{name}\b", expr), expr


def reflector_names() -> list[str]:
    """The allocator's watches: the name of every Reflector that allocator/commands.py builds."""
    tree = ast.parse((REPO / "allocator" / "commands.py").read_text())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Reflector":
            name = node.args[1]
            assert isinstance(name, ast.Constant) and isinstance(name.value, str)
            names.append(name.value)
    return names


def test_the_watches_documented_are_the_allocators(families: list[Any]) -> None:
    watches = reflector_names()
    assert "nodes" in watches and len(watches) == len(set(watches))
    row = meaning("sparkgate_allocator_watch_restarts_total")
    listed = row[row.index("`watch`:") : row.index("`cause`:")]
    assert set(re.findall(r"`([a-z]+)`", listed)) - {"watch"} == set(watches)
    runbook = OPERATIONS.read_text()
    entry = runbook[runbook.index("### SparkgateWatchRestartStorm") :]
    means = entry[: entry.index("\n\n", entry.index("**Means:**"))]
    for watch in watches:
        assert re.search(rf"\b{watch}\b", means), f"the runbook's watches lack {watch}"


def test_the_gate_wait_says_where_it_starts() -> None:
    """Its start is the pod's creationTimestamp (allocator/cache.py), which the API server writes in whole
    seconds: the row says so, and what it does to the short buckets."""
    row = meaning("sparkgate_allocator_gate_wait_seconds")
    assert "`creationTimestamp`" in row and "whole seconds" in row and "up to 1 s" in row
