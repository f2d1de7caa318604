"""Label and field selectors, parsed as kube-apiserver parses the query parameters.

Label selectors: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, joined by commas
(https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors).
Field selectors: `=`, `==`, `!=` on the fields kubesim indexes (metadata.name, metadata.namespace,
spec.nodeName, spec.schedulerName, status.phase: a subset of the pod's in pkg/registry/core/pod/strategy.go
`ToSelectableFields`); any other field is refused with 400 as the real server refuses fields it does not
support for a resource.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, str]], bool]

FIELDS = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "spec.nodeName": ("spec", "nodeName"),
    "spec.schedulerName": ("spec", "schedulerName"),  # docs/install.md's uninstall with components/scheduler
    "status.phase": ("status", "phase"),
}

_SET = re.compile(r"^\s*(!?)\s*([A-Za-z0-9./_-]+)\s*(?:\s(in|notin)\s*\(([^)]*)\))?\s*$")
_EQ = re.compile(r"^\s*([A-Za-z0-9./_-]+)\s*(==|=|!=)\s*([A-Za-z0-9._-]*)\s*$")


class SelectorError(ValueError):
    pass


def _split(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p for p in parts if p.strip()]


def _requirement(text: str) -> Predicate:
    eq = _EQ.match(text)
    if eq:
        key, op, value = eq.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    st = _SET.match(text)
    if not st:
        raise SelectorError(f"unable to parse requirement: {text.strip()!r}")
    negated, key, op, values = st.groups()
    if op is None:
        if negated:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    if negated:
        raise SelectorError(f"unable to parse requirement: {text.strip()!r}")
    allowed = {v.strip() for v in values.split(",") if v.strip()}
    if op == "in":
        return lambda labels: labels.get(key) in allowed
    return lambda labels: labels.get(key) not in allowed


def label_selector(text: str | None) -> Predicate:
    if not text:
        return lambda labels: True
    requirements = [_requirement(part) for part in _split(text)]
    return lambda labels: all(r(labels) for r in requirements)


def field_selector(text: str | None) -> Callable[[dict[str, Any]], bool]:
    if not text:
        return lambda obj: True
    checks: list[tuple[tuple[str, str], str, str]] = []
    for part in _split(text):
        m = _EQ.match(part)
        if not m:
            raise SelectorError(f"invalid field selector: {part.strip()!r}")
        field, op, value = m.groups()
        if field not in FIELDS:
            raise SelectorError(f'field label not supported: "{field}"')
        checks.append((FIELDS[field], op, value))

    def matches(obj: dict[str, Any]) -> bool:
        for (section, key), op, value in checks:
            actual = (obj.get(section) or {}).get(key) or ""
            if (actual == value) != (op != "!="):
                return False
        return True

    return matches


def match_label_selector_object(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector object (matchLabels, matchExpressions); None or {} matches everything."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), set(expr.get("values") or [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True
