"""The names of gpupack's sharing modes: one Literal per concept, used by every component.

- :data:`Mode`: what a pod may ask for (``gpupack.io/sharing``, besides ``auto``) and what
  a SharingPolicy may allow in a namespace.
- :data:`AllocationMode`: what a pod is given (the allocation record's ``mode``): a
  requestable mode, or ``whole``, a plain ``nvidia.com/gpu`` per container for a
  shared-mode request that no split into two or more replicas holds, or ``cpu``: a
  pod that asks for no GPU and is labelled ``gpupack.io/backend=dra``, which the
  packing engine places on the DRA pool beside the GPU pods (docs/dra-pods.md,
  "Pods that ask for no GPU").
- :data:`NodeSharingMode`: how a node's device plugin shares its full GPUs
  (``GPUNode`` spec and status ``sharing.mode``).
"""

from __future__ import annotations

from typing import Final, Literal

Mode = Literal["mig", "mps", "time-slicing"]
MODES: Final[tuple[Mode, ...]] = ("mig", "mps", "time-slicing")

AllocationMode = Literal["mig", "mps", "time-slicing", "whole", "cpu"]
ALLOCATION_MODES: Final[tuple[AllocationMode, ...]] = ("mig", "mps", "time-slicing", "whole", "cpu")

NodeSharingMode = Literal["none", "mps", "time-slicing"]
