"""Every label, annotation, gate and resource name gpupack reads or writes: defined here once.

The webhook, the controller and the node agent import these names; none spells a
key itself. ``gpupack.io/*`` keys are gpupack's own; ``nvidia.com/*`` are the
NVIDIA device plugin's and GPU feature discovery's, which gpupack reads (and, in
simulation, writes as they would).
"""

from __future__ import annotations

from typing import Final

from mig.model import MIG_RESOURCE_PREFIX

OWN_PREFIX: Final = "gpupack.io/"
NVIDIA_PREFIX: Final = "nvidia.com/"

# ------------------------------------------------------------------ pod: what a user writes
MILLI_RESOURCE: Final = "gpupack.io/gpu-milli"
"""Extended resource a container asks for: thousandths of a GPU's compute."""
MEMORY_RESOURCE: Final = "gpupack.io/gpu-memory"
"""Extended resource a container asks for: GPU memory (a Kubernetes quantity)."""
SHARING_ANNOTATION: Final = "gpupack.io/sharing"
"""Pod annotation: the sharing mode asked for (``auto`` or a mode)."""
SKIP_LABEL: Final = "gpupack.io/skip"
"""Pod label: leave this pod alone."""

# ------------------------------------------------------------------ pod: what gpupack writes
ALLOCATION_ANNOTATION: Final = "gpupack.io/allocation"
"""The webhook's decision (``sharing.allocation.Allocation``)."""
CAPACITY_GATE: Final = "gpupack.io/capacity"
"""Scheduling gate held until the controller has capacity for the pod."""
RECOMMENDED_MILLI_ANNOTATION: Final = "gpupack.io/recommended-gpu-milli"
"""The feedback loop's right-size recommendation."""

# ------------------------------------------------------------------ Node / GPUNode
IDLE_SINCE_ANNOTATION: Final = "gpupack.io/idle-since"
"""GPUNode: since when the controller has seen the node idle."""
REPLICAS_CHANGED_ANNOTATION: Final = "gpupack.io/replicas-changed-at"
"""GPUNode: when the controller last changed the node's sharing."""
SIMULATED_LABEL: Final = "gpupack.io/simulated"
"""Node: its GPUs come from the simulated NVML backend."""
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
"""The well-known label the controller pins a released pod with."""

# ------------------------------------------------------------------ NVIDIA device plugin and GFD
WHOLE_RESOURCE: Final = "nvidia.com/gpu"
SHARED_RESOURCE: Final = "nvidia.com/gpu.shared"
"""A replica of a shared GPU (the device plugin's ``renameByDefault``)."""
# MIG_RESOURCE_PREFIX (defined with the profile model, in ``mig.model``): one MIG instance is
# ``nvidia.com/mig-<profile>`` under the device plugin's ``mixed`` strategy.
PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
STRATEGY_LABEL: Final = "nvidia.com/gpu.sharing-strategy"
REPLICAS_LABEL: Final = "nvidia.com/gpu.replicas"
MIG_CONFIG_LABEL: Final = "nvidia.com/mig.config"
MIG_CONFIG_STATE_LABEL: Final = "nvidia.com/mig.config.state"
DEVICE_PLUGIN_CONFIG_LABEL: Final = "nvidia.com/device-plugin.config"
DEPLOY_DEVICE_PLUGIN_LABEL: Final = "nvidia.com/gpu.deploy.device-plugin"


def mig_resource(profile: str) -> str:
    """The extended resource of one MIG instance of ``profile``."""
    return MIG_RESOURCE_PREFIX + profile


def mig_profile_of(resource: str) -> str | None:
    """The profile a MIG resource name stands for; None for any other resource."""
    return resource.removeprefix(MIG_RESOURCE_PREFIX) if resource.startswith(MIG_RESOURCE_PREFIX) else None
