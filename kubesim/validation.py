"""The object validation of kube-apiserver that a client can trip over: names and labels, and the CEL of a
MutatingAdmissionPolicy.

A name or label that a real cluster refuses must be refused here too, or code that builds names (config
maps named after a Spark app id, labels copied from a policy) passes against kubesim and fails in
production. Rules and messages follow apimachinery's `validation.IsDNS1123Subdomain`, `IsDNS1123Label`,
`IsQualifiedName` and `IsValidLabelValue`
(https://kubernetes.io/docs/concepts/overview/working-with-objects/names/,
https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from . import cel
from .errors import invalid

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(rf"^{_LABEL}$")
_DNS1123_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
    "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
QUALIFIED_MESSAGE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
VALUE_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex "
    "used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


def name_problems(name: str, *, label: bool) -> list[str]:
    """Why `name` is not a valid object name: a DNS-1123 label (namespaces) or subdomain (the rest)."""
    limit, pattern, message = (
        (63, _DNS1123_LABEL, LABEL_MESSAGE) if label else (253, _DNS1123_SUBDOMAIN, SUBDOMAIN_MESSAGE)
    )
    problems = []
    if len(name) > limit:
        problems.append(f"must be no more than {limit} characters")
    if not pattern.match(name):
        problems.append(message)
    return problems


def _key_problems(key: str) -> list[str]:
    prefix, _, name = key.rpartition("/")
    problems = []
    if "/" in key and (not prefix or name_problems(prefix, label=False)):
        problems.append("prefix part " + SUBDOMAIN_MESSAGE)
    if len(name) > 63:
        problems.append("name part must be no more than 63 characters")
    if not _QUALIFIED_NAME.match(name):
        problems.append(QUALIFIED_MESSAGE)
    return problems


def check_metadata(kind: str, obj: Mapping[str, Any], *, namespace_name: bool) -> None:
    """422 Invalid, with kube-apiserver's field paths and messages, for a bad name or label."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    causes: list[tuple[str, str]] = [
        ("metadata.name", f'Invalid value: "{name}": {p}') for p in name_problems(name, label=namespace_name)
    ]
    for key, value in (meta.get("labels") or {}).items():
        causes += [("metadata.labels", f'Invalid value: "{key}": {p}') for p in _key_problems(str(key))]
        text = "" if value is None else str(value)
        if len(text) > 63:
            causes.append(("metadata.labels", f'Invalid value: "{text}": must be no more than 63 characters'))
        if not _LABEL_VALUE.match(text):
            causes.append(("metadata.labels", f'Invalid value: "{text}": {VALUE_MESSAGE}'))
    if causes:
        raise invalid(kind, name, causes)


def check_object(resource: str, kind: str, obj: Mapping[str, Any]) -> None:
    """check_metadata, then the kind's own rules: a MutatingAdmissionPolicy whose expressions do not compile
    or whose enums are unknown is refused at creation (pkg/apis/admissionregistration/validation; measured on
    v1.36.2: `compilation failed: ERROR: ...`, the compiler's message: cel.py `compile`). Syntax only: the
    API server's `object` is `dyn`, so a type error on it is accepted there too and fails at admission."""
    check_metadata(kind, obj, namespace_name=resource == "namespaces")
    if resource != "mutatingadmissionpolicies":
        return
    spec = obj.get("spec") or {}
    causes: list[tuple[str, str]] = []
    expressions = [
        (f"spec.matchConditions[{i}].expression", c) for i, c in enumerate(spec.get("matchConditions") or [])
    ]
    expressions += [(f"spec.variables[{i}].expression", v) for i, v in enumerate(spec.get("variables") or [])]
    for i, mutation in enumerate(spec.get("mutations") or []):
        patch_type = mutation.get("patchType")
        if patch_type not in ("JSONPatch", "ApplyConfiguration"):
            causes.append(
                (
                    f"spec.mutations[{i}].patchType",
                    f'Unsupported value: "{patch_type}": supported values: "ApplyConfiguration", "JSONPatch"',
                )
            )
            continue
        field = "jsonPatch" if patch_type == "JSONPatch" else "applyConfiguration"
        expressions.append((f"spec.mutations[{i}].{field}.expression", mutation.get(field) or {}))
    for path, holder in expressions:
        expression = str(holder.get("expression", ""))
        try:
            cel.compile(expression)
        except cel.CelError as e:
            causes.append((path, f'Invalid value: "{expression}": {e}'))
    for key, allowed in (
        ("failurePolicy", ("Fail", "Ignore")),
        ("reinvocationPolicy", ("IfNeeded", "Never")),
    ):
        value = spec.get(key)
        if value is not None and value not in allowed:
            supported = ", ".join(f'"{a}"' for a in allowed)
            causes.append((f"spec.{key}", f'Unsupported value: "{value}": supported values: {supported}'))
    if causes:
        name = str((obj.get("metadata") or {}).get("name", ""))
        raise invalid(f"{kind}.admissionregistration.k8s.io", name, causes)
