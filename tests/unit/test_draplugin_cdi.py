"""What the plugin hands the container runtime: CDI spec content and ids (node.draplugin.cdi), a
share's MPS limits (node.draplugin.mps), and the edits of each kind of device (prepare.cdi_device)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mig.model import Placement
from node.draplugin import cdi
from node.draplugin.claims import ClaimRef
from node.draplugin.journal import ClaimRecord, DeviceRecord
from node.draplugin.mps import MpsLimits, mps_limits
from node.draplugin.prepare import answer, cdi_device
from sharing.dra.names import MEMORY, MILLI

UID = "0b4f6f8e-2c1d-4b43-9a55-7d3c1b2a9e10"
GiB = 2**30


def test_a_claims_spec_has_one_device_per_allocated_device_named_after_the_claim() -> None:
    spec = cdi.claim_spec(UID, [cdi.CdiDevice(("NVIDIA_VISIBLE_DEVICES=MIG-1",)),
                                cdi.CdiDevice(("NVIDIA_VISIBLE_DEVICES=GPU-2", "A=b"), (cdi.Mount("/run/mps"),))])
    assert spec == {
        "cdiVersion": "0.5.0",
        "kind": "gpu.gpupack.io/claim",
        "devices": [
            {"name": f"{UID}-0", "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=MIG-1"]}},
            {"name": f"{UID}-1", "containerEdits": {
                "env": ["NVIDIA_VISIBLE_DEVICES=GPU-2", "A=b"],
                "mounts": [{"hostPath": "/run/mps", "containerPath": "/run/mps", "options": ["rw", "bind"]}]}},
        ],
    }
    assert cdi.device_id(UID, 1) == f"gpu.gpupack.io/claim={UID}-1"


def test_spec_files_are_named_so_the_plugin_knows_its_own(tmp_path: Path) -> None:
    path = cdi.spec_path(tmp_path, UID)
    assert path.name == f"gpu.gpupack.io-claim_{UID}.json"
    assert cdi.uid_of_spec(path) == UID
    assert cdi.uid_of_spec(tmp_path / "nvidia.com-gpu.json") is None
    assert cdi.uid_of_spec(tmp_path / f".gpu.gpupack.io-claim_{UID}.json.1.tmp") is None


def test_write_and_remove_leave_no_temporary_file(tmp_path: Path) -> None:
    spec = cdi.claim_spec(UID, [cdi.CdiDevice(("X=1",))])
    path = cdi.write_spec(tmp_path, UID, spec)
    assert json.loads(path.read_text()) == spec
    assert os.listdir(tmp_path) == [path.name]
    assert cdi.remove_spec(tmp_path, UID) is True
    assert cdi.remove_spec(tmp_path, UID) is False
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("uid", ["", "a/b", "../x", "-a", "a-", "a b", "ü", "x" * 129])
def test_uids_that_cannot_name_a_cdi_device_or_a_file_are_refused(uid: str) -> None:
    with pytest.raises(ValueError, match="cannot name a CDI device"):
        cdi.check_uid(uid)


@pytest.mark.parametrize(("milli", "memory", "percentage", "mib"), [
    (300, 20 * GiB, 30, 20480),
    (50, GiB, 5, 1024),
    (1000, 79 * GiB, 100, 80896),
    (125, GiB + 2**20 - 1, 13, 1024),  # a finer unit rounds the SMs up, memory down
    (1, 2**20, 1, 1),
], ids=["300m-20Gi", "smallest-share", "whole-gpu", "rounding", "tiny"])
def test_mps_limits_from_consumed_capacity(milli: int, memory: int, percentage: int, mib: int) -> None:
    limits = mps_limits({MILLI: milli, MEMORY: memory}, "gpu-0-shared")
    assert limits == MpsLimits(percentage, mib)
    assert limits.env() == (f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percentage}",
                            f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={mib}M")


@pytest.mark.parametrize(("consumed", "message"), [
    ({MEMORY: GiB}, "no consumedCapacity for gpu.gpupack.io/milli"),
    ({MILLI: 100}, "no consumedCapacity for gpu.gpupack.io/memory"),
    ({}, "gpu.gpupack.io/milli and gpu.gpupack.io/memory"),
    ({MILLI: 0, MEMORY: GiB}, "outside 1..1000"),
    ({MILLI: 1001, MEMORY: GiB}, "outside 1..1000"),
    ({MILLI: 100, MEMORY: 1000}, "less than 1 MiB"),
], ids=["no-milli", "no-memory", "nothing", "zero", "too-much", "no-memory-to-speak-of"])
def test_a_share_without_usable_amounts_gets_no_limits(consumed: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mps_limits(consumed, "gpu-0-shared")


MIG = DeviceRecord("gpu", "node-a", "gpu-0-mig-1g-10gb-6", "mig", 0, "GPU-0", profile="1g.10gb", profile_id=19,
                   placement=Placement(6, 1), gi_id=3, uuid="MIG-3", created=True)
SHARED = DeviceRecord("share", "node-a", "gpu-1-shared", "shared", 1, "GPU-1", share_id="s-1", mps=MpsLimits(30, 20480))
WHOLE = DeviceRecord("big/first", "node-a", "gpu-1", "gpu", 1, "GPU-1")


@pytest.mark.parametrize(("device", "pipe", "env", "mounts"), [
    (MIG, "", ("NVIDIA_VISIBLE_DEVICES=MIG-3",), ()),
    (WHOLE, "/run/mps", ("NVIDIA_VISIBLE_DEVICES=GPU-1",), ()),
    (SHARED, "", ("NVIDIA_VISIBLE_DEVICES=GPU-1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
                  "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M"), ()),
    (SHARED, "/run/mps", ("NVIDIA_VISIBLE_DEVICES=GPU-1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
                          "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M", "CUDA_MPS_PIPE_DIRECTORY=/run/mps"),
     (cdi.Mount("/run/mps"),)),
], ids=["mig", "whole-gpu", "mps-share", "mps-share-with-pipe-dir"])
def test_each_kind_of_device_gets_its_edits(device: DeviceRecord, pipe: str, env: tuple[str, ...],
                                             mounts: tuple[cdi.Mount, ...]) -> None:
    assert cdi_device(device, pipe) == cdi.CdiDevice(env, mounts)


def test_the_answer_names_each_device_its_request_and_cdi_id() -> None:
    record = ClaimRecord(ClaimRef(UID, "ml", "c"), "Prepared", (MIG, SHARED, WHOLE), 0.0, 0.0)
    devices = answer(record)
    assert [(d.request, d.device, d.cdi_ids, d.share_id) for d in devices] == [
        ("gpu", "gpu-0-mig-1g-10gb-6", (f"gpu.gpupack.io/claim={UID}-0",), None),
        ("share", "gpu-1-shared", (f"gpu.gpupack.io/claim={UID}-1",), "s-1"),
        ("big", "gpu-1", (f"gpu.gpupack.io/claim={UID}-2",), None),  # a subrequest answers for its request
    ]
    assert answer(record) == devices
