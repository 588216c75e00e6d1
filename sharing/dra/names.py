"""Every name gpupack's DRA driver publishes: defined here once.

The driver is ``gpu.gpupack.io``. Attributes and capacities carry the
driver's domain in full (``gpu.gpupack.io/profile``): a claim's capacity
request names a capacity exactly as the device spells it (the allocator looks
the request's key up in the device's capacity map), so there is one spelling
everywhere. In CEL they read ``device.attributes["gpu.gpupack.io"].profile``
and ``device.capacity["gpu.gpupack.io"].memory``.

Device, counter-set and counter names are DNS labels; a MIG profile name has
dots and may have ``+`` (``1g.10gb+me``), which :func:`label` turns into ``-``
(``1g-10gb-me``). Slice names are ``<node>-gpu.gpupack.io-<role>-<nnn>``;
kube-scheduler's allocator visits a pool's slices in name order and takes the
first device that fits, so the zero-padded number keeps GPU order.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

from sharing.dra.limits import MAX_LABEL, MAX_SUBDOMAIN

DRIVER: Final = "gpu.gpupack.io"
API_VERSION: Final = "resource.k8s.io/v1"

DeviceKind = Literal["mig", "gpu", "shared"]
"""``mig``: a MIG placement of a GPU in dynamic mode; ``gpu``: a whole GPU, one claim;
``shared``: a GPU shared by several claims (consumable capacity)."""
KINDS: Final[tuple[DeviceKind, ...]] = ("mig", "gpu", "shared")

SharingKind = Literal["mps", "time-slicing"]
"""How a shared GPU is shared: MPS (per-claim compute and memory limits) or time-slicing (none)."""


def qualified(name: str) -> str:
    """``name`` in the driver's domain: ``profile`` -> ``gpu.gpupack.io/profile``."""
    return f"{DRIVER}/{name}"


# ------------------------------------------------------------------ attributes
KIND: Final = qualified("kind")
"""string: ``mig``, ``gpu`` or ``shared`` (what the DeviceClasses select on)."""
PRODUCT: Final = qualified("product")
"""string: the GPU model as GPU feature discovery names it (``NVIDIA-H100-80GB-HBM3``)."""
UUID: Final = qualified("uuid")
"""string: the GPU's UUID (for a MIG placement, its parent GPU's: the instance is created at prepare)."""
INDEX: Final = qualified("index")
"""int: the GPU's index on its node."""
PROFILE: Final = qualified("profile")
"""string, MIG: the profile as NVIDIA names it (``3g.40gb``)."""
PLACEMENT_START: Final = qualified("placementStart")
"""int, MIG: the first memory slice of the placement (NVML's ``start``)."""
PLACEMENT_SIZE: Final = qualified("placementSize")
"""int, MIG: memory slices of the placement (NVML's ``size``)."""
COMPUTE_SLICES: Final = qualified("computeSlices")
"""int, MIG: the profile's compute slices (7 make an H100)."""
MEDIA_EXTENSIONS: Final = qualified("mediaExtensions")
"""bool, MIG: a ``+me`` profile, which owns the GPU's one set of media extensions."""
SHARING: Final = qualified("sharing")
"""string, shared: ``mps`` or ``time-slicing``."""

# ------------------------------------------------------------------ capacities
MEMORY: Final = qualified("memory")
"""Every device: GPU memory in bytes (a MIG placement's usable memory)."""
MILLI: Final = qualified("milli")
"""Shared devices: thousandths of the GPU's compute, 1000 per GPU (the request API's unit)."""

# ------------------------------------------------------------------ counters
COMPUTE_COUNTER: Final = "compute-slices"
MEDIA_COUNTER: Final = "media-extensions"


def memory_slice_counter(slice_index: int) -> str:
    return f"memory-slice-{slice_index}"


def counter_set_name(gpu_index: int) -> str:
    return f"gpu-{gpu_index}"


# ------------------------------------------------------------------ devices
def label(text: str) -> str:
    """``text`` as DNS-label characters: lower case, anything but ``[a-z0-9-]`` becomes ``-``."""
    return re.sub(r"[^a-z0-9-]", "-", text.lower())


def gpu_device_name(gpu_index: int) -> str:
    """A whole GPU (MIG disabled or the full placement's alternative): ``gpu-0``."""
    return f"gpu-{gpu_index}"


def mig_device_name(gpu_index: int, profile: str, start: int) -> str:
    """A MIG placement: ``gpu-0-mig-1g-10gb-me-3`` for ``1g.10gb+me`` at memory slice 3."""
    return f"gpu-{gpu_index}-mig-{label(profile)}-{start}"


def shared_device_name(gpu_index: int) -> str:
    """A shared GPU: ``gpu-0-shared``."""
    return f"gpu-{gpu_index}-shared"


