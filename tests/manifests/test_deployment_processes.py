"""The processes the rendered Deployment declares, run as its pod would run them, against kubesim.

Nothing about the processes is restated here: the init containers and containers, their args (after the
image's ENTRYPOINT, read from the Dockerfile) and their environment come from `manifests/` rendered by
tests/manifests/kustomize.py. This test plays the kubelet only: it resolves `fieldRef`s, maps each volume
mount to a local directory (the policy ConfigMap's files, the certificate Secret's items, swapped in all at
once whenever the Secret changes, as the kubelet does for a Secret volume), gives the containers that mount
the API token a kubeconfig for the pod's service account, gives each container port a free loopback port,
runs the init containers to completion and then starts the containers. The one configuration it adds, as
an overlay would, is short certificate lifetimes (seconds instead of days) and cycle; and the webhook
configurations are registered with the longest timeout (conftest.PATIENT_TIMEOUT_SECONDS), so that a busy
machine cannot turn a slow admission into a silent bypass.

Then, with executor pods created at a steady rate through the API server (admitted by the webhook over TLS
verified against the injected caBundle for the Service's DNS name, as kube-apiserver does): the serving
certificate is renewed and the CA rolled over, by the allocator process alone, with 0 failed or bypassed
admissions; and a caBundle blanked by a `kubectl replace` of the webhook configuration is repaired by the
next cycle, counted by `sparkgate_certs_ca_bundle_repairs_total`.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kubesim.cluster import Cluster
from sandbox.local_webhook import free_port
from sparkgate import contract
from sparkgate.kube import Kube, KubeError

REPO = Path(__file__).resolve().parents[2]
POD = "sparkgate-5d8f7c9b4-x2x7k"
# The pod's network, on one machine: where a container listens when the manifest leaves its program's default
# (0.0.0.0:<containerPort>) in place.
LISTEN = {"allocator": "SPARKGATE_ALLOCATOR_HTTP"}
SHORT = {  # what an overlay would set to make rotation happen within the test
    "SPARKGATE_CA_LIFETIME": "40s",
    "SPARKGATE_CA_RENEW_BEFORE": "30s",  # a new CA staged 10 s after each CA is made
    "SPARKGATE_SERVING_LIFETIME": "20s",
    "SPARKGATE_SERVING_RENEW_BEFORE": "12s",  # the serving certificate renewed 8 s after it is made
    # Old and new CA both trusted for 5 s around a switch: switch 5 s after the staging (overlap), drop 5 s
    # after the switch (keep previous). It is the time the Secret-volume sync thread below and the webhook (which checks its files on
    # every connection) have to serve the new certificate before the old CA leaves the caBundle; a webhook
    # still serving a certificate of a dropped CA is a silent bypass under failurePolicy Ignore, and a busy
    # machine can stall this process's threads for a few seconds. It stays below the 8 s between serving
    # renewals (a renewal restarts the wait for the drop) and the 10 s between stagings (a due switch
    # comes before the drop).
    "SPARKGATE_CA_OVERLAP": "5s",
    "SPARKGATE_CA_KEEP_PREVIOUS": "5s",
    "SPARKGATE_CERTS_INTERVAL": "0.5",
}
Obj = dict[str, Any]


def entrypoint() -> list[str]:
    """The image's ENTRYPOINT, as the local command that runs it (the `sparkgate` console script)."""
    match = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    assert match, "the Dockerfile has an exec-form ENTRYPOINT"
    assert json.loads(match.group(1)) == ["sparkgate"]
    return [sys.executable, "-m", "sparkgate.cli"]


