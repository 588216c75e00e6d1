"""What the cycle's pods claim per node: MIG instances, shared replicas and pinned whole GPUs.

Counted from pods, not from the agent's ``inUse`` flags: a pod the controller has
just pinned holds its capacity before the agent sees a process on it.
"""

from __future__ import annotations

from collections import Counter

from controller.state.snapshot import Pod


def mig_claims(pods: tuple[Pod, ...]) -> dict[str, Counter[str]]:
    """Node -> profile -> pods bound or pinned there that use such an instance."""
    out: dict[str, Counter[str]] = {}
    for pod in pods:
        if pod.mode == "mig" and pod.node is not None and not pod.gated:
            counts = out.get(pod.node)
            if counts is None:
                counts = out[pod.node] = Counter()
            for profile in pod.profiles:  # a loop, not Counter.update: this runs over every pod, every cycle
                counts[profile] += 1
    return out


def shared_claims(pods: tuple[Pod, ...]) -> Counter[str]:
    """Node -> shared replicas taken by pods bound or pinned there."""
    out: Counter[str] = Counter()
    for pod in pods:
        if pod.mode != "mig" and pod.node is not None and not pod.gated:
            out[pod.node] += pod.shares
    return out


def whole_pinned(pods: tuple[Pod, ...]) -> Counter[str]:
    """Node -> whole GPUs of gpupack pods pinned there and not bound yet (bound pods are in
    ``Node.whole_taken``, which counts every pod's ``nvidia.com/gpu``)."""
    out: Counter[str] = Counter()
    for pod in pods:
        if pod.mode == "whole" and pod.node is not None and not pod.gated and not pod.bound:
            out[pod.node] += pod.whole_gpus
    return out
