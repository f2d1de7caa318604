"""sparkgate: shape and pace Apache Spark executor pods on a shared Kubernetes cluster.

This package is the small shared core: the pod contract (`contract`), the policy model (`policy`),
the Kubernetes I/O layer and the `sparkgate` command line.
"""
