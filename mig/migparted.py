"""NVIDIA mig-parted configuration files (``version: v1`` / ``mig-configs``).

The schema is mig-parted's public ``api/spec/v1`` format::

    version: v1
    mig-configs:
      <name>:
        - device-filter: ["0x20B010DE"]   # optional, string or list of PCI ids
          devices: all                    # "all" or a list of GPU indices
          mig-enabled: true
          mig-devices: {"1g.5gb": 2}      # only with mig-enabled: true

Parsing is strict (unknown fields, a missing or wrong ``version``, negative counts,
``mig-devices`` on a MIG-disabled entry are errors) and ``dump_config`` writes what
``parse_config`` reads, so ``parse(dump(c)) == c``. ``check_against_catalog`` adds
the geometry check mig-parted itself only does on the node: does each entry's
``mig-devices`` fit on every GPU model its ``device-filter`` selects.

``builtin_config`` regenerates NVIDIA's published default configs (``all-disabled``,
``all-enabled``, ``all-<profile>``, ``all-<profile>.me``, ``all-balanced``) from the
catalog; the balanced mixes (2 x 1g, 1 x 2g, 1 x 3g on 7-slice GPUs, 2 x 1g + 1 x 2g
on A30) are the ones NVIDIA's default config documents.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mig.catalog import all_models, model_for_pci_device_id
from mig.errors import MigError
from mig.geometry import fits
from mig.model import GpuModel

_PCI_ID = r"^0x[0-9A-Fa-f]{8}$"


class MigConfigError(MigError):
    """A mig-parted config that cannot be parsed or does not fit the GPUs it selects."""


class MigConfigEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    device_filter: str | tuple[Annotated[str, Field(pattern=_PCI_ID)], ...] | None = Field(default=None, alias="device-filter")
    devices: Literal["all"] | tuple[Annotated[int, Field(ge=0)], ...]
    mig_enabled: bool = Field(alias="mig-enabled")
    mig_devices: dict[str, Annotated[int, Field(ge=0)]] | None = Field(default=None, alias="mig-devices")

    @field_validator("device_filter")
    @classmethod
    def _filter_format(cls, value: str | tuple[str, ...] | None) -> str | tuple[str, ...] | None:
        if isinstance(value, str) and not re.match(_PCI_ID, value):
            raise ValueError(f"device-filter {value!r} is not a PCI id like 0x20B010DE")
        return value

    @field_validator("devices")
    @classmethod
    def _unique_devices(cls, value: str | tuple[int, ...]) -> str | tuple[int, ...]:
        if not isinstance(value, str) and len(set(value)) != len(value):
            raise ValueError("devices lists a GPU index twice")
        return value

    @model_validator(mode="after")
    def _devices_need_mig(self) -> MigConfigEntry:
        if self.mig_devices and not self.mig_enabled:
            raise ValueError("mig-devices is set but mig-enabled is false")
        return self

    @property
    def pci_ids(self) -> tuple[str, ...]:
        if self.device_filter is None:
            return ()
        return (self.device_filter,) if isinstance(self.device_filter, str) else self.device_filter

    def selects(self, pci_device_id: str, index: int) -> bool:
        """Whether this entry applies to GPU ``index`` with ``pci_device_id``."""
        if self.pci_ids and pci_device_id.upper() not in {p.upper() for p in self.pci_ids}:
            return False
        return self.devices == "all" or index in self.devices


class MigPartedConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    version: Literal["v1"]
    mig_configs: dict[str, tuple[MigConfigEntry, ...]] = Field(alias="mig-configs")


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(top level)"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def parse_config(text: str) -> MigPartedConfig:
    """Parse mig-parted YAML; raises ``MigConfigError`` naming each problem and where."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MigConfigError(f"not valid YAML: {exc}") from None
    except RecursionError:  # PyYAML composes recursively: a ConfigMap nested thousands deep
        raise MigConfigError("not a mig-parted config: nested too deep") from None
    if not isinstance(data, dict):
        raise MigConfigError("a mig-parted config is a mapping with 'version: v1' and 'mig-configs'")
    try:
        return MigPartedConfig.model_validate(data)
    except ValidationError as exc:
        raise MigConfigError(f"invalid mig-parted config: {_describe(exc)}") from None


def config_to_data(config: MigPartedConfig) -> dict[str, object]:
    data = config.model_dump(by_alias=True, exclude_none=True)
    for entries in data["mig-configs"].values():
        for entry in entries:
            if isinstance(entry.get("device-filter"), tuple):
                entry["device-filter"] = list(entry["device-filter"])
            if isinstance(entry.get("devices"), tuple):
                entry["devices"] = list(entry["devices"])
    data["mig-configs"] = {name: list(entries) for name, entries in data["mig-configs"].items()}
    return data


def entries_to_data(entries: Sequence[MigConfigEntry]) -> list[dict[str, object]]:
    """One config's entries in mig-parted's wire form (lists, aliases), as a GPUNode status carries them."""
    data = config_to_data(MigPartedConfig.model_validate({"version": "v1", "mig-configs": {"entries": tuple(entries)}}))
    configs = data["mig-configs"]
    assert isinstance(configs, dict)
    return list(configs["entries"])


