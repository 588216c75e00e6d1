"""openb's GPU types as GPU products gpupack knows: one mapping for every openb replay.

The openb node list names seven GPU types. The product model (and any live
replay of openb on simulated nodes) needs, per type, the product name GPU
feature discovery would report, the GPU memory, and whether MIG exists on it:

- none of the seven is MIG-capable (MIG needs an A30, A100 or newer data-centre
  GPU: NVIDIA's MIG user guide, "Supported GPUs"; the A10 is not among them), so
  every fractional openb pod is an MPS share under the product model;
- memory is each product's published size (NVIDIA's V100, P100, T4 and A10
  datasheets). ``G2`` and ``G3`` are anonymised in the trace; their memory is
  unknown and left 0. openb pods state no GPU memory, so the memory half of the
  replica rule (``sharing.rules.replicas``) never binds whatever these figures are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class OpenbGpu:
    product: str
    """``nvidia.com/gpu.product`` as GPU feature discovery would label it."""
    memory_mib: int
    """GPU memory (0: unknown)."""
    mig_capable: bool = False


OPENB_GPUS: Final[dict[str, OpenbGpu]] = {
    "V100M16": OpenbGpu("Tesla-V100-SXM2-16GB", 16 * 1024),
    "V100M32": OpenbGpu("Tesla-V100-SXM2-32GB", 32 * 1024),
    "P100": OpenbGpu("Tesla-P100-PCIE-16GB", 16 * 1024),
    "T4": OpenbGpu("Tesla-T4", 16 * 1024),
    "A10": OpenbGpu("NVIDIA-A10", 24 * 1024),
    "G2": OpenbGpu("openb-G2", 0),
    "G3": OpenbGpu("openb-G3", 0),
}


def openb_gpu(model: str) -> OpenbGpu:
    """The product of an openb GPU type; a clear error for a type the trace never had."""
    try:
        return OPENB_GPUS[model]
    except KeyError:
        raise ValueError(f"unknown openb GPU type {model!r}; known: {', '.join(sorted(OPENB_GPUS))}") from None
