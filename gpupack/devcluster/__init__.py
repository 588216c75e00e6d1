"""A real local Kubernetes control plane for gpupack's tests and demos.

etcd + kube-apiserver + kube-scheduler, built from their Go modules by
``tools/k8s/build.sh`` and run on loopback with generated certificates and
per-component identities. See ``docs/controlplane.md``.
"""
