"""The plugin's engine (node.draplugin.prepare) on the simulated NVML and a fake claim source:
MIG instances created at exactly the allocated placement and never anybody else's touched, MPS limits
and whole GPUs, idempotent prepare and unprepare, rollback of a failed prepare, and a clear error for
every kind of bad input with nothing left behind."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mig.catalog import get_model
from mig.model import Placement
from node.draplugin import cdi
from node.draplugin.claims import ClaimError, ClaimRef, allocation_from_claim
from sharing.dra.results import AllocatedDevice
from node.draplugin.journal import ClaimJournal
from node.draplugin.prepare import ClaimPreparer
from node.draplugin.settings import ShareMode
from node.nvml import errors
from node.nvml.simulated import Fault, SimulatedNvml

NODE = "node-a"
MODEL = get_model("H100-80GB")
GiB = 2**30


@dataclass
class FakeClaims:
    """ResourceClaims in memory, read through the same parser as the API server's."""

    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    lookups: int = 0

    def add(self, uid: str, *results: dict[str, Any], name: str | None = None, namespace: str = "ml") -> ClaimRef:
        ref = ClaimRef(uid, namespace, name or f"claim-{uid}")
        self.objects[(namespace, ref.name)] = {
            "metadata": {"name": ref.name, "namespace": namespace, "uid": uid},
            "status": {"allocation": {"devices": {"results": list(results)}}}}
        return ref

    def get(self, claim: ClaimRef) -> tuple[AllocatedDevice, ...]:
        self.lookups += 1
        obj = self.objects.get((claim.namespace, claim.name))
        if obj is None:
            raise ClaimError(f"{claim} does not exist")
        return allocation_from_claim(obj, claim)


def result(device: str, request: str = "gpu", *, pool: str = NODE, driver: str = "gpu.gpupack.io",
           **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device, **extra}


def share(gpu: int, milli: str, memory: str, request: str = "gpu", share_id: str = "s1") -> dict[str, Any]:
    return result(f"gpu-{gpu}-shared", request, shareID=share_id,
                  consumedCapacity={"gpu.gpupack.io/milli": milli, "gpu.gpupack.io/memory": memory})


