"""Every label, annotation, gate and resource name gpupack reads or writes: defined here once.

The webhook, the controller and the node agent import these names; none spells a
key itself. ``gpupack.io/*`` keys are gpupack's own; ``nvidia.com/*`` are the
NVIDIA device plugin's and GPU feature discovery's, which gpupack reads (and, in
simulation, writes as they would).
"""

from __future__ import annotations

import hashlib
import re
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
"""The webhook's decision (``sharing.api.allocation.Allocation``)."""
CAPACITY_GATE: Final = "gpupack.io/capacity"
"""Scheduling gate held until the controller has capacity for the pod."""
DRA_PINNED_ANNOTATION: Final = "gpupack.io/dra-pinned"
"""ResourceClaim (DRA pool): the node and devices the controller pinned it to (``sharing.dra.pinned``)."""
DRA_REQUEUES_ANNOTATION: Final = "gpupack.io/dra-requeues"
"""ResourceClaim (DRA pool): how many times the controller re-created the claim, same pin, to make
kube-scheduler try its pod again (``controller.planning.draplan``, "Stalled promises")."""
RIGHT_SIZING_LABEL: Final = "gpupack.io/right-sizing"
"""Namespace label: the right-sizing mode for its pods (``Off``, ``Initial``, ``Recreate``), over
what the SharingPolicies say (``sharing.rules.right_sizing``)."""
RIGHT_SIZED_ANNOTATION: Final = "gpupack.io/right-sized-from"
"""Pod: written by the webhook when it sized the pod from its workload's GPURecommendation (right-sizing
``Initial`` or ``Recreate``): what each sized container asked for, what it was given, and which
recommendation said so (``sharing.api.right_sized``)."""
RESIZED_AT_ANNOTATION: Final = "right-sizing.gpupack.io/resized-at"
"""Deployment pod template: when the controller rolled the Deployment out to resize its only replica
make-before-break (right-sizing ``Recreate``, ``controller.planning.right_size_rollouts``), as
``kubectl rollout restart`` writes ``kubectl.kubernetes.io/restartedAt``. Outside the ``gpupack.io/``
prefix on purpose: that prefix on a pod carries gpupack's trust, and the pod-marks policy
(``manifests/rbac/pod-marks-policy.yaml``) refuses a pod created with any other key of it. Nothing
reads this one back: it only makes the template new."""
PREEMPTING_ANNOTATION: Final = "gpupack.io/preempting"
"""Pod (a preemptor, written by the controller with its pin): the uids of the pods it preempted for it,
comma-separated; the pod waits on its node while one of them exists (``controller.planning.preemption``)."""
PREEMPTION_REASON: Final = "PreemptionByGpupack"
"""Reason of the ``DisruptionTarget`` condition and of the Event the controller writes on a pod it
preempts (kube-scheduler writes ``PreemptionByScheduler``)."""
KUEUE_ADMISSION_GATE: Final = "kueue.x-k8s.io/admission"
"""Kueue's scheduling gate on a plain pod of a LocalQueue: held until Kueue admits the pod's Workload within
its ClusterQueue's quota. Kueue adds and lifts it; gpupack only reads it (a pod that carries it is no demand)."""
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
"""Pod label naming the LocalQueue whose quota the pod counts against (Kueue's ``pod`` integration)."""
PLACEMENT_CONDITION: Final = "gpupack.io/Placement"
"""Pod condition type: the controller's word on a gated pod it has not placed (``sharing.api.placement_status``)."""

DURATION_ANNOTATION: Final = "gpupack.io/duration-seconds"
"""Pod (simulation: KWOK nodes): seconds after it starts when the pod completes (``gpupack.devcluster.kwok``)."""

USER_POD_ANNOTATIONS: Final = (SHARING_ANNOTATION, DURATION_ANNOTATION)
"""The ``gpupack.io/*`` annotations a pod's creator may set; at create only these and the webhook's
:data:`WEBHOOK_POD_ANNOTATIONS` pass (ValidatingAdmissionPolicy ``gpupack-pod-create-marks``)."""
WEBHOOK_POD_ANNOTATIONS: Final = (ALLOCATION_ANNOTATION, RIGHT_SIZED_ANNOTATION)
"""The ``gpupack.io/*`` annotations the mutating webhook writes at create (it refuses a hand-written one
that it would not have written: ``webhook.forged_marks``)."""

