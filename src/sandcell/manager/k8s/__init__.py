"""The Kubernetes backend: each cell is a Pod running the daemon on TCP (see docs/kubernetes.md).

`config` is light (no client library); `backend` imports lightkube and is loaded only when the
server runs with `backend = "kubernetes"`.
"""
