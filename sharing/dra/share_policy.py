"""How a claim consumes a shared GPU: the request policy of its ``milli`` and ``memory`` capacities.

A shared GPU (MPS or time-slicing) is one device with
``allowMultipleAllocations: true`` and two consumable capacities:

* ``gpu.gpupack.io/milli``: 1000 per GPU. Request policy ``validRange{min: step,
  max: 1000, step}``, default ``step``. ``step`` is the *share unit*, 50 milli by
  default (docs/dra.md, "Request policy", says why: at most 20 claims per GPU,
  inside MPS's client limit; each share a whole MPS thread percentage; the openb
  traces lose 0.2-0.9 points of allocation to 50-milli units). It must divide
  1000, so a whole GPU is a whole number of units, and be at most 500, because
  the API requires ``min + step <= capacity``.
* ``gpu.gpupack.io/memory``: the GPU's memory in bytes. Request policy
  ``validRange{min: step, max: the largest multiple of step that fits, step}``,
  default ``step``; ``step`` is 1 GiB by default.

kube-scheduler rounds a request up exactly as :meth:`SharePolicy.consumed_milli`
and :meth:`SharePolicy.consumed_memory` do (``roundUpRange`` in
``k8s.io/dynamic-resource-allocation``): below ``min`` it consumes ``min``,
otherwise ``min + ceil((request - min) / step) * step``; above ``max`` the
device cannot serve the claim.

**One policy for the release**, :data:`SHARES` (50 milli, 1 GiB): the agents
publish it in every shared device's request policy, the webhook decides and
the controller places and writes claims with it. It is a constant, not a
setting of any one component: a node publishing another step would have its
shares rounded one way by kube-scheduler and another by the webhook and the
controller. The simulator's ``--share-unit`` explores other steps as a what-if
(``sharing.simulator.dra``).

Defaults (what a claim that names no amount consumes) are the smallest share:
a claim that forgets its amount then costs the GPU's other tenants the least.
gpupack's own claims name both amounts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sharing.dra.model import Capacity, DraModelError, RequestPolicy, ValidRange

GPU_MILLI: Final = 1000
"""A whole GPU's compute, in the request API's unit."""
GiB: Final = 2**30
DEFAULT_MILLI_STEP: Final = 50
DEFAULT_MEMORY_STEP: Final = GiB


def _round_up(requested: int, minimum: int, step: int) -> int:
    if requested <= minimum:
        return minimum
    return minimum + -(-(requested - minimum) // step) * step


@dataclass(frozen=True)
class SharePolicy:
    """The share unit and defaults of shared GPUs (one policy per node pool).

    ``milli_step``: the share unit in milli (divides 1000, at most 500).
    ``memory_step_bytes``: the memory unit in bytes.
    ``default_milli`` / ``default_memory_bytes``: what a claim naming no amount
    consumes; None: one unit.
    """

    milli_step: int = DEFAULT_MILLI_STEP
    memory_step_bytes: int = DEFAULT_MEMORY_STEP
    default_milli: int | None = None
    default_memory_bytes: int | None = None

    def __post_init__(self) -> None:
        step = self.milli_step
        if not 1 <= step <= GPU_MILLI // 2:
            raise DraModelError(f"the share unit must be 1..{GPU_MILLI // 2} milli "
                                f"(the API needs min + step <= {GPU_MILLI}), got {step}")
        if GPU_MILLI % step:
            raise DraModelError(f"the share unit must divide {GPU_MILLI} milli, so a whole GPU is whole units; got {step}")
        if self.memory_step_bytes < 1:
            raise DraModelError(f"the memory unit must be at least 1 byte, got {self.memory_step_bytes}")
        milli = self.milli_default
        if not step <= milli <= GPU_MILLI or milli % step:
            raise DraModelError(f"the default share must be a multiple of {step} milli in {step}..{GPU_MILLI}, got {milli}")
        memory = self.memory_default
        if memory < self.memory_step_bytes or memory % self.memory_step_bytes:
            raise DraModelError(f"the default memory must be a positive multiple of the memory unit "
                                f"({self.memory_step_bytes} bytes), got {memory}")

    @property
    def milli_default(self) -> int:
        return self.milli_step if self.default_milli is None else self.default_milli

    @property
    def memory_default(self) -> int:
        return self.memory_step_bytes if self.default_memory_bytes is None else self.default_memory_bytes

    @property
    def shares_per_gpu(self) -> int:
        """The most claims one GPU can hold (each takes at least one unit)."""
        return GPU_MILLI // self.milli_step

    # ------------------------------------------------------------ what a claim consumes
    def consumed_milli(self, requested: int | None) -> int:
        """Milli a claim asking ``requested`` consumes (None: the default); may exceed 1000,
        which no device serves (:meth:`serves`)."""
        if requested is None:
            return self.milli_default
        return _round_up(requested, self.milli_step, self.milli_step)

    def max_memory(self, gpu_memory_bytes: int) -> int:
        """The largest memory request a GPU of ``gpu_memory_bytes`` serves: whole units only."""
        return gpu_memory_bytes // self.memory_step_bytes * self.memory_step_bytes

    def consumed_memory(self, requested_bytes: int | None) -> int:
        """Bytes a claim asking ``requested_bytes`` consumes (None: the default)."""
        if requested_bytes is None:
            return self.memory_default
        return _round_up(requested_bytes, self.memory_step_bytes, self.memory_step_bytes)

    def serves(self, gpu_memory_bytes: int, milli: int | None, memory_bytes: int | None) -> bool:
        """Whether one claim asking this much fits the policy of a GPU of ``gpu_memory_bytes``
        (alone on it; other claims' consumption is the allocator's business)."""
        return (self.consumed_milli(milli) <= GPU_MILLI
                and self.consumed_memory(memory_bytes) <= self.max_memory(gpu_memory_bytes))

    # ------------------------------------------------------------ the capacities it publishes
    def milli_capacity(self) -> Capacity:
        step = self.milli_step
        return Capacity(GPU_MILLI, RequestPolicy(self.milli_default, ValidRange(min=step, max=GPU_MILLI, step=step)))

    def memory_capacity(self, gpu_memory_bytes: int) -> Capacity:
        """Raises ``DraModelError`` for a GPU too small for two memory units (the API needs
        ``min + step <= capacity``) or for the default."""
        step = self.memory_step_bytes
        if gpu_memory_bytes < 2 * step:
            raise DraModelError(f"a GPU of {gpu_memory_bytes} bytes holds fewer than two memory units of {step} bytes")
        maximum = self.max_memory(gpu_memory_bytes)
        if self.memory_default > maximum:
            raise DraModelError(f"the default memory ({self.memory_default} bytes) exceeds what a GPU of "
                                f"{gpu_memory_bytes} bytes serves ({maximum})")
        return Capacity(gpu_memory_bytes, RequestPolicy(self.memory_default, ValidRange(min=step, max=maximum, step=step)))


SHARES: Final = SharePolicy()
"""The share policy of every shared DRA GPU gpupack publishes, and the one its webhook and controller use."""
