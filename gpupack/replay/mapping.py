"""openb rows as the Kubernetes objects a live replay creates: KWOK Nodes and the pods users would write.

**Nodes.** Every row of the node list becomes a Node that kwok manages
(``gpupack.devcluster.kwok.node_manifest``): ``cpu_milli`` and ``memory_mib``
as its CPU (``64000m``) and memory (``262144Mi``) capacity, room for
:data:`NODE_POD_CAPACITY` pods (the protocol has no per-node pod limit), and
the annotation ``gpupack.io/simulated-gpus=TYPE:COUNT`` (``V100M16:8``) that
``gpupack agent fleet`` reads to serve the node with COUNT simulated GPUs of
that openb type. The type's product (``mig.openb_gpus``, the
one mapping every openb replay uses) is what the fleet's device-plugin
emulator labels as ``nvidia.com/gpu.product``, as GPU feature discovery
would; the Node is created without GPU resources or GPU labels: the emulated
device plugin advertises them, as on a real node. Labels: kwok's, the
replay's (:data:`REPLAY_LABEL`, which its SharingPolicy selects), the node
pool's backend (``gpupack.io/backend=device-plugin``) and the GPU Operator's
``nvidia.com/gpu.deploy.device-plugin=true``. openb's GPU node list has no
CPU-only row; a row with ``gpu`` 0 would become a Node without the
annotation, which no agent serves and the protocol fills with CPU-only pods
only, as the simulator does.

**Pods.** Each pod asks what an app team would write for the openb request
(docs/replay.md has the table): CPU and memory as container requests; a
fraction of one GPU (``gpu_milli`` < 1000, one GPU) as
``gpupack.io/gpu-milli`` with ``gpupack.io/sharing: mps`` (openb's GPUs have
no MIG, so every fractional openb pod is an MPS share, as the product model
has it; ``auto`` would be refused while no node shares GPUs yet, since auto
never gates on a kind of node that does not exist); whole GPUs
(``gpu_milli`` 1000, any count) as ``nvidia.com/gpu: N``, which the webhook
passes through to kube-scheduler. A ``gpu_spec`` constraint becomes required
node affinity on ``nvidia.com/gpu.product`` over the products of the listed
types. No duration annotation: in the protocol pods arrive and never leave, so
they run on KWOK until the replay ends.
"""

from __future__ import annotations

from typing import Any, Final

from gpupack.devcluster.apply import Manifest
from gpupack.devcluster.kwok import node_address, node_manifest
from sharing.api.keys import (
    BACKEND_LABEL, DEPLOY_DEVICE_PLUGIN_LABEL, MILLI_RESOURCE, PRODUCT_LABEL, SHARING_ANNOTATION,
    SIMULATED_GPUS_ANNOTATION, WHOLE_RESOURCE,
)
from sharing.api.keys import REPLAY_LABEL as REPLAY_LABEL  # on the replay's Nodes and pods; defined with every key
from sharing.packing.specs import NodeSpec, PodSpec
from mig.openb_gpus import openb_gpu

NODE_POD_CAPACITY: Final = 1000
"""Pods a replay Node holds: more than any openb node ever gets, so the count never binds (the protocol has none)."""
IMAGE: Final = "registry.invalid/openb-replay:never-pulled"
"""KWOK runs no container: the image is never pulled."""
CONTAINER: Final = "main"


def simulated_gpus(node: NodeSpec) -> str | None:
    """``TYPE:COUNT`` for the fleet annotation; None for a CPU-only node. ValueError for a GPU
    type ``mig.openb_gpus`` does not know."""
    if node.gpu_count == 0:
        return None
    openb_gpu(node.gpu_model)  # an unknown type fails here, naming the known ones
    return f"{node.gpu_model}:{node.gpu_count}"


def kube_node_name(name: str) -> str:
    """A trace name as a Kubernetes object name (lower case; openb's names already are)."""
    return name.lower()


def replay_node(node: NodeSpec, number: int) -> Manifest:
    """The KWOK Node of one node-list row (``number``: its place in the run, for its address)."""
    manifest = node_manifest(
        kube_node_name(node.name), cpu=f"{node.cpu_milli}m", memory=f"{node.memory_mib}Mi", pods=NODE_POD_CAPACITY,
        labels={REPLAY_LABEL: "on", BACKEND_LABEL: "device-plugin", DEPLOY_DEVICE_PLUGIN_LABEL: "true"},
        address=node_address(number),
    )
    gpus = simulated_gpus(node)
    if gpus is not None:
        manifest["metadata"]["annotations"][SIMULATED_GPUS_ANNOTATION] = gpus
    return manifest


def products(pod: PodSpec) -> tuple[str, ...]:
    """``nvidia.com/gpu.product`` values a pod's ``gpu_spec`` allows (empty: any). ValueError for an
    unknown type."""
    return tuple(sorted({openb_gpu(model).product for model in pod.gpu_models}))


def gpu_limits(pod: PodSpec) -> dict[str, str]:
    """The GPU half of the container's limits (module docstring)."""
    if pod.gpu_count == 0:
        return {}
    if pod.is_shared:
        return {MILLI_RESOURCE: str(pod.gpu_milli)}
    return {WHOLE_RESOURCE: str(pod.gpu_count)}


def replay_pod(pod: PodSpec, namespace: str, run_id: str, priority_class: str | None = None) -> Manifest:
    """The pod a user of gpupack writes for one openb request (module docstring), naming
    ``priority_class`` when given (``gpupack replay --priority qos``)."""
    requests = {**({"cpu": f"{pod.cpu_milli}m"} if pod.cpu_milli else {}),
                **({"memory": f"{pod.memory_mib}Mi"} if pod.memory_mib else {})}
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    limits = gpu_limits(pod)
    if limits:
        resources["limits"] = limits
    spec: dict[str, Any] = {
        "containers": [{"name": CONTAINER, "image": IMAGE, "resources": resources}],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
    }
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    allowed = products(pod)
    if allowed:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": PRODUCT_LABEL, "operator": "In", "values": list(allowed)}]}]}}}
    metadata: dict[str, Any] = {"name": kube_node_name(pod.name), "namespace": namespace,
                                "labels": {REPLAY_LABEL: run_id}}
    if pod.is_shared:
        metadata["annotations"] = {SHARING_ANNOTATION: "mps"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
