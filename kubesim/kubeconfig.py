"""Kubeconfig files for kubesim users: one per user, a bearer token each."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_kubeconfig(path: str | Path, server_url: str, token: str, *, context: str = "kubesim") -> Path:
    path = Path(path)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": server_url}}],
        "users": [{"name": context, "user": {"token": token}}],
        "contexts": [
            {"name": context, "context": {"cluster": context, "user": context, "namespace": "default"}}
        ],
        "current-context": context,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
