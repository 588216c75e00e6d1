"""The node agent on the ``dra`` backend: full ticks of a simulated node against an in-memory API server.

What the scheduler and an admin see: the ResourceSlices of the node's pool (their
devices, generation and slice count), the writes it took to get there (steady
state: none), the ``ResourceSlicesPublished`` condition, and nothing of the
device plugin (no sharing config, no labels, no Node resources).
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube.errors import KubeError
from mig.catalog import get_model
from mig.model import Placement
from mig.units import parse_quantity
from node.advertising import DraPublisher, advertiser_for
from node.advertising.dra import SLICES_PUBLISHED
from node.advertising.dra_pool import QUANTITY_KEYS
from node.agent import Agent
from node.nvml.simulated import SimulatedNvml
from node.base.settings import AgentSettings
from sharing.dra import names, validate
from sharing.dra.model import ResourceSlice
from sharing.dra.share_policy import SHARES
from sharing.admission.options import DRA_SHARES
from tests.unit.test_reconciler_agent import Clock, FakeKube

H100 = get_model("H100-80GB")
THREE_G = H100.profile("3g.40gb")
ROOT = Path(__file__).resolve().parents[2]
NODE = "n1"
DYNAMIC = {"metadata": {"name": "dra-pool"}, "spec": {"nodeSelector": {}}}
"""A SharingPolicy selecting every node, dynamic layouts: MIG placements may be offered."""


def _api_spelling(value: Any, key: str = "") -> Any:
    """Quantities as the API server stores them (canonical: ``1000`` reads back as ``1k``)."""
    if isinstance(value, dict):
        return {k: _api_spelling(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_api_spelling(v) for v in value]
    if key in QUANTITY_KEYS and isinstance(value, str) and value.isdigit() and int(value) % 1000 == 0 and value != "0":
        return f"{int(value) // 1000}k"
    return value


class SliceKube(FakeKube):
    """FakeKube plus ResourceSlices as the API server keeps them: resourceVersions that guard replaces
    and patches, immutable driver, node and pool name, quantities respelt, every write logged."""

    def __init__(self, node: str = NODE) -> None:
        super().__init__(node)
        self.slices: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        """(verb, slice name) of every write that landed."""
        self.lists = 0
        self.fail_next: dict[str, KubeError] = {}

    def _check(self, verb: str) -> None:
        if verb in self.fail_next:
            raise self.fail_next.pop(verb)

    def _store(self, body: dict[str, Any], generation: int) -> dict[str, Any]:
        obj = _api_spelling(copy.deepcopy(body))
        obj["metadata"].update({"resourceVersion": self._bump(), "generation": generation,
                                "uid": f"uid-{obj['metadata']['name']}"})
        self.slices[obj["metadata"]["name"]] = obj
        return copy.deepcopy(obj)

    def list_resource_slices(self, node_name: str, driver: str) -> list[dict[str, Any]]:
        self._check("list")
        self.lists += 1
        return [copy.deepcopy(s) for s in self.slices.values()
                if s["spec"].get("nodeName") == node_name and s["spec"]["driver"] == driver]

    def create_resource_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check("create")
        name = body["metadata"]["name"]
        if name in self.slices:
            raise KubeError(409, f"resourceslices {name!r} already exists")
        self.writes.append(("create", name))
        return self._store(body, 1)

    def _guard(self, name: str, rv: Any) -> dict[str, Any]:
        if name not in self.slices:
            raise KubeError(404, f"resourceslices {name!r} not found")
        old = self.slices[name]
        if rv is not None and rv != old["metadata"]["resourceVersion"]:
            raise KubeError(409, "the object has been modified")
        return old

    def replace_resource_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self._check("replace")
        old = self._guard(name, body["metadata"].get("resourceVersion"))
        for field in ("driver", "nodeName"):
            assert body["spec"][field] == old["spec"][field], f"spec.{field} is immutable"
        assert body["spec"]["pool"]["name"] == old["spec"]["pool"]["name"], "spec.pool.name is immutable"
        self.writes.append(("replace", name))
        return self._store(body, old["metadata"]["generation"] + 1)

    def patch_resource_slice(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self._check("patch")
        old = self._guard(name, (patch.get("metadata") or {}).get("resourceVersion"))
        body = copy.deepcopy(old)
        body["spec"]["pool"].update(patch["spec"]["pool"])
        self.writes.append(("patch", name))
        return self._store(body, old["metadata"]["generation"] + 1)

    def delete_resource_slice(self, name: str) -> None:
        self._check("delete")
        if self.slices.pop(name, None) is not None:
            self.writes.append(("delete", name))

    # ---------------------------------------------------------------- reading
    def pool(self) -> list[dict[str, Any]]:
        return [self.slices[n] for n in sorted(self.slices)]

    def generations(self) -> set[int]:
        return {s["spec"]["pool"]["generation"] for s in self.slices.values()}

    def devices(self) -> list[str]:
        return [d["name"] for s in self.pool() for d in s["spec"].get("devices") or []]

    def counter_sets(self) -> list[str]:
        return [c["name"] for s in self.pool() for c in s["spec"].get("sharedCounters") or []]

    def cond(self, type_: str = SLICES_PUBLISHED) -> dict[str, Any]:
        assert self.gpunode is not None
        return next(c for c in self.gpunode["status"]["conditions"] if c["type"] == type_)


def _settings(gpus: int, **changes: Any) -> AgentSettings:
    return AgentSettings(node_name=NODE, simulate=f"H100-80GB:{gpus}", backend="dra", idle_seconds=1.0,
                         min_patch_seconds=0.1, metrics_port=0).with_(**changes)


def _node(gpus: int = 2, *, mig: bool = True, policies: list[dict[str, Any]] | None = None,
          kube: SliceKube | None = None, sim: SimulatedNvml | None = None,
          **settings: Any) -> tuple[SliceKube, SimulatedNvml, Agent]:
    kube = kube or SliceKube()
    kube.policies = [copy.deepcopy(DYNAMIC)] if policies is None else policies
    sim = sim or SimulatedNvml(H100, gpus, seed=NODE, mig_enabled=mig)
    agent = Agent(_settings(gpus, **settings), sim, kube, clock=Clock())  # type: ignore[arg-type]
    return kube, sim, agent


def _ticks(agent: Agent, n: int = 1) -> None:
    for _ in range(n):
        agent.tick()


def _as_model(kube: SliceKube) -> list[ResourceSlice]:
    """Enough of the stored pool for the validator's pool rules."""
    return [ResourceSlice(name=s["metadata"]["name"], node_name=s["spec"]["nodeName"], pool=s["spec"]["pool"]["name"],
                          generation=s["spec"]["pool"]["generation"], slice_count=s["spec"]["pool"]["resourceSliceCount"])
            for s in kube.pool()]


