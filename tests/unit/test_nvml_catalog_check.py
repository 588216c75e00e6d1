"""The read-only catalog check, on the simulated backend (which serves the catalog's own table)."""

from __future__ import annotations

from dataclasses import replace

from mig.catalog import get_model
from node.nvml.catalog_check import check_gpu, compare_profiles
from node.nvml.simulated import SimulatedNvml


def test_simulated_gpu_matches_its_catalog_entry() -> None:
    report = check_gpu(SimulatedNvml(get_model("H100"), 1), 0)
    assert report.model is not None and report.model.product == "NVIDIA-H100-80GB-HBM3"
    assert report.mismatches == () and len(report.profiles) == len(report.model.profiles)


def test_differences_are_named() -> None:
    model = get_model("A100-40GB")
    profiles = list(SimulatedNvml(model, 1).instance_profiles(0))
    profiles[0] = replace(profiles[0], placements=profiles[0].placements[:-1], memory_mib=profiles[0].memory_mib * 2)
    profiles.append(replace(profiles[1], name="1g.5gb+gfx"))
    del profiles[2]
    problems = compare_profiles(model, tuple(profiles))
    text = "\n".join(problems)
    assert "1g.5gb: placements" in text and "1g.5gb: memory" in text
    assert "1g.5gb+gfx" in text and "not in the catalog" in text
    assert f"catalog profile {model.profiles[2].name} is not offered" in text


def test_mig_off_is_a_note_not_an_error() -> None:
    report = check_gpu(SimulatedNvml(get_model("H200"), 1, mig_enabled=False), 0)
    assert report.profiles == () and report.mismatches == ()
    assert any("MIG mode is off" in n for n in report.notes)