class Kubelet:
    """Runs one pod of the rendered Deployment on this machine."""

    def __init__(
        self,
        cluster: Cluster,
        objects: dict[tuple[str, str], Obj],
        root: Path,
        secret_volume: Callable[[Path, dict[str, bytes]], None],
    ) -> None:
        self.cluster = cluster
        self.secret_volume = secret_volume
        self.objects = objects
        self.root = root
        self.spec: Obj = objects[("Deployment", "sparkgate")]["spec"]["template"]["spec"]
        self.volumes = {v["name"]: v for v in self.spec["volumes"]}
        self.ports: dict[str, int] = {}  # container port name -> local port
        self.processes: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.user = f"system:serviceaccount:{contract.INSTALL_NAMESPACE}:{self.spec['serviceAccountName']}"
        self.kubeconfig = cluster.add_user(self.user)
        self._secret_changed = threading.Condition()
        self._stop = threading.Event()
        self._synced_rv = ""
        self._volume_thread = threading.Thread(target=self._sync_secret_volumes, daemon=True)
        self._unsubscribe = cluster.store.subscribe(self._on_change)

    # --- volumes -----------------------------------------------------------------------------------------

    def home(self) -> Path:
        """A HOME nothing can be written under, as in the image: its user has none (/nonexistent) on a
        read-only root. This test runs as root, for whom no directory is read-only, so HOME lies below a
        regular file: creating anything there fails (ENOTDIR) as it does in the container (EROFS)."""
        blocker = self.root / "read-only-root"
        blocker.touch()
        return blocker / "nonexistent"

    def _local(self, container: Obj, mount: Obj) -> Path:
        return self.root / container["name"] / mount["name"]

    def _prepare(self, container: Obj) -> None:
        for mount in container.get("volumeMounts") or []:
            volume = self.volumes[mount["name"]]
            path = self._local(container, mount)
            path.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                config = self.objects[("ConfigMap", volume["configMap"]["name"])]
                for key, text in config["data"].items():
                    (path / key).write_text(text)

    def _on_change(self, kind: str, resource: str, obj: Obj) -> None:
        if resource == "secrets":
            with self._secret_changed:
                self._secret_changed.notify_all()

    def _sync_secret_volumes(self) -> None:
        while not self._stop.is_set():
            self.sync_secret_volumes()
            with self._secret_changed:
                self._secret_changed.wait(0.5)

    def sync_secret_volumes(self) -> None:
        """Swap the Secret's items into every container that mounts it, all at once when they changed."""
        for container in self.spec["containers"]:
            for mount in container.get("volumeMounts") or []:
                source = self.volumes[mount["name"]].get("secret")
                if source is None:
                    continue
                try:
                    secret = self.cluster.store.get(
                        "secrets", contract.INSTALL_NAMESPACE, source["secretName"]
                    )
                except Exception:
                    continue  # optional: true, not there yet
                self.secret_volume(
                    self._local(container, mount),
                    {i["path"]: base64.b64decode(secret["data"][i["key"]]) for i in source["items"]},
                )

    # --- processes ---------------------------------------------------------------------------------------

    def environment(self, container: Obj, extra: dict[str, str]) -> dict[str, str]:
        env = {"PATH": os.environ["PATH"], "HOME": str(self.home())}
        mounts = {m["mountPath"]: self._local(container, m) for m in container.get("volumeMounts") or []}
        for entry in container.get("env") or []:
            if "value" in entry:
                value = entry["value"]
            else:
                field = entry["valueFrom"]["fieldRef"]["fieldPath"]
                value = {"metadata.namespace": contract.INSTALL_NAMESPACE, "metadata.name": POD}[field]
            for mount_path in sorted(
                mounts, key=len, reverse=True
            ):  # a path in a volume: its local directory
                if value == mount_path or value.startswith(mount_path + "/"):
                    value = str(mounts[mount_path]) + value[len(mount_path) :]
                    break
            for port in container.get("ports") or []:  # the pod's network: a free loopback port
                if value == f"0.0.0.0:{port['containerPort']}":
                    value = f"127.0.0.1:{self.ports[port['name']]}"
            env[entry["name"]] = value
        if "/var/run/secrets/kubernetes.io/serviceaccount" in mounts:
            env["KUBECONFIG"] = str(self.kubeconfig)  # the projected token, for kubesim
        if container["name"] in LISTEN:
            (port,) = container["ports"]
            env.setdefault(LISTEN[container["name"]], f"127.0.0.1:{self.ports[port['name']]}")
        return {**env, **extra}

    def run_init_containers(self, extra: dict[str, dict[str, str]]) -> None:
        for container in self.spec.get("initContainers") or []:
            self._prepare(container)
            done = subprocess.run(
                [*entrypoint(), *container["args"]],
                env=self.environment(container, extra.get(container["name"], {})),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=120,
            )
            (self.root / f"{container['name']}.log").write_bytes(done.stdout)
            assert done.returncode == 0, done.stdout

    def start_containers(self, extra: dict[str, dict[str, str]]) -> None:
        for container in self.spec["containers"]:
            for port in container.get("ports") or []:
                self.ports[port["name"]] = free_port()
            self._prepare(container)
        self.sync_secret_volumes()
        self._volume_thread.start()
        for container in self.spec["containers"]:
            log = open(self.root / f"{container['name']}.log", "ab")  # noqa: SIM115 - closed by the process
            process = subprocess.Popen(
                [*entrypoint(), *container["args"]],
                env=self.environment(container, extra.get(container["name"], {})),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()
            self.processes.append((container["name"], process))

    def logs(self) -> str:
        return "\n".join(
            f"--- {name}\n{(self.root / f'{name}.log').read_text()[-4000:]}" for name, _ in self.processes
        )

    def stop(self) -> None:
        self._stop.set()
        self._unsubscribe()
        for _, process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for _, process in self.processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


def metric(port: int, name: str, labels: str = "") -> float:
    """The sum of the samples of `name` whose labels include `labels` (e.g. 'step="create"')."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample.partition("{")[0] == name and labels in sample:
            total += float(value)
    return total


@pytest.fixture
def pod(
    kustomize: ModuleType,
    tmp_path: Path,
    patient_webhook: Callable[[Obj], Obj],
    secret_volume: Callable[[Path, dict[str, bytes]], None],
) -> Iterator[tuple[Kubelet, Cluster]]:
    objects = kustomize.by_kind(kustomize.build(REPO / "manifests"))
    for key, config in objects.items():  # what the test registers, and re-applies later
        if key[0].endswith("WebhookConfiguration"):
            objects[key] = patient_webhook(config)
    with Cluster(nodes=1, namespaces=("default", "kube-system", "sparkgate-system", "spark-jobs")) as cluster:
        # The base installs the mutating webhook only (gate protection is a ValidatingAdmissionPolicy).
        for (kind, _), config in objects.items():
            if kind.endswith("WebhookConfiguration"):
                cluster.store.create(f"{kind.lower()}s", copy.deepcopy(config))
        kubelet = Kubelet(cluster, objects, tmp_path, secret_volume)
        try:
            yield kubelet, cluster
        finally:
            kubelet.stop()


def test_the_deployments_processes_rotate_certificates_and_repair_a_blanked_ca_bundle(
    pod: tuple[Kubelet, Cluster], executors: Any
) -> None:
    kubelet, cluster = pod
    # certs sync --once: the Secret exists, caBundle injected
    kubelet.run_init_containers({"certs": SHORT})
    assert cluster.store.get("secrets", contract.INSTALL_NAMESPACE, contract.CERT_SECRET)["data"]
    kubelet.start_containers({"allocator": SHORT})
    allocator_port = kubelet.ports["allocator"]
    cluster.register_service(
        contract.INSTALL_NAMESPACE, contract.WEBHOOK_SERVICE, f"https://127.0.0.1:{kubelet.ports['webhook']}"
    )

    spark = Kube.from_kubeconfig(str(cluster.add_user("system:serviceaccount:spark-jobs:spark")))
    results: list[bool] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def stream() -> None:
        i = 0
        while not stop.wait(0.1):
            i += 1
            try:
                created = spark.create(
                    "/api/v1/namespaces/spark-jobs/pods", executors.pod(f"stream-exec-{i}")
                )
            except KubeError as e:
                errors.append(e)
                return
            results.append(executors.admitted(created))
            cluster.notify()

    def steps(step: str) -> float:
        return metric(allocator_port, "sparkgate_certs_steps_total", f'step="{step}"')

    try:
        for url in (f"https://127.0.0.1:{kubelet.ports['webhook']}", f"http://127.0.0.1:{allocator_port}"):
            cluster.wait_for(lambda u=url: _answers(u, "/readyz"), timeout=60, what=f"{url}/readyz")
        thread = threading.Thread(target=stream, name="pod-stream")
        thread.start()
        try:
            cluster.wait_for(
                lambda: (
                    bool(errors)
                    or (
                        steps("renew-serving") >= 1
                        and steps("switch-ca") >= 1
                        and steps("drop-previous-ca") >= 1
                        and len(results) >= 20
                    )
                ),
                timeout=180,
                what="a serving certificate renewal and a whole CA rollover",
            )
        finally:
            stop.set()
            thread.join(timeout=60)
        assert not errors, errors
        assert results and all(results), (
            f"{results.count(False)} of {len(results)} pods not admitted by sparkgate"
        )

        # A `kubectl replace` of the mutating configuration from the manifests: caBundle blank.
        store = cluster.store
        current = store.get("mutatingwebhookconfigurations", None, "sparkgate")
        reapplied = copy.deepcopy(kubelet.objects[("MutatingWebhookConfiguration", "sparkgate")])
        reapplied["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        mark = len(cluster.requests.entries())
        store.replace("mutatingwebhookconfigurations", None, "sparkgate", reapplied)

        def repaired() -> bool:
            config = store.get("mutatingwebhookconfigurations", None, "sparkgate")
            return all(w["clientConfig"].get("caBundle") for w in config["webhooks"])

        cluster.wait_for(repaired, timeout=60, what="the blanked caBundle repaired")
        # Within one cycle: the configuration's reads from the blank to the repair are those of the cycle under
        # way when it was blanked (it may have read before) and of the next one, which repairs.
        verbs = [
            e.verb
            for e in cluster.requests.entries()[mark:]
            if e.resource == "mutatingwebhookconfigurations" and e.user == kubelet.user
        ]
        assert "update" in verbs and verbs.index("update") <= 2, verbs
        cluster.wait_for(
            lambda: metric(allocator_port, "sparkgate_certs_ca_bundle_repairs_total") >= 1,
            timeout=30,
            what="the repair counted",
        )
        assert metric(allocator_port, "sparkgate_certs_syncs_total", 'result="error"') == 0
        assert executors.admitted(
            spark.create("/api/v1/namespaces/spark-jobs/pods", executors.pod("after-1"))
        )
        lease = store.get("leases", contract.INSTALL_NAMESPACE, contract.CERTS_LEASE)
        assert lease["spec"]["holderIdentity"] == POD
        assert _answers(f"http://127.0.0.1:{allocator_port}", "/healthz")
    finally:
        spark.close()
    assert all(process.poll() is None for _, process in kubelet.processes), kubelet.logs()


def _answers(base: str, path: str) -> bool:
    unverified = ssl.create_default_context()
    unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"{base}{path}", timeout=5, context=unverified) as r:
            return r.status == 200
    except OSError:
        return False


def test_the_shipped_install_starts_with_quiet_logs(pod: tuple[Kubelet, Cluster]) -> None:
    """The base install, started as the image runs it: the certs init container, the webhook under gunicorn
    (no control socket error on its read-only root) and the allocator through several certificate cycles
    log no error and no warning (the validating webhook configuration it does not install is no news)."""
    kubelet, cluster = pod
    assert not [k for k in kubelet.objects if k[0] == "ValidatingWebhookConfiguration"]
    kubelet.run_init_containers({})
    kubelet.start_containers({"allocator": {"SPARKGATE_CERTS_INTERVAL": "0.5"}})
    allocator_port = kubelet.ports["allocator"]
    for url in (f"https://127.0.0.1:{kubelet.ports['webhook']}", f"http://127.0.0.1:{allocator_port}"):
        cluster.wait_for(lambda u=url: _answers(u, "/readyz"), timeout=60, what=f"{url}/readyz")
    cluster.wait_for(
        lambda: metric(allocator_port, "sparkgate_certs_syncs_total", 'result="ok"') >= 3,
        timeout=60,
        what="three certificate cycles",
    )
    assert all(process.poll() is None for _, process in kubelet.processes), kubelet.logs()
    logs = {name: (kubelet.root / f"{name}.log").read_text() for name in ("certs", "webhook", "allocator")}
    assert "Booting worker" in logs["webhook"] and "certs sync: " in logs["certs"]
    noisy = [
        f"{name}: {line}"
        for name, text in logs.items()
        for line in text.splitlines()
        if re.search(r"\[(ERROR|WARNING)\]|\b(ERROR|WARNING)\b|warning:|Traceback|not found", line)
    ]
    assert noisy == []
    assert not kubelet.home().parent.is_dir()  # nothing tried to live under HOME and got through
