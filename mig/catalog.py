"""The catalog of MIG-capable GPU models and their GPU-instance profiles.

Sources (facts, not code):

* NVIDIA Multi-Instance GPU User Guide, section "Supported MIG Profiles"
  (docs.nvidia.com/datacenter/tesla/mig-user-guide): profile names, compute and
  memory fractions, maximum instance counts, and the placement diagrams
  (``nvidia-smi mig -lgipp`` output) for A30, A100, H100, H200, GH200, B200.
* The profile ids (``nvidia-smi mig -lgip`` "ID" column) and the NVML
  ``NVML_GPU_INSTANCE_PROFILE_*`` indices come from the same guide and from
  ``nvml.h`` as shipped in nvidia-ml-py.
* PCI device ids are those NVIDIA's mig-parted default configuration lists in
  its ``device-filter`` entries, written as ``0x<device><vendor>``.
* GFD product names are NVML's ``nvmlDeviceGetName`` with spaces replaced by
  ``-`` (how GPU feature discovery fills ``nvidia.com/gpu.product``).

GPU feature discovery's ``nvidia.com/gpu.memory`` label on an A100 80GB PCIe in
MIG mode (1g.10gb) reads 9728 MiB, which matches the table below.

Memory sizes: ``memory_mib`` is the usable memory of an instance as
``nvidia-smi mig -lgip`` reports it, where the guide shows that output (A100
40GB, A100 80GB, H100 80GB). For the other models it is *inferred*: the
profile's memory slices times the one-slice size, scaled from the nominal size in
the profile name; each such model says so in ``source``. The node agent always
reads the real sizes from NVML on a real GPU, and ``tools/nvml_readonly_check.py``
compares them with this table.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache

from mig.errors import UnknownModelError
from mig.model import GpuModel, Placement, Profile

# NVML_GPU_INSTANCE_PROFILE_* indices (nvml.h).
_IDX_1 = 0
_IDX_2 = 1
_IDX_3 = 2
_IDX_4 = 3
_IDX_7 = 4
_IDX_1_REV1 = 7  # 1 slice + media extensions (+me)
_IDX_2_REV1 = 8  # 2 slices + media extensions (A30 2g+me)
_IDX_1_REV2 = 9  # 1 compute slice with 2 memory slices (e.g. 1g.20gb)


def _gib(value: float) -> int:
    """GiB as nvidia-smi prints them (two decimals) to MiB, rounded down."""
    return int(value * 1024)


def _placements(starts: Iterable[int], size: int) -> tuple[Placement, ...]:
    return tuple(Placement(start, size) for start in starts)


def _seven_slice_profiles(
    one: str, one_me: str, one_double: str, two: str, three: str, four: str, seven: str,
    mem_1: int, mem_2: int, mem_4: int, mem_8: int,
) -> tuple[Profile, ...]:
    """Profile table of the 7-compute-slice / 8-memory-slice GPUs (A100, H100, H200, GH200, B200).

    The geometry (ids, slices, maximum counts, placements) is the same on all of
    them; only the names and memory sizes differ. Placements per the guide's
    ``-lgipp`` diagrams: 1-slice profiles start at 0..6, 2-slice at 0,2,4 (and
    the 1g double-memory profile at 0,2,4,6), 3g at 0 or 4, 4g and 7g at 0.
    """
    return (
        Profile(one, 19, _IDX_1, 1, 1, mem_1, 7, _placements(range(7), 1)),
        Profile(one_me, 20, _IDX_1_REV1, 1, 1, mem_1, 1, _placements(range(7), 1), media_extensions=True),
        Profile(one_double, 15, _IDX_1_REV2, 1, 2, mem_2, 4, _placements((0, 2, 4, 6), 2)),
        Profile(two, 14, _IDX_2, 2, 2, mem_2, 3, _placements((0, 2, 4), 2)),
        Profile(three, 9, _IDX_3, 3, 4, mem_4, 2, _placements((0, 4), 4)),
        Profile(four, 5, _IDX_4, 4, 4, mem_4, 1, _placements((0,), 4)),
        Profile(seven, 0, _IDX_7, 7, 8, mem_8, 1, _placements((0,), 8)),
    )


def _a30_profiles() -> tuple[Profile, ...]:
    """A30: 4 compute slices, 4 memory slices of 6 GB; ids per the guide's A30 table."""
    return (
        Profile("1g.6gb", 14, _IDX_1, 1, 1, _gib(5.81), 4, _placements(range(4), 1)),
        Profile("1g.6gb+me", 21, _IDX_1_REV1, 1, 1, _gib(5.81), 1, _placements(range(4), 1), media_extensions=True),
        Profile("2g.12gb", 5, _IDX_2, 2, 2, _gib(11.75), 2, _placements((0, 2), 2)),
        Profile("2g.12gb+me", 6, _IDX_2_REV1, 2, 2, _gib(11.75), 1, _placements((0, 2), 2), media_extensions=True),
        Profile("4g.24gb", 0, _IDX_4, 4, 4, _gib(23.62), 1, _placements((0,), 4)),
    )