@dataclass
class Node:
    """Two simulated H100s (GPU 0 in MIG mode, GPU 1 not), a journal and a CDI directory."""

    dir: Path
    sim: SimulatedNvml
    claims: FakeClaims = field(default_factory=FakeClaims)
    share_mode: ShareMode = "mps"

    @property
    def cdi_dir(self) -> Path:
        return self.dir / "cdi"

    @property
    def journal_dir(self) -> Path:
        return self.dir / "state" / "claims"

    def preparer(self, journal: ClaimJournal | None = None) -> ClaimPreparer:
        """A plugin process: a new engine reading the journal from disk."""
        return ClaimPreparer(self.sim, self.claims, journal or ClaimJournal(self.journal_dir), node=NODE,
                             cdi_dir=self.cdi_dir, share_mode=self.share_mode)

    def restart_nvml(self) -> SimulatedNvml:
        """The simulated GPUs as a restarted process sees them: read back from the state file."""
        self.sim = SimulatedNvml(MODEL, 2, self.dir / "sim.json", seed=NODE)
        return self.sim

    def instances(self, gpu: int = 0) -> list[tuple[str, int]]:
        return [(i.profile, i.placement.start) for i in self.sim.gpu_instances(gpu)]

    def spec(self, uid: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(cdi.spec_path(self.cdi_dir, uid).read_text())
        return data

    def leftovers(self) -> tuple[list[str], list[str]]:
        """Journal files and CDI specs on disk."""
        journal = sorted(p.name for p in self.journal_dir.glob("*")) if self.journal_dir.exists() else []
        specs = sorted(p.name for p in self.cdi_dir.glob("*")) if self.cdi_dir.exists() else []
        return journal, specs


def make_node(directory: Path) -> Node:
    directory.mkdir(parents=True, exist_ok=True)
    sim = SimulatedNvml(MODEL, 2, directory / "sim.json", seed=NODE)
    sim.set_mig_mode(1, False)
    sim.reset_gpu(1)
    return Node(directory, sim)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return make_node(tmp_path)


def env_of(spec: dict[str, Any], n: int = 0) -> list[str]:
    env: list[str] = spec["devices"][n]["containerEdits"]["env"]
    return env


# ---------------------------------------------------------------------- MIG
def test_a_mig_claim_gets_an_instance_at_exactly_its_placement(node: Node) -> None:
    ref = node.claims.add("u1", result("gpu-0-mig-3g-40gb-4"))
    devices = node.preparer().prepare(ref)
    (instance,) = node.sim.gpu_instances(0)
    assert (instance.profile, instance.placement) == ("3g.40gb", Placement(4, 4))
    assert [(d.request, d.pool, d.device, d.cdi_ids) for d in devices] == [
        ("gpu", NODE, "gpu-0-mig-3g-40gb-4", ("gpu.gpupack.io/claim=u1-0",))]
    assert env_of(node.spec("u1")) == [f"NVIDIA_VISIBLE_DEVICES={instance.uuid}"]


def test_prepare_is_idempotent_within_a_process_and_across_a_restart(node: Node) -> None:
    ref = node.claims.add("u1", result("gpu-0-mig-1g-10gb-me-3"), result("gpu-0-mig-2g-20gb-0", "more"))
    preparer = node.preparer()
    first = preparer.prepare(ref)
    assert preparer.prepare(ref) == first
    node.restart_nvml()
    assert node.preparer().prepare(ref) == first
    assert node.instances() == [("2g.20gb", 0), ("1g.10gb+me", 3)]
    assert node.claims.lookups == 1  # a prepared claim is answered from its journal


def test_unprepare_destroys_what_it_created_and_is_idempotent(node: Node) -> None:
    ref = node.claims.add("u1", result("gpu-0-mig-7g-80gb-0"))
    preparer = node.preparer()
    preparer.prepare(ref)
    preparer.unprepare(ref)
    assert node.instances() == [] and node.leftovers() == ([], [])
    preparer.unprepare(ref)
    node.preparer().unprepare(ClaimRef("never-seen", "ml", "x"))


def test_an_identical_idle_instance_is_adopted_and_left_in_place_at_unprepare(node: Node) -> None:
    existing = node.sim.create_gpu_instance(0, MODEL.profile("1g.10gb").profile_id, Placement(6, 1))
    ref = node.claims.add("u1", result("gpu-0-mig-1g-10gb-6"))
    preparer = node.preparer()
    preparer.prepare(ref)
    assert env_of(node.spec("u1")) == [f"NVIDIA_VISIBLE_DEVICES={existing.uuid}"]
    preparer.unprepare(ref)
    assert node.sim.gpu_instances(0) == (existing,)


def test_adopting_an_instance_happens_holding_the_nodes_mig_change_lock(node: Node) -> None:
    """The agent destroys idle instances no claim holds (node.advertising.dra_reclaim) only when it
    gets this lock: a prepare holds it from reading the claim to journalling the instance it adopts."""
    from node.draplugin.nvml_lock import NvmlChangeLock, lock_path, try_hold

    node.sim.create_gpu_instance(0, MODEL.profile("1g.10gb").profile_id, Placement(6, 1))
    ref = node.claims.add("u1", result("gpu-0-mig-1g-10gb-6"))
    lock = NvmlChangeLock(lock_path(node.journal_dir))
    seen: list[str | None] = []
    real_get = node.claims.get

    def get_and_look(claim: ClaimRef) -> tuple[AllocatedDevice, ...]:
        with try_hold(lock_path(node.journal_dir)) as why_not:  # what the agent would get now
            seen.append(why_not)
        return real_get(claim)

    node.claims.get = get_and_look  # type: ignore[method-assign]
    preparer = ClaimPreparer(node.sim, node.claims, ClaimJournal(node.journal_dir), node=NODE, cdi_dir=node.cdi_dir,
                             change_lock=lock)
    preparer.prepare(ref)
    assert seen == ["the DRA kubelet plugin is preparing or unpreparing a claim"]
    with try_hold(lock_path(node.journal_dir)) as why_not:
        assert why_not is None  # released once the claim is journalled
    with try_hold(node.dir / "nowhere" / "nvml.lock") as why_not:
        assert why_not is not None and "has not started on this node" in why_not
    lock.close()


@pytest.mark.parametrize(("setup", "device", "message"), [
    ("idle-overlap", "gpu-0-mig-3g-40gb-4", r"overlaps 1g.10gb@6:1 \(GI 1, idle and prepared for no claim\)"),
    ("busy-identical", "gpu-0-mig-1g-10gb-6", r"is in use by process\(es\) 4242 outside any claim"),
    ("busy-overlap", "gpu-0-mig-7g-80gb-0", r"in use by process\(es\) 4242 outside any claim"),
    ("claimed-identical", "gpu-0-mig-1g-10gb-6", r"is prepared for ResourceClaim ml/claim-other \(UID other\)"),
    ("claimed-overlap", "gpu-0-mig-3g-40gb-4", r"prepared for ResourceClaim ml/claim-other \(UID other\)"),
], ids=["idle-overlap", "busy-identical", "busy-overlap", "claimed-identical", "claimed-overlap"])
def test_an_occupied_placement_refuses_the_claim_and_touches_nothing(node: Node, setup: str, device: str,
                                                                     message: str) -> None:
    preparer = node.preparer()
    if setup.startswith("claimed"):
        preparer.prepare(node.claims.add("other", result("gpu-0-mig-1g-10gb-6")))
    else:
        made = node.sim.create_gpu_instance(0, MODEL.profile("1g.10gb").profile_id, Placement(6, 1))
        if setup.startswith("busy"):
            node.sim.start_process(0, 4242, gi_id=made.gi_id)
    before = node.sim.gpu_instances(0)
    with pytest.raises(ClaimError, match=message):
        preparer.prepare(node.claims.add("u1", result(device)))
    assert node.sim.gpu_instances(0) == before
    assert "u1.json" not in node.leftovers()[0] and not cdi.spec_path(node.cdi_dir, "u1").exists()


def test_an_instance_in_use_is_not_destroyed_at_unprepare_until_its_process_ends(node: Node) -> None:
    ref = node.claims.add("u1", result("gpu-0-mig-1g-20gb-4"))
    preparer = node.preparer()
    preparer.prepare(ref)
    (instance,) = node.sim.gpu_instances(0)
    node.sim.start_process(0, 77, gi_id=instance.gi_id)
    with pytest.raises(ClaimError, match=r"in use by process\(es\) 77; not destroyed.*tried again"):
        preparer.unprepare(ref)
    assert node.sim.gpu_instances(0) == (instance,)
    assert node.preparer().records["u1"].phase == "Unpreparing"  # a restart finishes it, too
    node.sim.stop_process(0, 77)
    preparer.unprepare(ref)
    assert node.instances() == [] and node.leftovers() == ([], [])


def test_a_create_that_fails_after_taking_effect_is_rolled_back(node: Node) -> None:
    node.sim.inject_fault(Fault("create", errors.UNKNOWN, after_effect=True))
    ref = node.claims.add("u1", result("gpu-0-mig-3g-40gb-0"))
    with pytest.raises(ClaimError, match="NVML failed creating MIG instance 3g.40gb@0:4 on GPU 0"):
        node.preparer().prepare(ref)
    assert node.instances() == [] and node.leftovers() == ([], [])
    assert node.preparer().prepare(ref)[0].device == "gpu-0-mig-3g-40gb-0"


def test_a_claim_whose_second_device_cannot_be_prepared_keeps_none(node: Node) -> None:
    node.sim.create_gpu_instance(0, MODEL.profile("1g.10gb").profile_id, Placement(0, 1))
    ref = node.claims.add("u1", result("gpu-0-mig-3g-40gb-4"), result("gpu-0-mig-2g-20gb-0", "second"))
    with pytest.raises(ClaimError, match="gpu-0-mig-2g-20gb-0"):
        node.preparer().prepare(ref)
    assert node.instances() == [("1g.10gb", 0)] and node.leftovers() == ([], [])


def test_instances_lost_to_a_reboot_are_created_again(node: Node) -> None:
    ref = node.claims.add("u1", result("gpu-0-mig-1g-10gb-5"))
    preparer = node.preparer()
    preparer.prepare(ref)
    old = node.sim.gpu_instances(0)[0].uuid
    node.sim.reboot()
    preparer.prepare(ref)
    (instance,) = node.sim.gpu_instances(0)
    assert instance.uuid != old and env_of(node.spec("u1")) == [f"NVIDIA_VISIBLE_DEVICES={instance.uuid}"]


# ---------------------------------------------------------------------- shared and whole GPUs
def test_a_share_gets_its_own_mps_limits(node: Node) -> None:
    preparer = node.preparer()
    small = node.claims.add("u1", share(1, "300", "20Gi"))
    large = node.claims.add("u2", share(1, "650", "40Gi", share_id="s2"))
    assert preparer.prepare(small)[0].share_id == "s1"
    preparer.prepare(large)
    gpu = node.sim.device_info(1).uuid
    assert env_of(node.spec("u1")) == [f"NVIDIA_VISIBLE_DEVICES={gpu}", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
                                       "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M"]
    assert env_of(node.spec("u2"))[1:] == ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=65",
                                           "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40960M"]
    preparer.unprepare(small)
    assert node.preparer().records.keys() == {"u2"}


