"""The resources kubesim serves, with the identity the official client expects for each."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resource:
    plural: str
    kind: str
    group: str
    version: str
    namespaced: bool
    short_names: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def describe(self) -> dict[str, object]:
        """The entry in an APIResourceList (discovery)."""
        return {
            "name": self.plural,
            "singularName": self.kind.lower(),
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            "shortNames": list(self.short_names),
        }


RESOURCES: dict[str, Resource] = {
    r.plural: r
    for r in (
        Resource("namespaces", "Namespace", "", "v1", False, ("ns",)),
        Resource("pods", "Pod", "", "v1", True, ("po",)),
        Resource("configmaps", "ConfigMap", "", "v1", True, ("cm",)),
        Resource("secrets", "Secret", "", "v1", True),
        Resource("events", "Event", "", "v1", True, ("ev",)),
        Resource("nodes", "Node", "", "v1", False, ("no",)),
        Resource("serviceaccounts", "ServiceAccount", "", "v1", True, ("sa",)),
        Resource("resourcequotas", "ResourceQuota", "", "v1", True, ("quota",)),
        Resource("limitranges", "LimitRange", "", "v1", True, ("limits",)),
        Resource("leases", "Lease", "coordination.k8s.io", "v1", True),
        Resource("priorityclasses", "PriorityClass", "scheduling.k8s.io", "v1", False, ("pc",)),
        Resource("runtimeclasses", "RuntimeClass", "node.k8s.io", "v1", False),
        Resource(
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
            "admissionregistration.k8s.io",
            "v1",
            False,
        ),
        Resource(
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
            "admissionregistration.k8s.io",
            "v1",
            False,
        ),
        Resource(
            "validatingadmissionpolicies",
            "ValidatingAdmissionPolicy",
            "admissionregistration.k8s.io",
            "v1",
            False,
        ),
        Resource(
            "mutatingadmissionpolicies",
            "MutatingAdmissionPolicy",
            "admissionregistration.k8s.io",
            "v1",
            False,
        ),
        Resource(
            "mutatingadmissionpolicybindings",
            "MutatingAdmissionPolicyBinding",
            "admissionregistration.k8s.io",
            "v1",
            False,
        ),
        Resource(
            "validatingadmissionpolicybindings",
            "ValidatingAdmissionPolicyBinding",
            "admissionregistration.k8s.io",
            "v1",
            False,
        ),
    )
}

# Subresources with their own rules: pods/status and pods/binding.
SUBRESOURCES = {("pods", "status"), ("pods", "binding")}


def groups() -> dict[str, str]:
    """API group → its one version."""
    return {r.group: r.version for r in RESOURCES.values()}
