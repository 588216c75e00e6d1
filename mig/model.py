"""Value types of the MIG domain: GPU models, profiles, placements and instances.

These are gpupack's own types (not NVML's): frozen, hashable and cheap to compare,
so the geometry functions can cache on them.

Units: a GPU's memory is split into ``memory_slices`` equal slices (8 on A100/H100/
H200/B200, 4 on A30) and its compute into ``compute_slices`` (7, or 4 on A30).
A placement is NVML's ``(start, size)`` in memory slices, exactly what
``nvmlDeviceGetGpuInstancePossiblePlacements`` returns and what
``nvmlDeviceCreateGpuInstanceWithPlacement`` takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mig.errors import UnknownProfileError

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
"""The device plugin's MIG resources (``mixed`` strategy) are this followed by the profile name."""


@dataclass(frozen=True, order=True)
class Placement:
    """Where an instance sits: ``size`` memory slices starting at slice ``start``."""

    start: int
    size: int

    @property
    def end(self) -> int:
        """One past the last memory slice used."""
        return self.start + self.size

    @property
    def mask(self) -> int:
        """Bit mask of the memory slices used (bit i = slice i)."""
        return ((1 << self.size) - 1) << self.start

    def __str__(self) -> str:
        return f"{self.start}:{self.size}"


@dataclass(frozen=True)
class Profile:
    """One MIG GPU-instance profile of one GPU model.

    ``name`` is the name the NVIDIA device plugin advertises under the mixed
    strategy (``nvidia.com/mig-<name>``), e.g. ``1g.10gb`` or ``1g.10gb+me``.
    ``profile_id`` is the id ``nvidia-smi mig -lgip`` shows and ``-cgi`` takes
    (NVML ``nvmlGpuInstanceProfileInfo_t.id``); ``nvml_index`` is the
    ``NVML_GPU_INSTANCE_PROFILE_*`` constant passed to
    ``nvmlDeviceGetGpuInstanceProfileInfo``.
    """

    name: str
    profile_id: int
    nvml_index: int
    compute_slices: int
    memory_slices: int
    memory_mib: int
    max_count: int
    placements: tuple[Placement, ...]
    media_extensions: bool = False
    """True for ``+me`` profiles: the instance owns the GPU's one set of media
    extensions (JPEG decoder, OFA), so at most one such instance fits per GPU."""

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 1024 * 1024

    @property
    def resource_name(self) -> str:
        """Extended resource the device plugin advertises (mixed strategy)."""
        return MIG_RESOURCE_PREFIX + self.name


@dataclass(frozen=True)
class GpuModel:
    """A MIG-capable GPU model and its profile table."""

    product: str
    """Canonical name as GPU feature discovery publishes it in ``nvidia.com/gpu.product``."""
    display_name: str
    """Marketing name as NVML's ``nvmlDeviceGetName`` reports it."""
    pci_device_ids: tuple[str, ...]
    """mig-parted ``device-filter`` values: ``0x<device><vendor>``, e.g. ``0x20B010DE``."""
    memory_mib: int
    compute_slices: int
    memory_slices: int
    profiles: tuple[Profile, ...]
    aliases: tuple[str, ...] = ()
    source: str = ""
    """Where the profile table comes from, and what in it is inferred."""
    _by_name: dict[str, Profile] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        for profile in self.profiles:
            self._by_name[profile.name] = profile
        # Geometry functions cache on the model; hashing every nested field on
        # every call would cost more than the cached search itself.
        object.__setattr__(self, "_hash", hash((self.product, self.compute_slices, self.memory_slices, self.profiles)))

    def __hash__(self) -> int:
        cached: int = self.__dict__["_hash"]
        return cached

    def profile(self, name: str) -> Profile:
        """The profile called ``name``; raises ``UnknownProfileError`` naming the valid ones."""
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownProfileError(name, self.product, self.profile_names) from None

    def has_profile(self, name: str) -> bool:
        return name in self._by_name

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.profiles)



@dataclass(frozen=True, order=True)
class PlacedInstance:
    """A GPU instance of ``profile`` (by name) at ``placement``."""

    profile: str
    placement: Placement

    def __str__(self) -> str:
        return f"{self.profile}@{self.placement}"