def test_time_sliced_shares_get_no_limits(node: Node) -> None:
    node.share_mode = "time-slicing"
    ref = node.claims.add("u1", result("gpu-1-shared"))
    node.preparer().prepare(ref)
    assert env_of(node.spec("u1")) == [f"NVIDIA_VISIBLE_DEVICES={node.sim.device_info(1).uuid}"]


def test_a_whole_gpu_is_handed_over_as_it_is(node: Node) -> None:
    ref = node.claims.add("u1", result("gpu-1"))
    node.preparer().prepare(ref)
    assert env_of(node.spec("u1")) == [f"NVIDIA_VISIBLE_DEVICES={node.sim.device_info(1).uuid}"]
    assert node.sim.gpu_instances(0) == ()


def test_a_whole_gpu_in_mig_mode_gets_its_full_size_instance_and_mig_mode_never_changes(node: Node) -> None:
    ref = node.claims.add("u1", result("gpu-0"))
    preparer = node.preparer()
    devices = preparer.prepare(ref)
    (instance,) = node.sim.gpu_instances(0)
    assert (instance.profile, instance.placement) == ("7g.80gb", Placement(0, 8))  # every compute and memory slice
    assert [d.device for d in devices] == ["gpu-0"]
    assert env_of(node.spec("u1")) == [f"NVIDIA_VISIBLE_DEVICES={instance.uuid}"]
    info = node.sim.device_info(0)
    assert info.mig_enabled and info.mig_pending  # no MIG mode change, no reset
    (record,) = preparer.records["u1"].devices
    assert (record.kind, record.profile, record.created) == ("gpu", "7g.80gb", True)
    node.restart_nvml()
    assert node.preparer().prepare(ref) == devices  # from the journal, across a restart
    node.preparer().unprepare(ref)
    assert node.instances() == [] and node.leftovers() == ([], [])


