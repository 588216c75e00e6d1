"""The plugin's claim journal (node.draplugin.journal): records survive a round trip through their
file, a restart's decision per phase, which instance an undo may destroy, and unreadable files."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from mig.model import Placement
from node.draplugin.claims import ClaimRef
from node.draplugin.journal import (
    ClaimJournal,
    ClaimRecord,
    DeviceRecord,
    Phase,
    Recovery,
    instance_to_undo,
    recovery,
)
from node.draplugin.mps import MpsLimits
from node.nvml.protocol import GpuInstance

CLAIM = ClaimRef("uid-1", "ml", "train")
PLANNED = DeviceRecord("gpu", "node-a", "gpu-0-mig-3g-40gb-4", "mig", 0, "GPU-0", profile="3g.40gb", profile_id=9,
                       placement=Placement(4, 4))
CREATING = replace(PLANNED, creating=True)
CREATED = replace(PLANNED, gi_id=2, uuid="MIG-b", created=True)
ADOPTED = replace(PLANNED, gi_id=2, uuid="MIG-b", created=False)
SHARED = DeviceRecord("s", "node-a", "gpu-1-shared", "shared", 1, "GPU-1", share_id="x", mps=MpsLimits(30, 20480))

OURS = GpuInstance(2, 9, "3g.40gb", Placement(4, 4), "MIG-b")
SAME_ID_OTHER_UUID = GpuInstance(2, 9, "3g.40gb", Placement(4, 4), "MIG-new")
OTHER_PLACE = GpuInstance(5, 9, "3g.40gb", Placement(0, 4), "MIG-c")


@pytest.mark.parametrize("device", [PLANNED, CREATING, CREATED, ADOPTED, SHARED,
                                    DeviceRecord("g", "node-a", "gpu-2", "gpu", 2, "GPU-2")],
                         ids=["planned", "creating", "created", "adopted", "shared", "whole"])
def test_a_record_reads_back_as_written(tmp_path: Path, device: DeviceRecord) -> None:
    record = ClaimRecord(CLAIM, "Preparing", (device,), 1.0, 2.0, steps=("Preparing",))
    journal = ClaimJournal(tmp_path)
    journal.write(record)
    loaded, problems = ClaimJournal(tmp_path).load()
    assert problems == [] and loaded == {"uid-1": record}
    assert json.loads(journal.path("uid-1").read_text())["version"] == 1


@pytest.mark.parametrize(("phase", "action"), [
    ("Prepared", "keep"), ("Preparing", "roll-back"), ("RollingBack", "roll-back"), ("Unpreparing", "finish-unprepare"),
])
def test_what_a_restart_does_with_each_phase(phase: Phase, action: Recovery) -> None:
    assert recovery(ClaimRecord(CLAIM, phase, (CREATED,), 0.0, 0.0)) == action


@pytest.mark.parametrize(("device", "instances", "held", "expected"), [
    (CREATED, [OTHER_PLACE, OURS], (), OURS),
    (CREATED, [OTHER_PLACE], (), None),                       # already gone
    (CREATED, [SAME_ID_OTHER_UUID], (), None),                # NVML reused the id for somebody else's
    (CREATING, [OURS], (), OURS),                             # the interrupted create happened
    (CREATING, [OTHER_PLACE], (), None),                      # it did not
    (CREATING, [OURS], (2,), None),                           # what is there is another claim's
    (ADOPTED, [OURS], (), None),                              # not ours to destroy
    (PLANNED, [OURS], (), None),                              # nothing was attempted
    (SHARED, [OURS], (), None),
], ids=["created", "created-gone", "id-reused", "creating-happened", "creating-did-not", "creating-but-held",
        "adopted", "planned", "shared"])
def test_which_instance_an_undo_destroys(device: DeviceRecord, instances: list[GpuInstance], held: tuple[int, ...],
                                         expected: GpuInstance | None) -> None:
    assert instance_to_undo(device, instances, held) == expected


def test_an_unreadable_journal_is_set_aside_and_reported(tmp_path: Path) -> None:
    journal = ClaimJournal(tmp_path)
    good = ClaimRecord(CLAIM, "Prepared", (CREATED,), 0.0, 0.0)
    journal.write(good)
    (tmp_path / "uid-2.json").write_text("{not json")
    (tmp_path / "uid-3.json").write_text(json.dumps({**good.to_dict(), "phase": "Exploded"}))
    (tmp_path / "uid-4.json").write_text(json.dumps(good.to_dict()))  # another claim's record under this name
    (tmp_path / ".uid-5.json.77.tmp").write_text("half")
    loaded, problems = journal.load()
    assert loaded == {"uid-1": good}
    assert len(problems) == 3 and all("moved to" in p for p in problems)
    assert any("unknown phase 'Exploded'" in p for p in problems)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "uid-1.json", "uid-2.json.unreadable", "uid-3.json.unreadable", "uid-4.json.unreadable"]


def test_steps_are_bounded_and_moves_keep_the_devices() -> None:
    record = ClaimRecord(CLAIM, "Preparing", (PLANNED,), 0.0, 0.0)
    for i in range(100):
        record = record.with_device(0, CREATING, float(i), f"step {i}")
    record = record.moved("RollingBack", 200.0, "RollingBack", reason="busy")
    assert len(record.steps) == 40 and record.steps[-1] == "RollingBack"
    assert record.devices == (CREATING,) and record.reason == "busy" and record.updated_at == 200.0
