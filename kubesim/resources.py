"""The resources kubesim serves, with the identity the official client expects for each.

Most are built into kube-apiserver and always served. A `crd` resource is a CustomResourceDefinition's: a
store serves it only once it is installed (`Store.install`), as a real cluster serves
`autoscaling.x-k8s.io/v1` ProvisioningRequests only where cluster-autoscaler's CRD was applied; until then
its group is absent from discovery and its paths answer 404.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Resource:
    plural: str
    kind: str
    group: str
    version: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    crd: bool = False

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

    def describe_subresource(self, sub: str) -> dict[str, object]:
        """The APIResourceList entry of a subresource (`pods/status`: get, patch, update)."""
        verbs = ["create"] if sub == "binding" else ["get", "patch", "update"]
        return {"name": f"{self.plural}/{sub}", "singularName": "", "namespaced": self.namespaced,
                "kind": "Binding" if sub == "binding" else self.kind, "verbs": verbs}  # fmt: skip


RESOURCES: dict[str, Resource] = {
    r.plural: r
    for r in (
        Resource("namespaces", "Namespace", "", "v1", False, ("ns",)),
        Resource("pods", "Pod", "", "v1", True, ("po",)),
        Resource("configmaps", "ConfigMap", "", "v1", True, ("cm",)),
        Resource("podtemplates", "PodTemplate", "", "v1", True),
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
        # cluster-autoscaler's CRD (apis/config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml).
        Resource(
            "provisioningrequests",
            "ProvisioningRequest",
            "autoscaling.x-k8s.io",
            "v1",
            True,
            ("provreq", "provreqs"),
            crd=True,
        ),
    )
}

# Subresources with their own rules: pods/status and pods/binding, and the CRD's status subresource.
SUBRESOURCES = {("pods", "status"), ("pods", "binding"), ("provisioningrequests", "status")}

# What a store serves before any CRD is installed.
BUILT_IN = frozenset(plural for plural, r in RESOURCES.items() if not r.crd)


def groups(served: Iterable[str] = BUILT_IN) -> dict[str, str]:
    """API group → its one version, among the `served` resources."""
    return {RESOURCES[p].group: RESOURCES[p].version for p in served}