def test_a_whole_gpu_whose_mig_mode_waits_for_a_reset_is_refused(node: Node) -> None:
    node.sim.set_mig_mode(1, True)  # pending until a reset
    with pytest.raises(ClaimError, match=r"GPU 1 is changing MIG mode \(current False, pending True"):
        node.preparer().prepare(node.claims.add("u1", result("gpu-1")))
    assert node.leftovers() == ([], [])


def test_a_whole_gpu_in_mig_mode_with_an_instance_on_it_is_refused(node: Node) -> None:
    node.sim.create_gpu_instance(0, MODEL.profile("1g.10gb").profile_id, Placement(6, 1))
    with pytest.raises(ClaimError, match=r"device gpu-0: placement 0:8 of GPU 0 overlaps 1g.10gb@6:1"):
        node.preparer().prepare(node.claims.add("u1", result("gpu-0")))
    assert node.instances() == [("1g.10gb", 6)] and node.leftovers() == ([], [])


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("results", "message"), [
    ([result("gpu-0-mig-1g.10gb-6")], "is not one of gpupack's: expected gpu-<index>"),
    ([result("gpu-5")], "this node has 2 GPU"),
    ([result("gpu-0-mig-1g-10gb-6", pool="node-b")], "allocated from pool 'node-b', but this plugin serves node 'node-a'"),
    ([result("eth0", driver="net.example.com")], "no device of driver gpu.gpupack.io .*names net.example.com"),
    ([], "no device of driver gpu.gpupack.io .*no device at all"),
    ([result("gpu-0-mig-1g-12gb-6")], "has no MIG profile spelled '1g-12gb'; it has 1g.10gb"),
    ([result("gpu-0-mig-3g-40gb-2")], "cannot start at memory slice 2 .* start at 0, 4"),
    ([result("gpu-1-mig-1g-10gb-6")], "GPU 1 is not in MIG mode"),
    ([result("gpu-0-shared")], "GPU 0 is in MIG mode, and a shared GPU needs MIG mode off"),
    ([result("gpu-1-shared")], "records no consumedCapacity for gpu.gpupack.io/milli and gpu.gpupack.io/memory"),
    ([result("gpu-0-mig-1g-10gb-6", adminAccess=True)], "admin access"),
    ([result("gpu-0-mig-1g-10gb-6"), result("gpu-0-mig-1g-10gb-6", "again")], "allocated twice in one claim"),
    ([result("gpu-9"), result("nope")], "no GPU 9; .*'nope' is not one of gpupack's"),
], ids=["bad-name", "no-such-gpu", "other-pool", "other-driver", "empty", "unknown-profile", "bad-start",
        "mig-on-mig-off-gpu", "share-on-mig-gpu", "share-without-capacity", "admin-access",
        "twice", "every-problem-named"])
