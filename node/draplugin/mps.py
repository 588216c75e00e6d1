"""A GPU share's MPS client limits, from what its allocation consumed (pure).

kube-scheduler records in ``consumedCapacity`` what each claim on a shared GPU
took of its ``gpu.gpupack.io/milli`` and ``gpu.gpupack.io/memory`` capacities
(rounded by the request policy, ``sharing.dra.share_policy``). MPS enforces
both per client process through environment variables, so every claim gets its
own limits and shares need not be equal:

* ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: the share of the GPU's SMs the client
  may use, ``milli / 10``. With the default 50-milli unit every share is a whole
  percentage; a finer unit is rounded *up* (a claim never gets less than it was
  allocated) and kept within 1..100.
  A right-sized share (its claim's configuration says so, ``sharing.dra.share_config``) gets 100:
  its consumed milli is what placement counted for it, derived from a predicted duty cycle (the
  share of time the pod kept the GPU busy with all its SMs), not a share of the SMs
  (docs/right-sizing.md). Set, not omitted, so the container says what it was given.
* ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: ``<ordinal>=<MiB>M``, the device memory
  the client may allocate, rounded *down* to whole MiB (the limit never exceeds
  what the scheduler counted). The ordinal is the device as CUDA numbers it
  inside the container: each CDI device of gpupack exposes exactly one GPU, so
  it is 0. The variables and the value's form are ``sharing.api.mps_env``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from sharing.api.mps_env import PINNED_MEMORY_ENV, THREAD_PERCENTAGE_ENV, pinned_memory_value
from sharing.dra.names import MEMORY, MILLI

MiB: Final = 2**20


@dataclass(frozen=True)
class MpsLimits:
    thread_percentage: int
    """1..100: the client's share of the GPU's SMs."""
    pinned_memory_mib: int
    """Device memory the client may allocate, MiB."""

    def env(self, ordinal: int = 0) -> tuple[str, ...]:
        """The variables as CDI ``containerEdits.env`` entries (``NAME=value``)."""
        return (f"{THREAD_PERCENTAGE_ENV}={self.thread_percentage}",
                f"{PINNED_MEMORY_ENV}={pinned_memory_value(self.pinned_memory_mib, ordinal)}")


def mps_limits(consumed: Mapping[str, int], device: str, *, right_sized: bool = False) -> MpsLimits:
    """The limits of a share that consumed ``consumed`` (capacity name -> milli or bytes) of ``device``;
    ``right_sized``: no SM cap (module docstring).

    Raises ``ValueError`` naming the missing or impossible amount: without both
    amounts MPS would let the claim use the whole GPU, which is not what was allocated.
    """
    milli = consumed.get(MILLI)
    memory = consumed.get(MEMORY)
    missing = [name for name, value in ((MILLI, milli), (MEMORY, memory)) if value is None]
    if missing:
        raise ValueError(f"the allocation of shared device {device} records no consumedCapacity for "
                         f"{' and '.join(missing)}, so its MPS limits are unknown (is the device published "
                         "with its request policy, and the DRAConsumableCapacity feature on?)")
    assert milli is not None and memory is not None
    if not 0 < milli <= 1000:
        raise ValueError(f"shared device {device}: consumed {milli} milli, outside 1..1000")
    if memory < MiB:
        raise ValueError(f"shared device {device}: consumed {memory} bytes of memory, less than 1 MiB")
    percentage = 100 if right_sized else min(100, max(1, -(-milli // 10)))
    return MpsLimits(percentage, memory // MiB)
