"""The device-plugin backend's replica rule, in one place.

The stock NVIDIA device plugin shares a GPU by MPS or time-slicing as ``r``
equal replicas, and ``r`` is the same for every GPU of a node (its per-device
sharing fields are ignored on load; see docs/simulator.md, "Product model").
A container asking ``milli`` of a GPU's compute and ``memory`` bytes fits a
replica when ``r * milli <= 1000`` and ``r * memory <= GPU memory``.

A request above half a GPU fits only ``r = 1``: a GPU "shared" into one
replica, which is a whole GPU under another resource name on a node that then
cannot take whole-GPU pods. gpupack asks for a plain whole GPU instead
(:func:`takes_whole_gpu`), so such pods go where whole-GPU pods go.

The webhook (``sharing.admission.options``), the controller and the simulator's product
model all call these functions.
"""

from __future__ import annotations

from typing import Final

MAX_MILLI: Final = 1000
"""A whole GPU's compute, in the request API's unit."""
MAX_REPLICAS: Final = 8
"""Largest replica count gpupack gives a node (SharingPolicy's default bound)."""


def fits_replicas(replicas: int, milli: int, memory_bytes: int | None, gpu_memory_bytes: int) -> bool:
    """One container in a replica of a GPU split into ``replicas`` (memory ``None``: not asked)."""
    return replicas * milli <= MAX_MILLI and (memory_bytes is None or memory_bytes * replicas <= gpu_memory_bytes)


def largest_replicas(milli: int, maximum: int = MAX_REPLICAS) -> int:
    """The most replicas a GPU can be split into with ``milli`` still fitting one (compute only)."""
    if milli <= 0:
        raise ValueError(f"milli must be positive, got {milli}")
    return max(1, min(maximum, MAX_MILLI // milli))


def takes_whole_gpu(milli: int) -> bool:
    """A request no split of a GPU into two or more replicas can hold: it gets a whole GPU."""
    return 2 * milli > MAX_MILLI


def needs_whole_gpu(milli: int, memory_bytes: int | None, gpu_memory_bytes: int) -> bool:
    """No split into two or more replicas holds the container (compute, or memory on GPUs of
    ``gpu_memory_bytes``; 0: memory unknown, compute alone decides)."""
    if gpu_memory_bytes <= 0:
        return takes_whole_gpu(milli)
    return not fits_replicas(2, milli, memory_bytes, gpu_memory_bytes)


def replica_milli(replicas: int) -> float:
    """Compute one replica reserves, in milli (what a pod occupies, whatever it asked)."""
    return MAX_MILLI / replicas
