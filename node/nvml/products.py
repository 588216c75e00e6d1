"""What a simulated GPU can be: a MIG-capable catalog model, or one of openb's plain GPUs.

``SimulatedNvml`` simulates GPUs of one product: a ``mig.model.GpuModel`` from
``mig/``'s catalog (MIG-capable), or a :class:`PlainGpu`, a GPU without MIG.
The plain GPUs are openb's seven GPU types, taken from the one mapping every
openb replay uses (``mig.openb_gpus.OPENB_GPUS``, which the
trace simulator's product model reads): this module adds only what NVML reports
and that mapping does not hold, never a second table of products or memory.

* **NVML's name** is derived from the product. The product is GFD's
  ``nvidia.com/gpu.product``, which is NVML's name with spaces as dashes
  (``node.base.snapshot.GpuSnapshot.product``); NVML's names for these GPUs put one
  space after the brand and dashes after it ("Tesla V100-SXM2-16GB", "Tesla
  P100-PCIE-16GB", "Tesla T4", "NVIDIA A10"), so the name is the product with
  its first dash turned into a space. A simulated node's GPUNode ``product`` is
  then exactly the product the product model uses.
* **PCI device ids** are the real ones (:data:`_PCI_DEVICE_IDS`) for the five
  named products; ``G2`` and ``G3`` are anonymised in the trace and get made-up
  ids, marked as such.
* **Memory** is the mapping's, except for ``G2`` and ``G3``, whose memory the
  trace does not give (0 in the mapping). NVML always reports a size, and the
  live system reads 0 as "no memory known": the webhook offers no MPS or
  time-slicing share on a node whose GPUs report 0 MiB (``sharing.admission.options``
  skips it), so MPS pods the product model places on a G2/G3 node would never
  be admitted there. A simulated G2/G3 therefore reports the smallest memory of
  the trace's known GPUs (:func:`stand_in_memory_mib`, 16 GiB). openb pods state
  no GPU memory, so any positive size leaves the memory half of the replica rule
  unbound (``sharing.rules.replicas``) and the live system agrees with the product
  model; the smallest known size is the cautious choice for pods that do state
  memory: none is admitted to a G2/G3 that would not fit the smallest GPU of
  the trace's cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias

from mig.catalog import find_model, model_names
from mig.model import GpuModel
from mig.openb_gpus import OPENB_GPUS, OpenbGpu

NVIDIA_VENDOR_ID: Final = "10DE"

# PCI device ids by openb type; source: the PCI ID repository (pci-ids.ucw.cz), vendor 10de.
_PCI_DEVICE_IDS: Final[dict[str, int]] = {
    "V100M16": 0x1DB1,  # GV100GL [Tesla V100 SXM2 16GB]
    "V100M32": 0x1DB5,  # GV100GL [Tesla V100 SXM2 32GB]
    "P100": 0x15F8,  # GP100GL [Tesla P100 PCIe 16GB]
    "T4": 0x1EB8,  # TU104GL [Tesla T4]
    "A10": 0x2236,  # GA102GL [A10]
    # MADE UP: G2 and G3 are anonymised in the openb trace, so no real device id exists for
    # them. 0xFFF2/0xFFF3 are not assigned to any NVIDIA device in the PCI ID repository.
    "G2": 0xFFF2,
    "G3": 0xFFF3,
}


@dataclass(frozen=True)
class PlainGpu:
    """A GPU product without MIG, as NVML describes it (the fields ``SimulatedNvml`` reports)."""

    product: str
    """GFD's ``nvidia.com/gpu.product`` (NVML's name with spaces as dashes), e.g. ``Tesla-T4``."""
    display_name: str
    """``nvmlDeviceGetName``, e.g. ``Tesla T4``."""
    pci_device_id: str
    """mig-parted ``device-filter`` form ``0x<device><vendor>``, e.g. ``0x1EB810DE``."""
    memory_mib: int
    """``nvmlDeviceGetMemoryInfo`` total, in MiB (always positive, as NVML's)."""
    openb_type: str = ""
    """The openb trace's GPU type this product stands for (``T4``), if any."""

    @property
    def mig_capable(self) -> bool:
        return False

    def __post_init__(self) -> None:
        if self.memory_mib <= 0:
            raise ValueError(f"{self.product}: NVML always reports GPU memory; got {self.memory_mib} MiB")
        if self.display_name.replace(" ", "-") != self.product:
            raise ValueError(f"NVML name {self.display_name!r} does not give GFD's product {self.product!r}")


SimulatedProduct: TypeAlias = GpuModel | PlainGpu
"""What ``SimulatedNvml`` simulates N GPUs of."""


class UnknownGpuError(ValueError):
    """A GPU name neither the MIG catalog nor openb's types know; the message lists both."""

    def __init__(self, name: str) -> None:
        self.name = name
        openb = ", ".join(f"{t} ({g.product})" for t, g in OPENB_GPUS.items())
        super().__init__(f"unknown GPU model {name!r}; MIG-capable models: {', '.join(model_names())}; "
                         f"openb GPU types (no MIG): {openb}")


def nvml_name(product: str) -> str:
    """NVML's name for a GFD product: its first dash becomes a space (see the module docstring)."""
    return product.replace("-", " ", 1)


def stand_in_memory_mib() -> int:
    """What a simulated GPU of unknown memory reports: the smallest known openb GPU's memory."""
    return min(g.memory_mib for g in OPENB_GPUS.values() if g.memory_mib > 0)


def openb_plain_gpu(openb_type: str) -> PlainGpu:
    """The plain GPU an openb type (``T4``, exact name) is simulated as."""
    gpu: OpenbGpu = OPENB_GPUS[openb_type]
    if gpu.mig_capable:
        raise ValueError(f"openb type {openb_type} is MIG-capable; simulate it as a catalog model")
    return PlainGpu(
        product=gpu.product, display_name=nvml_name(gpu.product),
        pci_device_id=f"0x{_PCI_DEVICE_IDS[openb_type]:04X}{NVIDIA_VENDOR_ID}",
        memory_mib=gpu.memory_mib or stand_in_memory_mib(), openb_type=openb_type,
    )


def _normalise(name: str) -> str:
    return name.strip().replace(" ", "-").replace("_", "-").upper()


def find_openb_type(name: str) -> str | None:
    """The openb type named by its type (``V100M16``) or its product (``Tesla-V100-SXM2-16GB``, or
    NVML's name), case-insensitively; None if none."""
    wanted = _normalise(name)
    for openb_type, gpu in OPENB_GPUS.items():
        if wanted in (_normalise(openb_type), _normalise(gpu.product)):
            return openb_type
    return None


def resolve_product(name: str) -> SimulatedProduct:
    """The product a simulated node's GPUs are: the MIG catalog's model first, then openb's types.

    Raises :class:`UnknownGpuError` (a ``ValueError``) naming every valid choice."""
    model = find_model(name)
    if model is not None:
        return model
    openb_type = find_openb_type(name)
    if openb_type is None:
        raise UnknownGpuError(name)
    return openb_plain_gpu(openb_type)
