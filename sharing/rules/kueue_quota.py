"""How gpupack's pods count against Kueue quotas: the resource transformations of Kueue's Configuration.

Kueue counts what a pod's containers request when it builds the pod's Workload, which is after
gpupack's webhook rewrote the request (``sharing.admission.patch``): a pod that asked
``gpupack.io/gpu-milli`` reaches Kueue as one of the device plugin's resources, and gpupack's own
names are gone (no node advertises them). The transformations below (Kueue's
``resources.transformations``, one per input resource) count each of those as what it holds of a
GPU, in ``gpupack.io/gpu-milli`` (and ``gpupack.io/gpu-memory`` where the resource says it), so one
ClusterQueue quota in milli covers every kind:

===========================  ========  =========================================================
input                        strategy  outputs per unit
===========================  ========  =========================================================
``nvidia.com/gpu``           Replace   1000 milli (a whole GPU)
``nvidia.com/gpu.shared``    Replace   ``replica_milli`` milli: one replica of a GPU shared into
                                       ``r`` (``1000 / r``; the cluster's SharingPolicies fix ``r``)
``nvidia.com/mig-<profile>`` Retain    the profile's compute slices of 7 (8 on some models) in
                                       milli, and its nominal memory (``1g.10gb``: 142, 10Gi); the
                                       input is kept, so a ClusterQueue may also cap each profile
===========================  ========  =========================================================

What is counted is what the pod *takes*, not what it asked: a pod of 1 milli holds a whole
replica (a quarter of a GPU at ``r = 4``), and that is what its team's quota pays. Memory of a
whole GPU or a replica depends on the node's GPU model, which the resource does not say, so
``gpupack.io/gpu-memory`` quotas bind MIG instances only (docs/priority.md, "Quota through Kueue").
"""

from __future__ import annotations

import re
from typing import Any, Final

from mig.catalog import all_models
from sharing.api.keys import MEMORY_RESOURCE, MILLI_RESOURCE, SHARED_RESOURCE, WHOLE_RESOURCE, mig_resource
from sharing.rules.replicas import MAX_REPLICAS

MILLI_PER_GPU: Final = 1000
DEFAULT_REPLICA_MILLI: Final = 250
"""One replica of a GPU shared into 4 (the demo's and the replay's SharingPolicy maximum)."""
_NOMINAL = re.compile(r"^[0-9]+g\.([0-9]+)gb")


def replica_milli(replicas: int) -> int:
    """The milli one replica of a GPU shared into ``replicas`` holds (``1000 // r``); ValueError out of range."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"replicas must be in 1..{MAX_REPLICAS} (a GPU shared into r), got {replicas}")
    return MILLI_PER_GPU // replicas


def mig_outputs() -> dict[str, dict[str, str]]:
    """Per MIG resource of the catalog's models: its milli and nominal memory (first model to name it)."""
    out: dict[str, dict[str, str]] = {}
    for model in all_models():
        for profile in model.profiles:
            resource = mig_resource(profile.name)
            if resource in out:
                continue
            milli = profile.compute_slices * MILLI_PER_GPU // model.compute_slices
            nominal = _NOMINAL.match(profile.name)
            outputs = {MILLI_RESOURCE: str(milli)}
            if nominal is not None:
                outputs[MEMORY_RESOURCE] = f"{nominal.group(1)}Gi"
            out[resource] = outputs
    return out


def resource_transformations(replicas: int = MILLI_PER_GPU // DEFAULT_REPLICA_MILLI) -> list[dict[str, Any]]:
    """Kueue's ``resources.transformations`` for a cluster whose shared GPUs are split into ``replicas``."""
    out: list[dict[str, Any]] = [
        {"input": WHOLE_RESOURCE, "strategy": "Replace", "outputs": {MILLI_RESOURCE: str(MILLI_PER_GPU)}},
        {"input": SHARED_RESOURCE, "strategy": "Replace", "outputs": {MILLI_RESOURCE: str(replica_milli(replicas))}},
    ]
    out += [{"input": resource, "strategy": "Retain", "outputs": outputs}
            for resource, outputs in sorted(mig_outputs().items())]
    return out


__all__ = ["DEFAULT_REPLICA_MILLI", "mig_outputs", "replica_milli", "resource_transformations"]