# ------------------------------------------------------------------ Node / GPUNode
SIMULATED_GPUS_ANNOTATION: Final = "gpupack.io/simulated-gpus"
"""Node (simulation: KWOK nodes): ``MODEL:COUNT``, the simulated GPUs ``gpupack agent fleet`` serves the
node with (a MIG catalog model or an openb GPU type, as ``gpupack agent run --simulate`` takes)."""
IDLE_SINCE_ANNOTATION: Final = "gpupack.io/idle-since"
"""GPUNode: since when the controller has seen the node idle."""
HEALTH_ACK_ANNOTATION: Final = "gpupack.io/health-acknowledged"
"""GPUNode: an admin's acknowledgement that faults have been dealt with (``sharing.health``)."""
DEGRADED_LABEL: Final = "gpupack.io/gpu-degraded"
"""Node: a GPU has a fault the device plugin keeps advertising; gpupack's pods keep off (value ``true``)."""
UNHEALTHY_TAINT: Final = "gpupack.io/gpu-unhealthy"
"""Node taint while every GPU of the node is unhealthy."""
SIMULATED_LABEL: Final = "gpupack.io/simulated"
"""Node: its GPUs come from the simulated NVML backend."""
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
"""The well-known label the controller pins a released pod with."""

BACKEND_LABEL: Final = "gpupack.io/backend"
"""Node: the node pool's backend, ``dra`` or ``device-plugin`` (absent: ``device-plugin``); pod or
namespace: the pool a pod of gpupack's goes to (``sharing.api.backend``)."""
REPLAY_LABEL: Final = "gpupack.io/replay"
"""On ``gpupack replay``'s Nodes (value ``on``; its SharingPolicy selects them) and pods (the run's id)."""
USER_POD_LABELS: Final = (SKIP_LABEL, BACKEND_LABEL, REPLAY_LABEL)
"""The ``gpupack.io/*`` labels a pod's creator may set (ValidatingAdmissionPolicy ``gpupack-pod-create-marks``):
``gpupack replay`` labels the pods it creates with :data:`REPLAY_LABEL`."""

NODE_NAME_EXTRA: Final = "authentication.kubernetes.io/node-name"
"""Kubernetes' user-info extra of a token bound to a pod: the pod's node (a DaemonSet's own node)."""

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
GPU_OPERATOR_NAMESPACE: Final = "gpu-operator"
"""Where the GPU Operator runs by default (its device plugin's and mig-manager's ConfigMaps)."""
MIG_PARTED_CONFIGMAP: Final = "default-mig-parted-config"
"""The GPU Operator's default name of mig-manager's ConfigMap."""
MIG_PARTED_CONFIG_KEY: Final = "config.yaml"
"""The key of mig-manager's ConfigMap that holds its mig-parted config."""


def mig_resource(profile: str) -> str:
    """The extended resource of one MIG instance of ``profile``."""
    return MIG_RESOURCE_PREFIX + profile


def mig_profile_of(resource: str) -> str | None:
    """The profile a MIG resource name stands for; None for any other resource."""
    return resource.removeprefix(MIG_RESOURCE_PREFIX) if resource.startswith(MIG_RESOURCE_PREFIX) else None


# ------------------------------------------------------------------ per-node objects in the GPU Operator's ConfigMaps
PER_NODE_PREFIX: Final = "gpupack-"
PER_NODE_NAME_LIMIT: Final = 50
"""Longest per-node name (``gpupack-<node>``): leaves room for ``-g<generation>`` in a 63-character label value."""


def per_node_name(node: str) -> str:
    """``gpupack-<node>``: the node's key in the device plugin's ConfigMap and the stem of its mig-parted configs.

    Names over :data:`PER_NODE_NAME_LIMIT` characters keep their first 41 characters, then
    ``-`` and 8 hex digits of the node name's SHA-256 (50 in all)."""
    name = f"{PER_NODE_PREFIX}{node}"
    if len(name) <= PER_NODE_NAME_LIMIT:
        return name
    return f"{name[:41]}-{hashlib.sha256(node.encode()).hexdigest()[:8]}"


def mig_config_name(node: str, generation: int) -> str:
    """The name of ``node``'s mig-parted config for a GPUNode generation (``gpupack-<node>-g<generation>``).

    A fresh name per request, because mig-manager acts on changes of the ``nvidia.com/mig.config`` label."""
    return f"{per_node_name(node)}-g{generation}"


def is_mig_config_of(node: str, name: str) -> bool:
    """Whether ``name`` is one of ``node``'s mig-parted configs (any generation)."""
    return re.fullmatch(re.escape(per_node_name(node)) + r"-g[0-9]+", name) is not None


# kube-scheduler's extender protocol: gpupack's webhook serves a prioritize extender at
# ``<urlPrefix>/<prioritizeVerb>``; ``manifests/scheduler/kube-scheduler-config.yaml`` configures it.
SCHEDULER_EXTENDER_PREFIX: Final = "/scheduler"
"""The path of the extender's ``urlPrefix`` on the webhook's server."""
PRIORITIZE_VERB: Final = "prioritize"
"""The extender's ``prioritizeVerb``: the route is ``/scheduler/prioritize``."""