_GUIDE = "NVIDIA MIG User Guide, 'Supported MIG Profiles'"
_INFERRED = " Memory sizes inferred (slices x nominal slice size), not read from a real GPU."


def _build_catalog() -> tuple[GpuModel, ...]:
    a100_40 = _seven_slice_profiles(
        "1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb",
        _gib(4.75), _gib(9.62), _gib(19.50), _gib(39.25),
    )
    a100_80 = _seven_slice_profiles(
        "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
        _gib(9.50), _gib(19.50), _gib(39.25), _gib(78.75),
    )
    h100_80 = _seven_slice_profiles(
        "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
        _gib(9.75), _gib(19.62), _gib(39.50), _gib(79.25),
    )
    h100_94 = _seven_slice_profiles(
        "1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb",
        _gib(11.0), _gib(22.0), _gib(44.0), _gib(88.0),
    )
    gh200_96 = _seven_slice_profiles(
        "1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb",
        _gib(11.25), _gib(22.5), _gib(45.0), _gib(90.0),
    )
    h200_141 = _seven_slice_profiles(
        "1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
        _gib(16.5), _gib(32.5), _gib(65.5), _gib(131.0),
    )
    gb200_189 = _seven_slice_profiles(
        "1g.24gb", "1g.24gb+me", "1g.47gb", "2g.47gb", "3g.95gb", "4g.95gb", "7g.189gb",
        _gib(22.0), _gib(44.0), _gib(88.0), _gib(176.0),
    )
    b200_180 = _seven_slice_profiles(
        "1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb",
        _gib(21.0), _gib(42.0), _gib(84.0), _gib(168.0),
    )
    return (
        GpuModel("NVIDIA-A30", "NVIDIA A30", ("0x20B710DE",), 24576, 4, 4, _a30_profiles(),
                 aliases=("A30", "A30-24GB"), source=_GUIDE + " (A30)." + _INFERRED),
        GpuModel("NVIDIA-A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", ("0x20B010DE",), 40960, 7, 8, a100_40,
                 aliases=("A100-40GB", "A100-SXM4-40GB", "A100-40"), source=_GUIDE + " (A100 40GB); lgip sizes shown there."),
        GpuModel("NVIDIA-A100-PCIE-40GB", "NVIDIA A100-PCIE-40GB", ("0x20B110DE", "0x20F110DE"), 40960, 7, 8, a100_40,
                 aliases=("A100-PCIE-40GB", "A100-40GB-PCIE"), source=_GUIDE + " (A100 40GB)."),
        GpuModel("NVIDIA-A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", ("0x20B210DE",), 81920, 7, 8, a100_80,
                 aliases=("A100-80GB", "A100-SXM4-80GB", "A100-80"), source=_GUIDE + " (A100 80GB)."),
        GpuModel("NVIDIA-A100-80GB-PCIe", "NVIDIA A100 80GB PCIe", ("0x20B510DE",), 81920, 7, 8, a100_80,
                 aliases=("A100-80GB-PCIE", "A100-PCIE-80GB"), source=_GUIDE + " (A100 80GB)."),
        GpuModel("NVIDIA-H100-80GB-HBM3", "NVIDIA H100 80GB HBM3", ("0x233010DE",), 81559, 7, 8, h100_80,
                 aliases=("H100", "H100-80GB", "H100-SXM", "H100-SXM5-80GB"), source=_GUIDE + " (H100 80GB)."),
        GpuModel("NVIDIA-H100-PCIe", "NVIDIA H100 PCIe", ("0x233110DE",), 81559, 7, 8, h100_80,
                 aliases=("H100-PCIE", "H100-80GB-PCIE"), source=_GUIDE + " (H100 80GB)."),
        GpuModel("NVIDIA-H100-NVL", "NVIDIA H100 NVL", ("0x232110DE",), 95830, 7, 8, h100_94,
                 aliases=("H100-NVL", "H100-94GB"), source=_GUIDE + " (H100 94GB)." + _INFERRED),
        GpuModel("NVIDIA-H200", "NVIDIA H200", ("0x233510DE",), 143771, 7, 8, h200_141,
                 aliases=("H200", "H200-141GB", "H200-SXM"), source=_GUIDE + " (H200 141GB)." + _INFERRED),
        GpuModel("NVIDIA-H200-NVL", "NVIDIA H200 NVL", ("0x233B10DE",), 143771, 7, 8, h200_141,
                 aliases=("H200-NVL",), source=_GUIDE + " (H200 141GB)." + _INFERRED),
        GpuModel("NVIDIA-GH200-480GB", "NVIDIA GH200 480GB", ("0x234210DE",), 97871, 7, 8, gh200_96,
                 aliases=("GH200", "GH200-96GB"), source=_GUIDE + " (GH200 96GB)." + _INFERRED),
        GpuModel("NVIDIA-B200", "NVIDIA B200", ("0x290110DE",), 183359, 7, 8, b200_180,
                 aliases=("B200", "B200-180GB"), source=_GUIDE + " (B200)." + _INFERRED),
        GpuModel("NVIDIA-GB200", "NVIDIA GB200", ("0x294110DE",), 189471, 7, 8, gb200_189,
                 aliases=("GB200", "GB200-HGX"),
                 source="Profile names from NVIDIA mig-parted's Hopper/Blackwell example config (GB200 HGX); "
                        "geometry as the other 7-slice GPUs." + _INFERRED),
    )