# ------------------------------------------------------------------ slices
SliceRole = Literal["counters", "devices"]
SLICE_NUMBER_WIDTH: Final = 3
"""Slice numbers are zero-padded to this width, so name order is number order."""


def slice_name(node: str, role: SliceRole, number: int) -> str:
    """``<node>-gpu.gpupack.io-<role>-<nnn>``; a node name too long for that is cut and a hash
    of it added, so every node's names stay distinct and within 253 characters."""
    suffix = f"-{DRIVER}-{role}-{number:0{SLICE_NUMBER_WIDTH}d}"
    if len(node) + len(suffix) <= MAX_SUBDOMAIN:
        return node + suffix
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    keep = MAX_SUBDOMAIN - len(suffix) - len(digest) - 1
    return f"{node[:keep].rstrip('.-')}-{digest}{suffix}"


# ------------------------------------------------------------------ DeviceClasses
MIG_CLASS: Final = "gpupack-mig"
GPU_CLASS: Final = "gpupack-gpu"
SHARED_CLASS: Final = "gpupack-shared"
CLASS_OF_KIND: Final[dict[DeviceKind, str]] = {"mig": MIG_CLASS, "gpu": GPU_CLASS, "shared": SHARED_CLASS}


def class_selector(kind: DeviceKind) -> str:
    """The CEL selector of the DeviceClass for ``kind`` (``&&`` stops at another driver's device,
    which has no ``kind`` attribute in gpupack's domain)."""
    return f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].kind == "{kind}"'


# ------------------------------------------------------------------ formats
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_dns_label(text: str) -> bool:
    return len(text) <= MAX_LABEL and _LABEL.match(text) is not None


def is_dns_subdomain(text: str) -> bool:
    return 0 < len(text) <= MAX_SUBDOMAIN and all(_LABEL.match(part) for part in text.split("."))


def is_c_identifier(text: str) -> bool:
    return _C_IDENTIFIER.match(text) is not None


# ------------------------------------------------------------------ reading names back
# A device name spells the MIG profile as a DNS label (``1g.10gb+me`` -> ``1g-10gb-me``), which loses
# the dots and the ``+``; :func:`resolve_profile` maps the label back to NVIDIA's name among the
# profiles the GPU offers (the label is unique within a model's table: two profiles whose names differ
# only in ``.``/``+``/``-`` would be one device name, which the device model would already have
# published twice). The kubelet plugin and the live-agreement check read names with these.
MAX_GPU_INDEX = 1023
"""Far above any node's GPU count: a larger index is a malformed name, not a GPU to look up."""

_GPU = re.compile(r"^gpu-(0|[1-9][0-9]{0,3})$")
_SHARED = re.compile(r"^gpu-(0|[1-9][0-9]{0,3})-shared$")
_MIG = re.compile(r"^gpu-(0|[1-9][0-9]{0,3})-mig-([a-z0-9]+(?:-[a-z0-9]+)*)-(0|[1-9][0-9]?)$")


class DeviceNameError(ValueError):
    """A device name gpupack's driver never publishes; the message shows the three forms."""


@dataclass(frozen=True)
class DeviceName:
    """A parsed device name. ``profile_label`` and ``start`` are set for ``mig`` devices only."""

    kind: DeviceKind
    gpu: int
    profile_label: str | None = None
    start: int | None = None

    def __str__(self) -> str:
        if self.kind == "mig":
            assert self.profile_label is not None and self.start is not None
            return mig_device_name(self.gpu, self.profile_label, self.start)
        return shared_device_name(self.gpu) if self.kind == "shared" else gpu_device_name(self.gpu)


def parse_device_name(name: str) -> DeviceName:
    """``gpu-0-mig-1g-10gb-me-3`` -> ``DeviceName("mig", 0, "1g-10gb-me", 3)``; raises ``DeviceNameError``."""
    if not isinstance(name, str) or len(name) > 128:
        raise DeviceNameError(f"device name {str(name)[:128]!r} is not one of gpupack's")
    if match := _GPU.match(name):
        return DeviceName("gpu", int(match.group(1)))
    if match := _SHARED.match(name):
        return DeviceName("shared", int(match.group(1)))
    if match := _MIG.match(name):
        return DeviceName("mig", int(match.group(1)), match.group(2), int(match.group(3)))
    raise DeviceNameError(
        f"device name {name!r} is not one of gpupack's: expected gpu-<index> (a whole GPU), "
        "gpu-<index>-shared (a shared GPU) or gpu-<index>-mig-<profile>-<start> (a MIG placement, "
        "e.g. gpu-0-mig-1g-10gb-6)")


def resolve_profile(profile_label: str, profile_names: Iterable[str]) -> str | None:
    """NVIDIA's name of the profile whose device-name spelling is ``profile_label``, or None."""
    for name in profile_names:
        if label(name) == profile_label:
            return name
    return None
