"""mig-parted config parsing: table tests of valid and invalid YAML."""

from __future__ import annotations

import pytest

from mig.catalog import get_model
from mig.migparted import MigConfigError, builtin_config, check_against_catalog, layout_for, parse_config

VALID = {
    "nvidia-style": """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  custom:
    - device-filter: ["0x20B010DE", "0x20B110DE"]
      devices: [0, 1, 2, 3]
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7
    - device-filter: "0x20B010DE"
      devices: [4, 5, 6, 7]
      mig-enabled: true
      mig-devices:
        "3g.20gb": 2
""",
    "empty-mig-devices": """
version: v1
mig-configs:
  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}
""",
}

INVALID = {
    "missing-version": ("mig-configs: {a: [{devices: all, mig-enabled: false}]}", "version"),
    "wrong-version": ("version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}", "version"),
    "unknown-field": ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, colour: red}]}", "colour"),
    "negative-count": ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {1g.5gb: -1}}]}", "greater than or equal to 0"),
    "devices-without-mig": ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, mig-devices: {1g.5gb: 1}}]}", "mig-enabled is false"),
    "bad-devices": ("version: v1\nmig-configs: {a: [{devices: some, mig-enabled: false}]}", "devices"),
    "duplicate-device": ("version: v1\nmig-configs: {a: [{devices: [1, 1], mig-enabled: false}]}", "twice"),
    "bad-filter": ("version: v1\nmig-configs: {a: [{device-filter: A100, devices: all, mig-enabled: false}]}", "PCI id"),
    "not-yaml": ("version: [v1", "not valid YAML"),
    "not-a-mapping": ("- 1\n- 2", "mapping"),
}


@pytest.mark.parametrize("text", VALID.values(), ids=list(VALID))
def test_valid_configs_parse(text: str) -> None:
    config = parse_config(text)
    assert config.version == "v1"


@pytest.mark.parametrize(("text", "message"), INVALID.values(), ids=list(INVALID))
def test_invalid_configs_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(MigConfigError, match=message):
        parse_config(text)


def test_catalog_check_finds_layouts_that_do_not_fit() -> None:
    config = parse_config("""
version: v1
mig-configs:
  too-much:
    - device-filter: ["0x20B010DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"4g.20gb": 2}
  wrong-model:
    - device-filter: ["0x233010DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 1}
""")
    problems = check_against_catalog(config)
    assert any("does not fit on NVIDIA-A100-SXM4-40GB" in p for p in problems)
    assert any("NVIDIA-H100-80GB-HBM3 has no profile 1g.5gb" in p for p in problems)


def test_builtin_all_balanced_per_model() -> None:
    entries = builtin_config("all-balanced")
    assert sorted(layout_for(entries, get_model("A100-40GB")) or []) == ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
    assert sorted(layout_for(entries, get_model("A30")) or []) == ["1g.6gb", "1g.6gb", "2g.12gb"]
    assert layout_for(builtin_config("all-disabled"), get_model("H100")) is None
    assert layout_for(builtin_config("all-1g.10gb"), get_model("A100-40GB")) == ["1g.10gb"] * 4
    assert layout_for(builtin_config("all-1g.10gb"), get_model("H100")) == ["1g.10gb"] * 7
    with pytest.raises(MigConfigError, match="built-in configs: all-disabled"):
        builtin_config("all-nonsense")


# NVIDIA's published default configs, written out in their format: the
# device filters and counts of mig-parted's Hopper/Blackwell example config
# (all-balanced) and the per-profile configs every GPU Operator ships.
NVIDIA_DEFAULTS = """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
  all-3g.71gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "3g.71gb": 2
  all-balanced:
    - device-filter: ["0x290110DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.23gb": 2
        "2g.45gb": 1
        "3g.90gb": 1
    - device-filter: ["0x233510DE", "0x233B10DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.18gb": 2
        "2g.35gb": 1
        "3g.71gb": 1
    - device-filter: ["0x233110DE", "0x233010DE", "0x232210DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 2
        "2g.20gb": 1
        "3g.40gb": 1
    - device-filter: ["0x232110DE", "0x233A10DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.12gb": 1
        "2g.24gb": 1
        "3g.47gb": 1
    - device-filter: ["0x20B010DE", "0x20B110DE", "0x20F110DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 2
        "2g.10gb": 1
        "3g.20gb": 1
    - device-filter: ["0x20B210DE", "0x20B510DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 2
        "2g.20gb": 1
        "3g.40gb": 1
    - device-filter: "0x20B710DE"
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.6gb": 2
        "2g.12gb": 1
"""


def test_nvidia_default_configs_round_trip_and_match_the_generated_ones() -> None:
    import yaml

    from mig.catalog import all_models
    from mig.migparted import dump_config

    config = parse_config(NVIDIA_DEFAULTS)
    assert parse_config(dump_config(config)) == config
    assert yaml.safe_load(dump_config(config)) == yaml.safe_load(NVIDIA_DEFAULTS)
    # The catalog check reports exactly what is true of NVIDIA's file: the unfiltered
    # all-1g.10gb cannot apply to an A100 40GB (whose 1g.10gb is the 2-slice profile,
    # at most 4), and the H800 device ids are not in gpupack's catalog.
    assert check_against_catalog(config) == [
        "all-1g.10gb[0]: 7x1g.10gb does not fit on NVIDIA-A100-SXM4-40GB",
        "all-1g.10gb[0]: 7x1g.10gb does not fit on NVIDIA-A100-PCIE-40GB",
        "all-balanced[2]: device-filter 0x232210DE is not a MIG-capable GPU in the catalog",
        "all-balanced[3]: device-filter 0x233A10DE is not a MIG-capable GPU in the catalog",
    ]
    published = config.mig_configs["all-balanced"]
    generated = builtin_config("all-balanced")
    for model in all_models():
        if any(entry.selects(pci, 0) for entry in published for pci in model.pci_device_ids):
            assert sorted(layout_for(published, model) or []) == sorted(layout_for(generated, model) or []), model.product
    h100 = get_model("H100")
    assert layout_for(config.mig_configs["all-1g.10gb"], h100) == layout_for(builtin_config("all-1g.10gb"), h100)
