"""gpupack's DRA device names read back: which GPU, which kind, which MIG profile and placement.

``sharing.dra.names`` writes the names (``gpu-0``, ``gpu-0-shared``,
``gpu-0-mig-1g-10gb-me-3``); nothing there reads them, so the parser lives
here, beside the plugin that needs it. A device name spells the MIG profile as
a DNS label (``1g.10gb+me`` -> ``1g-10gb-me``), which loses the dots and the
``+``; :func:`resolve_profile` maps the label back to NVIDIA's name among the
profiles the GPU offers (the label is unique within a model's table: two
profiles whose names differ only in ``.``/``+``/``-`` would be one device name,
which the device model would already have published twice).

Pure: no NVML, no Kubernetes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from sharing.dra.names import DeviceKind, gpu_device_name, label, mig_device_name, shared_device_name

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