CATALOG: tuple[GpuModel, ...] = _build_catalog()


def _normalise(name: str) -> str:
    return name.strip().replace(" ", "-").replace("_", "-").upper()


def _strip_gfd_suffixes(name: str) -> str:
    """GFD appends ``-MIG-<profile>`` (single strategy) and ``-SHARED`` (renamed sharing)."""
    upper = name.upper()
    if upper.endswith("-SHARED"):
        name = name[: -len("-SHARED")]
    mig_at = name.upper().find("-MIG-")
    if mig_at >= 0:
        name = name[:mig_at]
    return name


@cache
def _index() -> dict[str, GpuModel]:
    index: dict[str, GpuModel] = {}
    for model in CATALOG:
        for key in (model.product, model.display_name, *model.aliases):
            index.setdefault(_normalise(key), model)
    return index


def all_models() -> tuple[GpuModel, ...]:
    return CATALOG


def model_names() -> list[str]:
    """Product names and aliases, for error messages and ``--help``."""
    names: list[str] = []
    for model in CATALOG:
        names.append(model.product)
        names.extend(model.aliases)
    return names


def find_model(name: str) -> GpuModel | None:
    """The model for a GFD product name, an NVML name or an alias; None if unknown."""
    index = _index()
    model = index.get(_normalise(name))
    if model is None:
        model = index.get(_normalise(_strip_gfd_suffixes(name.strip())))
    return model


def get_model(name: str) -> GpuModel:
    """Like ``find_model`` but raises ``UnknownModelError`` listing the valid names."""
    model = find_model(name)
    if model is None:
        raise UnknownModelError(name, model_names())
    return model


# The name other packages were told to use; same function.
resolve_model = get_model


def model_for_pci_device_id(device_id: str | int) -> GpuModel | None:
    """Model for a PCI device id: ``0x20B010DE`` (mig-parted form), ``0x20B0`` or an int."""
    if isinstance(device_id, int):
        text = f"0x{device_id:04X}"
    else:
        text = device_id.strip().upper().replace("0X", "0x", 1)
    if not text.startswith("0x"):
        text = "0x" + text
    if len(text) == 6:  # bare device id: add NVIDIA's vendor id
        text = text + "10DE"
    wanted = text.upper()
    for model in CATALOG:
        if any(pci.upper() == wanted for pci in model.pci_device_ids):
            return model
    return None
