"""sparkgate installed on kubesim, on one machine: the demo, the tests, the benchmarks all start it here.

    with LocalSystem(policy, workdir, nodes=4) as system:
        system.cluster        # kubesim.Cluster: the API server, scheduler, kubelets, Spark drivers
        system.webhook        # the real `sparkgate webhook` (gunicorn, TLS), registered as the manifests do
        system.allocator      # the real `sparkgate allocator` process, with the allocator's service account

The gate is protected as the base install protects it, by the ValidatingAdmissionPolicies of
manifests/base/gate-policy.yaml (read from the repository), whose match conditions skip the allocator's own
updates: a gate removal costs no admission call. `gate_protection="webhook"` registers the validating
webhook of components/validating-webhook instead (clusters older than 1.30, `webhook_configurations`'
second), which is called at every release (~15 % of the roomy demo's fill time).

`LocalSystem(..., sparkgate=False)` is the same cluster with nothing installed: the baseline.
`LocalSystem(..., admission="policy")` installs sparkgate without the webhook, as
manifests/components/admission-policy does: the allocator applies the MutatingAdmissionPolicy rendered from
the policy (`--admission policy`), and the system is started once its binding is in the store. The webhook
configurations are those of manifests/base/webhooks.yaml (objectSelector spark-role=executor, the system
namespaces excluded, the policy probe's dry runs excluded by a matchCondition, failurePolicy Ignore), with a loopback URL instead of the Service and a longer
timeout: WEBHOOK_TIMEOUT, 30 s, the API server's maximum. Here the API server, the
scheduler, the kubelets and the drivers share one machine, often a busy one, with the webhook: a slow
admission call measures that machine, not sparkgate, and under failurePolicy Ignore it would silently admit
an executor without its gate, which the tests, the demo's "admitted without sparkgate" count and the
benchmarks would all report as sparkgate's doing. A webhook that is down still fails at once (connection
refused). The shipped configurations keep their short timeouts (manifests/base/webhooks.yaml).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from kubesim.cluster import Cluster
from sandbox.local_webhook import LocalWebhook, free_port
from sparkgate import contract
from sparkgate.probe import MATCH_CONDITION

WEBHOOK_TIMEOUT = 30  # seconds: the longest the API server allows (see the module docstring)
GATE_POLICY = Path(__file__).resolve().parents[1] / "manifests" / "base" / "gate-policy.yaml"
# The tests' lease (duration, renew deadline, retry period), sized for a busy 2-core machine where kubesim,
# the drivers and the tests share the CPUs (docs/architecture.md "Leadership" has the rules):
# - the leader renews every 0.5 s and exits once no renew has succeeded for 4.5 s: kubesim may stall for
#   about 4 s (4.5 - 0.5) without ending the only allocator of a test (a 1.5 s deadline did, in CI); each
#   Lease request may take 2.25 s (half the renew deadline);
# - each of the leader's writes is bounded by (6 - 4.5) / 2 = 0.75 s (was 0.25 s): a slower one is given up
#   and its outcome left to the watch (allocator/actor.py "unclear");
# - a replica that replaces a killed one (kill -9: no release) takes over 6 s after it last saw the Lease
#   change (its first read, when started after the kill), at a turn of its own (0.5 s apart): the price of
#   every fail-over test that kills its leader. A graceful stop releases the Lease: the follower takes it at
#   its next turn.
# The demo's runs use the allocator's defaults (None): 15 / 10 / 2 s.
FAST_LEASE = (6.0, 4.5, 0.5)


def webhook_configurations(
    url: str, ca_pem: bytes, *, timeout_seconds: int = WEBHOOK_TIMEOUT, failure_policy: str = "Ignore"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The mutating (executor CREATE) and the gate-protecting validating (pod UPDATE) configurations,
    calling the webhook with `timeout_seconds` (the API server accepts 1 to 30)."""
    ca = base64.b64encode(ca_pem).decode()
    common: dict[str, Any] = {
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": failure_policy,
        "timeoutSeconds": timeout_seconds,
        "objectSelector": {"matchLabels": {contract.LABEL_ROLE: contract.ROLE_EXECUTOR}},
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["kube-system", contract.INSTALL_NAMESPACE],
                }
            ]
        },
    }

    def rule(operation: str) -> list[dict[str, Any]]:
        return [{"operations": [operation], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]

    mutating = {
        "metadata": {"name": "sparkgate"},
        "webhooks": [
            {
                "name": "executors.sparkgate.io",
                "clientConfig": {"url": f"{url}/mutate", "caBundle": ca},
                "rules": rule("CREATE"),
                "reinvocationPolicy": "Never",
                "matchConditions": [MATCH_CONDITION],
                **common,
            }
        ],
    }
    validating = {
        "metadata": {"name": "sparkgate"},
        "webhooks": [
            {
                "name": "gate.sparkgate.io",
                "clientConfig": {"url": f"{url}/validate", "caBundle": ca},
                "rules": rule("UPDATE"),
                **common,
            }
        ],
    }
    return mutating, validating


def lease_holder(cluster: Cluster, lease: str = contract.ALLOCATOR_LEASE) -> str | None:
    """Who holds the allocator's Lease now (None when nobody does)."""
    leases, _, _ = cluster.store.list_objects("leases", contract.INSTALL_NAMESPACE)
    for obj in leases:
        if obj["metadata"]["name"] == lease:
            holder: str | None = (obj.get("spec") or {}).get("holderIdentity") or None
            return holder
    return None


class AllocatorProcess:
    """`sparkgate allocator` in its own process group (kill takes all of it), as the allocator's service
    account (a token bound to a pod named `identity`), serving /metrics and /apps on a loopback port, without certificate rotation.
    `lease`: (lease duration, renew deadline, retry period), FAST_LEASE by default; None, the allocator's own
    defaults."""

    def __init__(
        self,
        cluster: Cluster,
        policy: Path,
        workdir: Path,
        identity: str = "alloc-1",
        *,
        tick: float = 0.5,
        lease: tuple[float, float, float] | None = FAST_LEASE,
        log_level: str = "info",
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.identity = identity
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"allocator-{identity}.log"
        # The service account's token bound to this replica's pod, as in a cluster: the API server's request
        # log tells the replicas apart (kubesim/faults.py `LoggedRequest.pod`).
        kubeconfig = cluster.add_user(contract.ALLOCATOR_USER, ["system:serviceaccounts"], pod=identity)
        args = [
            sys.executable, "-m", "sparkgate.cli", "allocator",
            "--kubeconfig", str(kubeconfig), "--policy", str(policy), "--namespace", contract.INSTALL_NAMESPACE,
            "--http", f"127.0.0.1:{self.port}", "--lease-name", contract.ALLOCATOR_LEASE, "--identity", identity,
            "--tick", str(tick), "--log-level", log_level,
            # The local webhook brings its own certificate: rotation here would inject another CA.
            "--no-certs", *extra_args,
        ]  # fmt: skip
        if lease is not None:
            for flag, value in zip(
                ("--lease-duration", "--renew-deadline", "--retry-period"), lease, strict=True
            ):
                args += [flag, str(value)]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def get(self, path: str) -> tuple[int, str]:
        """(status, body); (0, the error) when no answer came: refused (the process is not listening yet,
        or has died) or none within 30 s (a safety net: a busy machine may pause everything for seconds).
        So a `wait_for` predicate testing the status sees False instead of raising (the allocator may not
        listen yet); helpers that need a 200 (`apps()`, the tests' own) raise with the error: once the
        allocator served, no answer means it died or hung for 30 s, the failure itself, which waiting
        longer would only hide behind a timeout."""
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:  # URLError, ConnectionError, TimeoutError
            return 0, f"no answer from {self.url}{path}: {e}"

    def apps(self) -> dict[str, Any]:
        code, body = self.get("/apps")
        if code != 200:
            raise RuntimeError(f"/apps answered {code}: {body[:200]}")
        document: dict[str, Any] = json.loads(body)
        return document

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


class LocalSystem:
    def __init__(
        self,
        policy: Path,
        workdir: Path,
        *,
        sparkgate: bool = True,
        namespaces: tuple[str, ...] = ("spark",),
        allocator_tick: float = 0.5,
        allocator_log_level: str = "info",
        allocator_lease: tuple[float, float, float] | None = FAST_LEASE,
        admission: str = "webhook",
        gate_protection: str = "policy",
        **cluster_options: Any,
    ) -> None:
        self.policy = policy
        self.workdir = workdir
        self.sparkgate = sparkgate
        self.namespaces = namespaces
        self.allocator_tick = allocator_tick
        self.allocator_log_level = allocator_log_level
        self.allocator_lease = allocator_lease
        self.admission = admission
        self.gate_protection = gate_protection
        self.cluster = Cluster(**cluster_options)
        self.webhook: LocalWebhook | None = None
        self.allocator: AllocatorProcess | None = None

    def start(self) -> LocalSystem:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.cluster.start()
            for namespace in self.namespaces:
                self.cluster.add_namespace(namespace)
            if self.sparkgate and self.admission == "policy":
                self.allocator = AllocatorProcess(
                    self.cluster,
                    self.policy,
                    self.workdir,
                    tick=self.allocator_tick,
                    log_level=self.allocator_log_level,
                    lease=self.allocator_lease,
                    extra_args=("--admission", "policy"),
                )
                self.cluster.wait_for(
                    lambda: bool(self.cluster.store.list_objects("mutatingadmissionpolicybindings")[0]),
                    timeout=60,
                    what="the allocator to apply the rendered MutatingAdmissionPolicy and its binding",
                )
            elif self.sparkgate:
                self.webhook = LocalWebhook(
                    self.policy, self.workdir / "webhook", allocator_users=(contract.ALLOCATOR_USER,)
                )
                self.webhook.start()
                mutating, validating = webhook_configurations(self.webhook.url, self.webhook.ca_pem)
                self.cluster.store.create("mutatingwebhookconfigurations", mutating)
                if self.gate_protection == "webhook":
                    self.cluster.store.create("validatingwebhookconfigurations", validating)
                else:
                    for document in yaml.safe_load_all(GATE_POLICY.read_text()):
                        resource = f"{document['kind'].lower()}s".replace("policys", "policies")
                        self.cluster.store.create(resource, document)
                self.allocator = AllocatorProcess(
                    self.cluster,
                    self.policy,
                    self.workdir,
                    tick=self.allocator_tick,
                    log_level=self.allocator_log_level,
                    lease=self.allocator_lease,
                )
                self.cluster.wait_for(
                    lambda: lease_holder(self.cluster) is not None,
                    timeout=60,
                    what="the allocator to take its lease",
                )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.allocator is not None:
            self.allocator.stop()
        if self.webhook is not None:
            self.webhook.stop()
        self.cluster.stop()

    def __enter__(self) -> LocalSystem:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
