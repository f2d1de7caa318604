"""kubesim fixtures: a bare store, a bare API server over it (with a kubeconfig and an official-client
ApiClient), and a running cluster with an ApiClient for it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from kubesim.apiserver import ADMIN, ApiServer
from kubesim.cluster import Cluster
from kubesim.kubeconfig import write_kubeconfig
from kubesim.store import Store


@pytest.fixture
def store() -> Store:
    """A store with the namespaces "default" and "spark"."""
    s = Store(compaction_window=1000)
    for name in ("default", "spark"):
        s.create("namespaces", {"metadata": {"name": name}})
    return s


@dataclass
class Served:
    server: ApiServer
    kubeconfig: Path
    client: client.ApiClient

    @property
    def store(self) -> Store:
        return self.server.store


@pytest.fixture
def apiserver(store: Store, tmp_path: Path) -> Iterator[Served]:
    """An ApiServer over `store` alone (no scheduler, no kubelets, no admission), user "admin" with token
    "admin-token", bookmarks every 0.2 s; its kubeconfig and an official-client ApiClient."""
    server = ApiServer(store, tokens={"admin-token": ADMIN}, bookmark_interval=0.2)
    server.start()
    path = write_kubeconfig(tmp_path / "kubeconfig", server.url, "admin-token")
    api_client = config.new_client_from_config(str(path))
    yield Served(server, path, api_client)
    api_client.close()
    server.stop()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with Cluster(nodes=2, node_cpu="4", node_memory="16Gi", bookmark_interval=0.2) as c:
        c.add_namespace("spark")
        yield c


@pytest.fixture
def api(cluster: Cluster) -> Iterator[client.ApiClient]:
    api_client = config.new_client_from_config(str(cluster.kubeconfig()))
    yield api_client
    api_client.close()


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


def pod(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "containers": [
                {"name": "c", "image": "x", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}
            ],
            **spec,
        },
    }