def _make_instances(sim: SimulatedNvml, index: int, *starts: int) -> None:
    for start in starts:
        sim.create_gpu_instance(index, THREE_G.profile_id, Placement(start, THREE_G.memory_slices))


# ------------------------------------------------------------------ built, written once, then left alone

def test_slices_are_built_and_written_once_then_steady_state_writes_nothing() -> None:
    kube, _sim, agent = _node(2)
    _ticks(agent)
    assert kube.writes == [("create", f"{NODE}-gpu.gpupack.io-counters-000"),
                           ("create", f"{NODE}-gpu.gpupack.io-devices-000")]
    counters, devices = kube.pool()
    for item in (counters, devices):
        assert item["spec"]["driver"] == names.DRIVER and item["spec"]["nodeName"] == NODE
        assert item["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 2}
        assert item["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "n-uid", "controller": True}]
    assert kube.counter_sets() == ["gpu-0", "gpu-1"]
    # 25 placements per H100 (no whole GPU by default: MIG off needs a reset)
    assert len(kube.devices()) == 50 and "gpu-0" not in kube.devices()
    assert Counter(d.split("-mig-")[1].rsplit("-", 1)[0] for d in kube.devices())["3g-40gb"] == 4
    cond = kube.cond()
    assert cond["status"] == "True" and cond["reason"] == "Published"
    assert cond["message"].startswith(f"2 ResourceSlice(s) of pool {NODE} at generation 1: 50 device(s) on 2 GPU(s) (50 mig)")

    writes, lists = len(kube.writes), kube.lists
    _ticks(agent, 20)
    assert len(kube.writes) == writes, f"steady state wrote {kube.writes[writes:]}"
    assert kube.lists == lists, "what is published is known between re-reads: no API call at all"
    assert kube.generations() == {1}


def test_a_resync_reads_the_pool_again_and_still_writes_nothing() -> None:
    kube, _sim, agent = _node(2, dra_resync_seconds=1.0)
    _ticks(agent, 10)
    assert kube.lists > 2 and [v for v, _ in kube.writes] == ["create", "create"]


def test_a_restarted_agent_adopts_the_published_pool_without_writing() -> None:
    kube, sim, agent = _node(2)
    _ticks(agent, 2)
    before = copy.deepcopy(kube.slices)
    _, _, restarted = _node(2, kube=kube, sim=sim)
    _ticks(restarted, 3)
    assert kube.slices == before and len(kube.writes) == 2
    assert "at generation 1" in kube.cond()["message"]


# ------------------------------------------------------------------ changes: a new generation everywhere

def test_a_change_of_layout_bumps_the_generation_and_rewrites_only_the_changed_slice() -> None:
    kube, sim, agent = _node(4)
    _ticks(agent)
    assert [s["metadata"]["name"].rsplit("-", 2)[1:] for s in kube.pool()] == [
        ["counters", "000"], ["devices", "000"], ["devices", "001"]]
    unchanged = {n: copy.deepcopy(kube.slices[n]["spec"]) for n in kube.slices}
    del kube.writes[:]

    _make_instances(sim, 3, 4)  # a claim's 3g.40gb instance on GPU 3, as the kubelet plugin makes it
    _ticks(agent)
    devices_1 = f"{NODE}-gpu.gpupack.io-devices-001"
    assert sorted(kube.writes) == [("patch", f"{NODE}-gpu.gpupack.io-counters-000"),
                                   ("patch", f"{NODE}-gpu.gpupack.io-devices-000"), ("replace", devices_1)]
    assert kube.generations() == {2} and all(s["spec"]["pool"]["resourceSliceCount"] == 3 for s in kube.pool())
    for name, spec in unchanged.items():  # the others differ by their generation only
        now = copy.deepcopy(kube.slices[name]["spec"])
        now["pool"]["generation"] = 1
        assert (now == spec) == (name != devices_1), name
    gpu3 = [d for d in kube.devices() if d.startswith("gpu-3-")]
    # held: offered as itself; nothing overlapping memory slices 4..7 is offered
    assert "gpu-3-mig-3g-40gb-4" in gpu3 and "gpu-3-mig-1g-10gb-6" not in gpu3 and "gpu-3-mig-7g-80gb-0" not in gpu3
    assert "gpu-3-mig-3g-40gb-0" in gpu3
    assert not validate.pool_problems(_as_model(kube))

    del kube.writes[:]
    _ticks(agent, 5)
    assert kube.writes == []


def test_a_faulted_mig_instance_withdraws_every_device_that_overlaps_it() -> None:
    sim = SimulatedNvml(H100, 2, seed=NODE, mig_enabled=True)
    _make_instances(sim, 0, 0, 4)  # gi 1 at 0, gi 2 at 4
    kube, _, agent = _node(2, sim=sim)
    _ticks(agent)
    assert {"gpu-0-mig-3g-40gb-0", "gpu-0-mig-3g-40gb-4"} <= set(kube.devices())
    assert not [d for d in kube.devices() if d.startswith("gpu-0-") and "3g-40gb" not in d]

    sim.inject_xid(0, 94, gi_id=1)  # contained ECC error in the instance at slices 0..3
    _ticks(agent)
    gpu0 = [d for d in kube.devices() if d.startswith("gpu-0-")]
    assert gpu0 == ["gpu-0-mig-3g-40gb-4"]  # its neighbour stays (a claim holds it); nothing overlaps slices 0..3
    assert len([d for d in kube.devices() if d.startswith("gpu-1-")]) == 25
    assert kube.generations() == {2}
    assert "withdrawn: MIG instance 1 of GPU 0 (3g.40gb at 0, faulted)" in kube.cond()["message"]


def test_a_lost_gpu_takes_its_devices_and_counters_off_and_a_surplus_slice_is_deleted() -> None:
    kube, sim, agent = _node(3)
    _ticks(agent)
    assert len(kube.pool()) == 3  # counters, GPUs 0+1, GPU 2
    del kube.writes[:]
    sim.lose_gpu(2)
    _ticks(agent)
    assert (("delete", f"{NODE}-gpu.gpupack.io-devices-001") in kube.writes
            and ("replace", f"{NODE}-gpu.gpupack.io-counters-000") in kube.writes)
    assert kube.counter_sets() == ["gpu-0", "gpu-1"] and not [d for d in kube.devices() if d.startswith("gpu-2-")]
    assert kube.generations() == {2} and {s["spec"]["pool"]["resourceSliceCount"] for s in kube.pool()} == {2}
    assert "withdrawn: GPU 2 (lost)" in kube.cond()["message"]


# ------------------------------------------------------------------ policy bounds

def test_without_a_policy_only_existing_instances_are_offered() -> None:
    sim = SimulatedNvml(H100, 2, seed=NODE, mig_enabled=True)
    _make_instances(sim, 1, 0)
    kube, _, agent = _node(2, sim=sim, policies=[])
    _ticks(agent)
    assert kube.devices() == ["gpu-1-mig-3g-40gb-0"] and kube.counter_sets() == ["gpu-1"]
    assert "new MIG placements not offered: no SharingPolicy selects this node" in kube.cond()["message"]


def test_allowed_profiles_bound_the_placements_and_a_frozen_policy_offers_none() -> None:
    policy = {"metadata": {"name": "p"}, "spec": {"nodeSelector": {}, "allowedProfiles": ["3g.40gb", "7g.80gb"]}}
    kube, _, agent = _node(1, policies=[policy])
    _ticks(agent)
    assert kube.devices() == ["gpu-0-mig-3g-40gb-4", "gpu-0-mig-3g-40gb-0", "gpu-0-mig-7g-80gb-0"]
    kube.policies = [{"metadata": {"name": "p"}, "spec": {"nodeSelector": {}, "reshaping": {"maxConcurrent": 0}}}]
    _ticks(agent)
    assert kube.devices() == [] and kube.generations() == {2}
    assert "maxConcurrent: 0" in kube.cond()["message"]


def test_the_whole_gpu_is_offered_only_when_the_settings_ask() -> None:
    kube, _, agent = _node(1, dra_whole_gpu=True)
    _ticks(agent)
    assert kube.devices()[-1] == "gpu-0" and len(kube.devices()) == 26


# ------------------------------------------------------------------ MIG off: shared or whole

@pytest.mark.parametrize("mode", ["mps", "time-slicing"])
def test_a_gpu_without_mig_is_shared_by_the_spec_mode_with_consumable_capacity(mode: str) -> None:
    kube, _, agent = _node(2, mig=False)
    _ticks(agent)
    assert kube.devices() == ["gpu-0", "gpu-1"]  # sharing mode none: whole GPUs, one claim each
    assert kube.gpunode is not None
    kube.set_spec({"sharing": {"mode": mode, "replicas": 2}})
    _ticks(agent)
    assert kube.devices() == ["gpu-0-shared", "gpu-1-shared"] and kube.generations() == {2}
    (device, _) = kube.pool()[0]["spec"]["devices"]
    assert device["allowMultipleAllocations"] is True
    assert device["attributes"][names.SHARING] == {"string": mode}
    milli = device["capacity"][names.MILLI]
    assert milli["value"] == "1k"  # as the API server spells it: compared by value, so no rewrite follows
    assert parse_quantity(milli["requestPolicy"]["validRange"]["step"]) == 50
    del kube.writes[:]
    _ticks(agent, 5)
    assert kube.writes == []


def test_every_node_publishes_the_releases_share_unit_the_webhook_and_controller_round_with() -> None:
    kube, _, agent = _node(1, mig=False)
    _ticks(agent)
    kube.set_spec({"sharing": {"mode": "mps", "replicas": 2}})
    _ticks(agent)
    (device,) = kube.pool()[0]["spec"]["devices"]
    assert parse_quantity(device["capacity"][names.MILLI]["requestPolicy"]["validRange"]["step"]) == SHARES.milli_step
    assert DRA_SHARES is SHARES  # the webhook's


def test_a_share_unit_set_on_a_node_is_refused_unless_it_is_the_releases() -> None:
    for variable, value in (("GPUPACK_AGENT_DRA_SHARE_MILLI_STEP", "100"), ("GPUPACK_AGENT_DRA_SHARE_MEMORY_STEP_MIB", "512")):
        with pytest.raises(ValueError, match="no longer a node setting") as refused:
            AgentSettings.from_env({"GPUPACK_AGENT_BACKEND": "dra", variable: value})
        assert variable in str(refused.value) and "Unset it" in str(refused.value)
    same = {"GPUPACK_AGENT_BACKEND": "dra", "GPUPACK_AGENT_DRA_SHARE_MILLI_STEP": str(SHARES.milli_step),
            "GPUPACK_AGENT_DRA_SHARE_MEMORY_STEP_MIB": str(SHARES.memory_step_bytes // 2**20)}
    assert AgentSettings.from_env(same).backend == "dra"


# ------------------------------------------------------------------ one backend per GPU

def test_on_dra_nothing_of_the_device_plugin_is_written() -> None:
    kube, _, agent = _node(2, mig=False)
    _ticks(agent)
    kube.set_spec({"sharing": {"mode": "mps", "replicas": 4}})
    labels = dict(kube.node["metadata"]["labels"])
    _ticks(agent, 3)
    assert kube.configmaps == {} and kube.node["metadata"]["labels"] == labels
    assert kube.node["status"] == {"capacity": {}, "allocatable": {}}
    assert agent.s.pause_device_plugin is False and isinstance(agent.advertiser, DraPublisher)
    conditions = {c["type"] for c in (kube.gpunode or {})["status"]["conditions"]}
    assert SLICES_PUBLISHED in conditions and "DevicePluginReady" not in conditions


# ------------------------------------------------------------------ failures

def test_a_conflicting_writer_fails_the_publish_and_the_next_tick_converges() -> None:
    kube, sim, agent = _node(2)
    _ticks(agent)
    name = f"{NODE}-gpu.gpupack.io-devices-000"
    kube.slices[name]["spec"]["devices"] = kube.slices[name]["spec"]["devices"][:3]  # someone else's edit
    kube.slices[name]["metadata"]["resourceVersion"] = kube._bump()
    _make_instances(sim, 0, 0)
    kube.fail_next["replace"] = KubeError(409, "the object has been modified")
    _ticks(agent)
    cond = kube.cond()
    assert cond["status"] == "False" and cond["reason"] == "PublishFailed" and "409" in cond["message"]
    _ticks(agent)
    assert kube.cond()["status"] == "True" and len(kube.devices()) > 3 and len(kube.generations()) == 1
    assert not validate.pool_problems(_as_model(kube))


def test_a_slice_deleted_by_someone_else_is_put_back_at_the_next_resync() -> None:
    kube, _, agent = _node(2, dra_resync_seconds=5.0)
    _ticks(agent)
    del kube.slices[f"{NODE}-gpu.gpupack.io-devices-000"]
    _ticks(agent, 10)
    assert len(kube.pool()) == 2 and kube.generations() == {2} and len(kube.devices()) == 50


def test_nvml_unavailable_leaves_the_slices_as_published() -> None:
    kube, _, agent = _node(1)
    _ticks(agent)
    before = copy.deepcopy(kube.slices)
    agent.backend = None
    agent.backend_error = "NVML could not be opened"
    _ticks(agent)
    assert kube.slices == before and kube.cond()["reason"] == "NvmlUnavailable"


# ------------------------------------------------------------------ settings and manifests

def test_settings_choose_the_backend_and_refuse_mixing_it_with_the_device_plugin() -> None:
    assert AgentSettings().backend == "device-plugin" and AgentSettings().pause_device_plugin is True
    settings = AgentSettings.from_env({"GPUPACK_AGENT_BACKEND": "dra"})
    assert settings.backend == "dra" and settings.pause_device_plugin is False
    assert isinstance(advertiser_for(settings), DraPublisher)
    for env, problem in (({"GPUPACK_AGENT_BACKEND": "nvidia"}, "not one of device-plugin, dra"),
                         ({"GPUPACK_AGENT_BACKEND": "dra", "GPUPACK_AGENT_EMULATE_DEVICE_PLUGIN": "true"}, "one backend"),
                         ({"GPUPACK_AGENT_BACKEND": "dra", "GPUPACK_AGENT_MODE": "operator"}, "needs mode direct")):
        with pytest.raises(ValueError, match=problem):
            AgentSettings.from_env(env)


def test_the_cli_takes_the_backend() -> None:
    import argparse

    from gpupack import cli_agent

    parser = argparse.ArgumentParser()
    cli_agent.register(parser.add_subparsers())
    args = parser.parse_args(["agent", "run", "--node", NODE, "--backend", "dra", "--simulate", "H100-80GB:1"])
    assert cli_agent._settings(args).backend == "dra"
    with pytest.raises(SystemExit):
        parser.parse_args(["agent", "run", "--backend", "both"])


def _manifest(path: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / path).read_text()) if d]


def test_the_agent_may_write_resource_slices_and_the_policy_keeps_it_to_its_own_node() -> None:
    role = next(o for o in _manifest("manifests/rbac/node-agent-dra.yaml") if o["kind"] == "ClusterRole")
    assert role["rules"] == [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
                              "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]
    assert "node-agent-dra.yaml" in (ROOT / "manifests/rbac/kustomization.yaml").read_text()
    policy = next(o for o in _manifest("manifests/agent/node-restriction-policy.yaml")
                  if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == "gpupack-node-agent-own-slices")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceslices"] and set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    text = yaml.safe_dump(policy["spec"]["validations"])
    assert "object.spec.nodeName == variables.node" in text and f"'{names.DRIVER}'" in text


# ------------------------------------------------------------------ used outside DRA
def _journal(directory: Path, uid: str, *devices: dict[str, Any]) -> None:
    """A claim's journal file as the kubelet plugin writes it (``node.draplugin.journal``)."""
    from node.draplugin.claims import ClaimRef
    from node.draplugin.journal import ClaimJournal, ClaimRecord, DeviceRecord

    records = tuple(DeviceRecord(request="gpu", pool=NODE, device=d["device"], kind=d["kind"], gpu=d["gpu"],
                                 gpu_uuid=f"GPU-{d['gpu']}", profile=d.get("profile"),
                                 placement=d.get("placement"), gi_id=d.get("gi_id")) for d in devices)
    ClaimJournal(directory).write(ClaimRecord(ClaimRef(uid, "team", f"claim-{uid}"), "Prepared", records, 1.0, 1.0))


def test_a_busy_mig_instance_no_claim_holds_is_withdrawn_and_a_claimed_one_stays(tmp_path: Path) -> None:
    sim = SimulatedNvml(H100, 2, seed=NODE, mig_enabled=True)
    _make_instances(sim, 0, 0, 4)  # gi 1 at 0, gi 2 at 4
    claims = tmp_path / "claims"
    kube, _, agent = _node(2, sim=sim, dra_claims_dir=str(claims))
    sim.start_process(0, 101, gi_id=1)
    sim.start_process(0, 102, gi_id=2)
    _ticks(agent)
    # No journal directory: nothing is known, nothing is withdrawn.
    assert {"gpu-0-mig-3g-40gb-0", "gpu-0-mig-3g-40gb-4"} <= set(kube.devices())
    claims.mkdir()
    _journal(claims, "uid-a", {"device": "gpu-0-mig-3g-40gb-4", "kind": "mig", "gpu": 0, "profile": "3g.40gb",
                                "placement": Placement(4, THREE_G.memory_slices), "gi_id": 2})
    _ticks(agent)
    gpu0 = [d for d in kube.devices() if d.startswith("gpu-0-")]
    assert gpu0 == ["gpu-0-mig-3g-40gb-4"]  # the claim's instance stays; the stranger's and all over it go
    assert "MIG instance 1 of GPU 0 (3g.40gb at 0, used outside DRA)" in kube.cond()["message"]
    sim.stop_process(0, 101)
    _ticks(agent)
    assert "gpu-0-mig-3g-40gb-0" in kube.devices()  # idle again: offered again


def test_a_shared_gpu_running_a_workload_no_claim_holds_offers_nothing(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    claims.mkdir()
    kube, sim, agent = _node(2, mig=False, dra_claims_dir=str(claims))
    _ticks(agent)
    kube.set_spec({"sharing": {"mode": "mps", "replicas": 2}})
    sim.start_process(0, 201)
    sim.start_process(1, 202)
    _journal(claims, "uid-b", {"device": "gpu-1-shared", "kind": "shared", "gpu": 1})
    _ticks(agent)
    assert kube.devices() == ["gpu-1-shared"]
    assert "GPU 0 (used outside DRA: pid 201, and no claim holds it)" in kube.cond()["message"]
    (claims / "bad.json").write_text("{not json")
    _ticks(agent)
    assert kube.devices() == ["gpu-1-shared"]  # an unreadable file is skipped (and logged), nothing else changes
    assert (claims / "bad.json").exists()  # the agent only reads the plugin's files


def test_a_gpu_a_claim_holds_whole_in_mig_mode_keeps_offering_its_whole_device_and_its_instance_stays(
        tmp_path: Path) -> None:
    """The plugin serves a whole-GPU claim on a MIG GPU with the full-size instance: the allocation
    names ``gpu-0``, so that device stays published (not the instance as itself, which another claim
    could then be given), the busy instance is the claim's, not used outside DRA, and never idle-reclaimed."""
    sim = SimulatedNvml(H100, 1, seed=NODE, mig_enabled=True)
    full = sim.create_gpu_instance(0, H100.profile("7g.80gb").profile_id, Placement(0, H100.memory_slices))
    sim.start_process(0, 301, gi_id=full.gi_id)
    claims = _plugin_dir(tmp_path)
    _journal(claims, "uid-w", {"device": "gpu-0", "kind": "gpu", "gpu": 0, "profile": "7g.80gb",
                                "placement": Placement(0, H100.memory_slices), "gi_id": full.gi_id})
    kube, _, agent = _node(1, sim=sim, dra_claims_dir=str(claims), dra_whole_gpu=True,
                           policies=[copy.deepcopy(IDLE_30)])
    _ticks(agent)
    assert kube.devices() == ["gpu-0"]
    assert "used outside DRA" not in kube.cond()["message"]
    sim.stop_process(0, 301)
    _later(agent)
    _ticks(agent)
    assert _gi_starts(sim) == [0] and kube.devices() == ["gpu-0"]  # idle, but the claim's: never destroyed


# ------------------------------------------------------------------ idle instances no claim holds
def _plugin_dir(tmp_path: Path) -> Path:
    """The plugin's state directory as a started plugin leaves it: the journal and the MIG-change lock."""
    from node.draplugin.nvml_lock import NvmlChangeLock, lock_path

    claims = tmp_path / "state" / "claims"
    claims.mkdir(parents=True)
    NvmlChangeLock(lock_path(claims)).close()
    return claims


def _gi_starts(sim: SimulatedNvml, index: int = 0) -> list[int]:
    return sorted(i.placement.start for i in sim.gpu_instances(index))


IDLE_30 = {"metadata": {"name": "dra-pool"}, "spec": {"nodeSelector": {}, "reshaping": {"idleSeconds": 30}}}


def _later(agent: Agent, seconds: float = 60.0) -> None:
    agent.clock.t += seconds  # type: ignore[attr-defined]


def test_an_idle_instance_no_claim_holds_is_destroyed_after_the_idle_time_and_its_slices_offered(
        tmp_path: Path) -> None:
    sim = SimulatedNvml(H100, 1, seed=NODE, mig_enabled=True)
    _make_instances(sim, 0, 0, 4)  # gi 1 at 0 (no claim), gi 2 at 4 (a claim's)
    claims = _plugin_dir(tmp_path)
    _journal(claims, "uid-a", {"device": "gpu-0-mig-3g-40gb-4", "kind": "mig", "gpu": 0, "profile": "3g.40gb",
                                "placement": Placement(4, THREE_G.memory_slices), "gi_id": 2})
    kube, _, agent = _node(1, sim=sim, dra_claims_dir=str(claims), policies=[copy.deepcopy(IDLE_30)])
    _ticks(agent, 2)
    assert _gi_starts(sim) == [0, 4]  # idle since the first tick only: not 30 s yet
    assert "gpu-0-mig-1g-10gb-1" not in kube.devices()  # inside gi 1's slices
    _later(agent)
    _ticks(agent)
    assert _gi_starts(sim) == [4]  # the claim's instance stays, however idle
    assert "gpu-0-mig-1g-10gb-1" in kube.devices()  # offered in the tick that destroyed gi 1
    assert "destroyed, idle and held by no claim: MIG instance 1 of GPU 0 (3g.40gb at memory slice 0)" in \
        kube.cond()["message"]
    assert [r for _t, r, _m in kube.events if r == "IdleInstanceDestroyed"] == ["IdleInstanceDestroyed"]


def test_a_busy_instance_and_one_on_a_node_the_policy_keeps_are_never_destroyed(tmp_path: Path) -> None:
    sim = SimulatedNvml(H100, 2, seed=NODE, mig_enabled=True)
    _make_instances(sim, 0, 0)
    _make_instances(sim, 1, 0)
    sim.start_process(0, 301, gi_id=1)
    claims = _plugin_dir(tmp_path)
    frozen = {"metadata": {"name": "p"}, "spec": {"nodeSelector": {}, "reshaping": {"maxConcurrent": 0}}}
    _kube, _, agent = _node(2, sim=sim, dra_claims_dir=str(claims), policies=[frozen])
    _ticks(agent)
    _later(agent)
    _ticks(agent)
    assert _gi_starts(sim, 0) == [0] and _gi_starts(sim, 1) == [0]  # frozen: nothing goes
    _kube.policies = [copy.deepcopy(IDLE_30)]
    _ticks(agent)
    assert _gi_starts(sim, 0) == [0]  # a process runs in it: used outside DRA, withdrawn, never destroyed
    assert _gi_starts(sim, 1) == []


def test_nothing_is_destroyed_while_the_plugin_holds_the_lock_or_a_journal_file_is_unreadable(tmp_path: Path) -> None:
    from node.draplugin.nvml_lock import NvmlChangeLock, lock_path

    sim = SimulatedNvml(H100, 1, seed=NODE, mig_enabled=True)
    _make_instances(sim, 0, 0)
    claims = _plugin_dir(tmp_path)
    _, _, agent = _node(1, sim=sim, dra_claims_dir=str(claims), policies=[copy.deepcopy(IDLE_30)])
    _ticks(agent)
    _later(agent)
    plugin = NvmlChangeLock(lock_path(claims))
    with plugin:  # a prepare is under way
        _ticks(agent)
        assert _gi_starts(sim) == [0]
    (claims / "broken.json").write_text("{not json")
    _ticks(agent)
    assert _gi_starts(sim) == [0]  # a claim the journal cannot show might hold it
    (claims / "broken.json").unlink()
    _ticks(agent)
    assert _gi_starts(sim) == []
    plugin.close()


def test_without_the_plugins_lock_file_nothing_is_destroyed(tmp_path: Path) -> None:
    sim = SimulatedNvml(H100, 1, seed=NODE, mig_enabled=True)
    _make_instances(sim, 0, 0)
    claims = tmp_path / "claims"
    claims.mkdir()  # a journal directory, but no plugin has started: no lock file
    _, _, agent = _node(1, sim=sim, dra_claims_dir=str(claims), policies=[copy.deepcopy(IDLE_30)])
    _ticks(agent)
    _later(agent)
    _ticks(agent)
    assert _gi_starts(sim) == [0]