def dump_config(config: MigPartedConfig) -> str:
    """YAML that ``parse_config`` reads back to an equal config (keys in mig-parted's order)."""
    return yaml.safe_dump(config_to_data(config), sort_keys=False, default_flow_style=False)


def check_against_catalog(config: MigPartedConfig) -> list[str]:
    """Problems with each entry on the catalog models it selects (empty list = fine)."""
    problems: list[str] = []
    for name, entries in config.mig_configs.items():
        for position, entry in enumerate(entries):
            where = f"{name}[{position}]"
            models: list[GpuModel] = []
            for pci in entry.pci_ids:
                model = model_for_pci_device_id(pci)
                if model is None:
                    problems.append(f"{where}: device-filter {pci} is not a MIG-capable GPU in the catalog")
                else:
                    models.append(model)
            if not entry.mig_devices:
                continue
            if not entry.pci_ids:
                models = [m for m in all_models() if all(m.has_profile(p) for p in entry.mig_devices)]
                if not models:
                    problems.append(f"{where}: no catalog GPU has all of {', '.join(entry.mig_devices)}")
            for model in models:
                unknown = [p for p in entry.mig_devices if not model.has_profile(p)]
                if unknown:
                    problems.append(f"{where}: {model.product} has no profile {', '.join(unknown)}")
                    continue
                names = [p for p, count in entry.mig_devices.items() for _ in range(count)]
                if fits(model, names) is None:
                    problems.append(f"{where}: {', '.join(f'{c}x{p}' for p, c in entry.mig_devices.items())} does not fit on {model.product}")
    return problems


def _families() -> list[tuple[tuple[str, ...], GpuModel]]:
    """Models grouped by identical profile tables: (PCI ids, a representative)."""
    groups: dict[tuple[object, ...], list[GpuModel]] = {}
    for model in all_models():
        groups.setdefault(tuple(model.profiles), []).append(model)
    return [(tuple(pci for m in members for pci in m.pci_device_ids), members[0]) for members in groups.values()]


def _balanced(model: GpuModel) -> dict[str, int]:
    by_shape = {(p.compute_slices, p.memory_slices, p.media_extensions): p.name for p in model.profiles}
    if model.compute_slices == 4:  # A30
        return {by_shape[(1, 1, False)]: 2, by_shape[(2, 2, False)]: 1}
    # NVIDIA's config gives H100 NVL one 1g instance instead of two (mig-parted's
    # Hopper/Blackwell example config); every other 7-slice GPU gets two.
    ones = 1 if model.product == "NVIDIA-H100-NVL" else 2
    return {by_shape[(1, 1, False)]: ones, by_shape[(2, 2, False)]: 1, by_shape[(3, 4, False)]: 1}


def builtin_configs() -> MigPartedConfig:
    """NVIDIA's default mig-parted configs, generated for every model in the catalog."""
    configs: dict[str, list[MigConfigEntry]] = {
        "all-disabled": [MigConfigEntry(devices="all", mig_enabled=False)],
        "all-enabled": [MigConfigEntry(devices="all", mig_enabled=True, mig_devices={})],
    }
    for pci_ids, model in _families():
        for profile in model.profiles:
            count = 0
            while fits(model, [profile.name] * (count + 1)) is not None:
                count += 1
            key = f"all-{profile.name.replace('+me', '')}" + (".me" if profile.media_extensions else "")
            entry = MigConfigEntry(device_filter=pci_ids, devices="all", mig_enabled=True, mig_devices={profile.name: count})
            configs.setdefault(key, []).append(entry)
        configs.setdefault("all-balanced", []).append(
            MigConfigEntry(device_filter=pci_ids, devices="all", mig_enabled=True, mig_devices=_balanced(model))
        )
    return MigPartedConfig(version="v1", mig_configs={k: tuple(v) for k, v in configs.items()})


def builtin_config_names() -> list[str]:
    return list(builtin_configs().mig_configs)


def builtin_config(name: str) -> tuple[MigConfigEntry, ...]:
    """Entries of one named default config; raises ``MigConfigError`` listing the names."""
    configs = builtin_configs().mig_configs
    if name not in configs:
        raise MigConfigError(f"unknown mig-parted config {name!r}; built-in configs: {', '.join(configs)}")
    return configs[name]


def layout_for(entries: Sequence[MigConfigEntry], model: GpuModel, index: int = 0) -> list[str] | None:
    """The profile multiset a config gives GPU ``index`` of ``model``; None = MIG disabled."""
    for entry in entries:
        if any(entry.selects(pci, index) for pci in model.pci_device_ids):
            if not entry.mig_enabled:
                return None
            return [p for p, c in (entry.mig_devices or {}).items() for _ in range(c)]
    raise MigConfigError(f"no entry of the config selects GPU {index} ({model.product})")
