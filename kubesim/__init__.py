"""kubesim: a simulated Kubernetes cluster that the official client, the webhook and the allocator talk to
over real HTTP — kube-apiserver (with admission webhooks), kube-scheduler, kubelets and Spark drivers.

Entry point: `kubesim.cluster.Cluster` (a context manager). `python -m kubesim` runs one standalone.
"""
