"""`python -m kubesim --nodes N`: a standalone simulated cluster to poke with your own tools."""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading

from .cluster import Cluster


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m kubesim", description=__doc__)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--node-cpu", default="8")
    parser.add_argument("--node-memory", default="32Gi")
    args = parser.parse_args()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with Cluster(nodes=args.nodes, node_cpu=args.node_cpu, node_memory=args.node_memory) as cluster:
        print(f"kubesim API server: {cluster.url}")
        print(f"kubeconfig (admin):  {cluster.kubeconfig()}")
        print("Ctrl-C to stop.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            done.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