def test_bad_allocations_get_a_clear_error_and_change_nothing(node: Node, results: list[dict[str, Any]],
                                                              message: str) -> None:
    ref = node.claims.add("u1", *results)
    with pytest.raises(ClaimError, match=message):
        node.preparer().prepare(ref)
    assert node.instances(0) == [] and node.leftovers() == ([], [])


@pytest.mark.parametrize(("ref", "message"), [
    (ClaimRef("u-404", "ml", "missing"), "does not exist"),
    (ClaimRef("", "ml", "x"), "has no uid"),
    (ClaimRef("u1", "", ""), "has no namespace, name"),
    (ClaimRef("../../etc", "ml", "x"), "cannot name a CDI device"),
], ids=["not-found", "no-uid", "no-namespace", "path-in-uid"])
def test_bad_claim_references_get_a_clear_error(node: Node, ref: ClaimRef, message: str) -> None:
    preparer = node.preparer()
    with pytest.raises(ClaimError, match=message):
        preparer.prepare(ref)
    if ref.uid and ref.namespace and "/" not in ref.uid:
        preparer.unprepare(ref)  # unknown claims are unprepared already
    assert node.leftovers() == ([], [])


def test_a_claim_recreated_under_the_same_name_is_refused(node: Node) -> None:
    node.claims.add("new-uid", result("gpu-0-mig-1g-10gb-6"), name="train")
    with pytest.raises(ClaimError, match="has UID 'new-uid'; it was deleted and recreated"):
        node.preparer().prepare(ClaimRef("old-uid", "ml", "train"))


def test_recovery_removes_half_written_specs_and_keeps_everybody_elses(node: Node) -> None:
    node.cdi_dir.mkdir(parents=True)
    half = node.cdi_dir / ".gpu.gpupack.io-claim_u1.json.4242.tmp"
    half.write_text("{")
    foreign = node.cdi_dir / "nvidia.com-gpu.json"
    foreign.write_text("{}")
    orphan = cdi.spec_path(node.cdi_dir, "unknown")  # gpupack's name, but no journal: reported, left in place
    orphan.write_text("{}")
    assert node.preparer().recover() == []
    assert not half.exists() and foreign.exists() and orphan.exists()
