"""A running kubesim cluster and an official-client ApiClient for it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from kubesim.cluster import Cluster


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
