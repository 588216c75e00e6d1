"""GPU health through full agent ticks: a simulated node, the emulated device plugin, an in-memory API server.

What an admin and the scheduler see: the GPUNode's ``health`` entries, summary and
``GpusHealthy`` condition, Events on the GPUNode and on the pods of a failed device,
the Node's allocatable, degraded label and unhealthy taint, the XID table ConfigMap
and the simulated node's inbox.
"""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path
from typing import Any

from kube.errors import KubeError
from mig.catalog import get_model
from node.agent import Agent
from node.health.ack import acknowledge
from node.nvml.simulated import SimulatedNvml, post_to_inbox
from node.base.settings import AgentSettings
from sharing.api.gpunode import read_gpunode
from sharing.api.keys import DEGRADED_LABEL, HEALTH_ACK_ANNOTATION, UNHEALTHY_TAINT
from tests.unit.test_reconciler_agent import Clock, FakeKube

H200 = get_model("H200")
THREE_G = H200.profile("3g.71gb")
MIG_3G = "nvidia.com/mig-3g.71gb"
WHOLE = "nvidia.com/gpu"
NS = "gpupack-system"
OTHER_TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


class HealthKube(FakeKube):
    """FakeKube plus what the health part writes: Events with their object, Node taints (guarded
    by resourceVersion, as a merge patch of a list replaces it) and label removal."""

    def __init__(self, node: str) -> None:
        super().__init__(node)
        self.node["metadata"]["resourceVersion"] = "1"
        self.node["spec"] = {"taints": [dict(OTHER_TAINT)]}
        self.object_events: list[tuple[str, str, str, str, str]] = []
        """(kind, namespace/name, type, reason, message)"""
        self.node_patches: list[dict[str, Any]] = []

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        self.node_patches.append(copy.deepcopy(patch))
        meta = patch.get("metadata") or {}
        if "resourceVersion" in meta and meta["resourceVersion"] != self.node["metadata"]["resourceVersion"]:
            raise KubeError(409, "the object has been modified")
        for key, value in (meta.get("labels") or {}).items():
            if value is None:
                self.node["metadata"]["labels"].pop(key, None)
            else:
                self.node["metadata"]["labels"][key] = value
        if "spec" in patch:
            for key, value in patch["spec"].items():
                self.node.setdefault("spec", {})[key] = copy.deepcopy(value)
        self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)

    def event(self, involved: Any, type_: str, reason: str, message: str, host: str | None = None) -> None:
        super().event(involved, type_, reason, message, host)
        where = f"{involved.get('namespace', '')}/{involved.get('name', '')}"
        self.object_events.append((involved.get("kind", ""), where, type_, reason, message))

    # ---------------------------------------------------------------- reading
    def status(self) -> dict[str, Any]:
        assert self.gpunode is not None
        status: dict[str, Any] = self.gpunode["status"]
        return status

    def cond(self, type_: str) -> dict[str, Any]:
        return next(c for c in self.status()["conditions"] if c["type"] == type_)

    def gpunode_events(self, reason: str) -> list[tuple[str, str]]:
        return [(t, m) for k, _w, t, r, m in self.object_events if k == "GPUNode" and r == reason]

    def pod_events(self, pod: str, reason: str | None = None) -> list[tuple[str, str, str]]:
        return [(t, r, m) for k, w, t, r, m in self.object_events
                if k == "Pod" and w == pod and (reason is None or r == reason)]

    def taints(self) -> list[dict[str, Any]]:
        return list((self.node.get("spec") or {}).get("taints") or [])


def _settings(**changes: Any) -> AgentSettings:
    return AgentSettings(node_name="n1", simulate="H200:1", emulate_device_plugin=True, idle_seconds=1.0,
                         min_patch_seconds=0.1, metrics_port=0).with_(**changes)


def _pod(name: str, resource: str, namespace: str = "ml") -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": {resource: "1"}}}]},
            "status": {"phase": "Running"}}


def _mig_node(count: int = 1, **settings: Any) -> tuple[HealthKube, SimulatedNvml, Agent, Clock]:
    """An H200 node in MIG mode, each GPU cut into two 3g.71gb instances (gi 1 at slice 0, gi 2 at slice 4)."""
    kube = HealthKube("n1")
    sim = SimulatedNvml(H200, count, seed="n1", mig_enabled=True)
    for index in range(count):
        for placement in THREE_G.placements[:2]:
            sim.create_gpu_instance(index, THREE_G.profile_id, placement)
    clock = Clock()
    agent = Agent(_settings(simulate=f"H200:{count}", **settings), sim, kube, clock=clock)  # type: ignore[arg-type]
    return kube, sim, agent, clock


def _full_node(count: int = 1, state_file: Path | None = None, **settings: Any) -> tuple[
        HealthKube, SimulatedNvml, Agent, Clock]:
    kube = HealthKube("n1")
    sim = SimulatedNvml(H200, count, state_file, seed="n1", mig_enabled=False)
    clock = Clock()
    agent = Agent(_settings(simulate=f"H200:{count}", **settings), sim, kube, clock=clock)  # type: ignore[arg-type]
    return kube, sim, agent, clock


def _ticks(agent: Agent, n: int = 2) -> None:
    for _ in range(n):
        agent.tick()


def _instance(kube: HealthKube, gpu: int, gi: int) -> dict[str, Any]:
    return next(i for i in kube.status()["gpus"][gpu]["instances"] if i["giId"] == gi)


# ------------------------------------------------------------ MIG instance XID
def test_an_xid_on_a_mig_instance_is_reported_and_withdrawn() -> None:
    kube, sim, agent, _clock = _mig_node()
    _ticks(agent)
    assert kube.node["status"]["allocatable"][MIG_3G] == "2"
    assert kube.cond("GpusHealthy")["status"] == "True"
    assert kube.status()["summary"]["unhealthyInstances"] == 0
    sim.inject_xid(0, 94, gi_id=2)
    _ticks(agent)
    health = _instance(kube, 0, 2).get("health")
    assert health is not None
    assert health["reason"] == "Xid94" and health["xid"] == 94 and health["withdrawn"] is True
    assert health["recovery"] == "ResetGpu"
    assert _instance(kube, 0, 1).get("health") is None
    assert kube.status()["gpus"][0].get("health") is None
    summary = kube.status()["summary"]
    assert summary["unhealthyInstances"] == 1 and summary["unhealthyGpus"] == 0
    assert summary.get("degraded") in (False, None)
    cond = kube.cond("GpusHealthy")
    assert cond["status"] == "False" and cond["reason"] == "DevicesWithdrawn"
    assert "MIG instance 2 of GPU 0: Xid94" in cond["message"]
    # The device plugin withdraws the instance: capacity stays, allocatable drops by one.
    assert kube.node["status"]["capacity"][MIG_3G] == "2"
    assert kube.node["status"]["allocatable"][MIG_3G] == "1"
    events = kube.gpunode_events("MigInstanceUnhealthy")
    assert len(events) == 1 and events[0][0] == "Warning" and "XID 94" in events[0][1]
    assert DEGRADED_LABEL not in kube.node["metadata"]["labels"]
    # The controller and the webhook read the fault.
    reading = read_gpunode(kube.gpunode)  # type: ignore[arg-type]
    assert reading is not None
    gpu = reading.gpus[0]
    assert [(i.health is not None) for i in sorted(gpu.instances, key=lambda i: i.start)] == [False, True]
    assert not reading.degraded


def test_the_pod_on_a_failed_instance_is_told() -> None:
    kube, sim, agent, _clock = _mig_node()
    kube.pods = [_pod("train", MIG_3G)]
    _ticks(agent)
    used = [i for i in kube.status()["gpus"][0]["instances"] if i["pods"]]
    assert [i["pods"] for i in used] == [["ml/train"]]
    gi = used[0]["giId"]
    sim.inject_xid(0, 48, gi_id=gi)
    _ticks(agent)
    health = _instance(kube, 0, gi)["health"]
    assert health["pods"] == ["ml/train"] and health["withdrawn"] is True
    failed = kube.pod_events("ml/train", "GpuFailed")
    assert len(failed) == 1 and failed[0][0] == "Warning"
    assert "XID 48" in failed[0][2] and "n1" in failed[0][2]
    # Only that instance is withdrawn; the pod keeps its (failed) device.
    assert kube.status()["summary"]["unhealthyInstances"] == 1
    assert kube.node["status"]["allocatable"][MIG_3G] == "1"


def test_an_application_xid_tells_the_pod_and_faults_nothing() -> None:
    kube, sim, agent, _clock = _mig_node()
    kube.pods = [_pod("train", MIG_3G)]
    _ticks(agent)
    gi = next(i["giId"] for i in kube.status()["gpus"][0]["instances"] if i["pods"])
    sim.inject_xid(0, 13, gi_id=gi)
    _ticks(agent)
    assert all(i.get("health") is None for i in kube.status()["gpus"][0]["instances"])
    assert kube.cond("GpusHealthy")["status"] == "True"
    assert [r for _t, r, _m in kube.pod_events("ml/train")] == ["XidApplicationError"]
    assert len(kube.gpunode_events("XidApplicationError")) == 1
    assert kube.node["status"]["allocatable"][MIG_3G] == "2"


def test_a_vanished_instance_takes_its_fault_and_the_plugin_advertises_again() -> None:
    kube, sim, agent, _clock = _mig_node()
    _ticks(agent)
    sim.inject_xid(0, 94, gi_id=2)
    _ticks(agent)
    assert kube.node["status"]["allocatable"][MIG_3G] == "1"
    sim.destroy_gpu_instance(0, 2)
    sim.create_gpu_instance(0, THREE_G.profile_id, THREE_G.placements[1])
    _ticks(agent)
    assert all(i.get("health") is None for i in kube.status()["gpus"][0]["instances"])
    assert kube.status()["summary"]["unhealthyInstances"] == 0
    assert kube.cond("GpusHealthy")["status"] == "True"
    assert kube.node["status"]["allocatable"][MIG_3G] == "2"
    recovered = kube.gpunode_events("GpuRecovered")
    assert len(recovered) == 1 and "no longer exists" in recovered[0][1]


# ------------------------------------------------------------------ ECC burst
def test_ecc_on_a_whole_gpu_degrades_the_node_until_a_reset() -> None:
    kube, sim, agent, _clock = _full_node(2)
    _ticks(agent)
    assert kube.node["status"]["allocatable"][WHOLE] == "2"
    sim.inject_ecc(0, 2)
    _ticks(agent)
    assert kube.node["metadata"]["labels"].get(DEGRADED_LABEL) == "true"
    assert kube.status()["summary"]["degraded"] is True
    health = kube.status()["gpus"][0]["health"]
    assert health["reason"] == "EccUncorrectable" and health["withdrawn"] is False
    assert kube.cond("GpusHealthy")["reason"] == "Degraded"
    # Not withdrawn: the device plugin keeps advertising it (gpupack keeps its own pods off).
    assert kube.node["status"]["allocatable"][WHOLE] == "2"
    assert UNHEALTHY_TAINT not in [t["key"] for t in kube.taints()]  # GPU 1 is fine
    assert len(kube.gpunode_events("GpuUnhealthy")) == 1
    reading = read_gpunode(kube.gpunode)  # type: ignore[arg-type]
    assert reading is not None and reading.degraded
    sim.reset_gpu(0)
    _ticks(agent)
    assert DEGRADED_LABEL not in kube.node["metadata"]["labels"]
    assert kube.status()["summary"].get("degraded") in (False, None)
    assert kube.status()["gpus"][0].get("health") is None
    assert kube.cond("GpusHealthy")["status"] == "True"
    assert len(kube.gpunode_events("GpuRecovered")) == 1
    assert kube.taints() == [OTHER_TAINT]


def test_ecc_on_the_only_gpu_also_taints_the_node() -> None:
    kube, sim, agent, _clock = _full_node(1)
    _ticks(agent)
    sim.inject_ecc(0, 1)
    _ticks(agent)
    assert kube.node["metadata"]["labels"].get(DEGRADED_LABEL) == "true"
    assert kube.cond("GpusHealthy")["reason"] == "AllGpusUnhealthy"
    assert [t["key"] for t in kube.taints()] == [OTHER_TAINT["key"], UNHEALTHY_TAINT]
    sim.reset_gpu(0)
    _ticks(agent)
    assert kube.taints() == [OTHER_TAINT] and DEGRADED_LABEL not in kube.node["metadata"]["labels"]


def test_the_pod_on_a_whole_gpu_hears_of_an_ecc_fault() -> None:
    kube, sim, agent, _clock = _full_node(2)
    kube.pods = [_pod("infer", WHOLE, namespace="serving")]
    _ticks(agent)
    holder = next(g["index"] for g in kube.status()["gpus"] if sim.processes(g["index"]))
    sim.inject_ecc(holder, 1)
    _ticks(agent)
    assert kube.status()["gpus"][holder]["health"]["pods"] == ["serving/infer"]
    assert [r for _t, r, _m in kube.pod_events("serving/infer")] == ["GpuFailed"]
    assert kube.node["metadata"]["labels"].get(DEGRADED_LABEL) == "true"
    assert UNHEALTHY_TAINT not in [t["key"] for t in kube.taints()]  # the other GPU is fine


# ------------------------------------------------------------ every GPU lost
def test_every_gpu_lost_taints_the_node_until_a_reboot() -> None:
    kube, sim, agent, _clock = _full_node(2)
    _ticks(agent)
    sim.lose_gpu(0)
    _ticks(agent)
    assert UNHEALTHY_TAINT not in [t["key"] for t in kube.taints()]  # one GPU of two
    sim.lose_gpu(1)
    _ticks(agent)
    ours = [t for t in kube.taints() if t["key"] == UNHEALTHY_TAINT]
    assert ours == [{"key": UNHEALTHY_TAINT, "value": "all-gpus", "effect": "NoSchedule"}]
    assert OTHER_TAINT in kube.taints()
    assert kube.cond("GpusHealthy")["reason"] == "AllGpusUnhealthy"
    assert kube.status()["summary"]["unhealthyGpus"] == 2
    assert [g["health"]["recovery"] for g in kube.status()["gpus"]] == ["RebootNode", "RebootNode"]
    # Further ticks do not rewrite the taint.
    patches = len(kube.node_patches)
    _ticks(agent, 3)
    assert [p for p in kube.node_patches[patches:] if "spec" in p] == []
    sim.reboot()
    _ticks(agent)
    assert kube.taints() == [OTHER_TAINT]
    assert kube.cond("GpusHealthy")["status"] == "True"
    assert all(g.get("health") is None for g in kube.status()["gpus"])
    assert kube.node["status"]["allocatable"][WHOLE] == "2"


def test_no_taint_when_the_settings_say_none() -> None:
    kube, sim, agent, _clock = _full_node(1, unhealthy_taint_effect="none")
    _ticks(agent)
    sim.lose_gpu(0)
    _ticks(agent)
    assert kube.taints() == [OTHER_TAINT]
    assert kube.cond("GpusHealthy")["reason"] == "AllGpusUnhealthy"
    assert kube.status()["gpus"][0]["health"]["withdrawn"] is True


def test_the_taint_effect_follows_the_settings() -> None:
    kube, sim, agent, _clock = _full_node(1, unhealthy_taint_effect="NoExecute")
    _ticks(agent)
    sim.lose_gpu(0)
    _ticks(agent)
    assert [t for t in kube.taints() if t["key"] == UNHEALTHY_TAINT] == [
        {"key": UNHEALTHY_TAINT, "value": "all-gpus", "effect": "NoExecute"}]


def test_a_taint_added_by_someone_else_meanwhile_is_kept() -> None:
    kube, sim, agent, _clock = _full_node(1)
    _ticks(agent)
    sim.lose_gpu(0)
    original = kube.get_node
    calls = {"n": 0}

    def racing_get_node(name: str) -> dict[str, Any]:
        node = original(name)
        calls["n"] += 1
        if calls["n"] == 1:  # after the tick read the Node, another controller adds a taint
            kube.node["spec"]["taints"].append({"key": "late", "effect": "NoSchedule"})
            kube.node["metadata"]["resourceVersion"] = str(int(kube.node["metadata"]["resourceVersion"]) + 1)
        return node

    kube.get_node = racing_get_node  # type: ignore[method-assign]
    agent.tick()
    keys = [t["key"] for t in kube.taints()]
    assert "late" in keys and OTHER_TAINT["key"] in keys and UNHEALTHY_TAINT in keys


# ------------------------------------------------------------------- restart
def test_a_restarted_agent_keeps_the_fault_and_does_not_announce_it_again() -> None:
    kube, sim, agent, clock = _full_node(1)
    _ticks(agent)
    sim.inject_xid(0, 48)
    _ticks(agent)
    health = kube.status()["gpus"][0]["health"]
    assert health["reason"] == "Xid48"
    assert len(kube.gpunode_events("GpuUnhealthy")) == 1
    assert kube.node["status"]["allocatable"][WHOLE] == "0"
    second = Agent(_settings(), sim, kube, clock=clock)  # type: ignore[arg-type]
    _ticks(second, 3)
    assert kube.status()["gpus"][0]["health"] == health  # same fault, same since
    assert len(kube.gpunode_events("GpuUnhealthy")) == 1
    assert kube.gpunode_events("GpuRecovered") == []
    assert kube.node["status"]["allocatable"][WHOLE] == "0"  # still withheld by the (new) plugin
    sim.reset_gpu(0)
    _ticks(second)
    assert kube.status()["gpus"][0].get("health") is None
    assert len(kube.gpunode_events("GpuRecovered")) == 1
    assert kube.node["status"]["allocatable"][WHOLE] == "1"


def test_an_acknowledgement_on_the_gpunode_ends_a_failed_remap() -> None:
    kube, sim, agent, clock = _full_node(1)
    _ticks(agent)
    sim.inject_row_remap(0, failed=True)
    _ticks(agent)
    health = kube.status()["gpus"][0]["health"]
    assert health["reason"] == "RowRemapFailure" and health["recovery"] == "Acknowledge"
    assert kube.node["metadata"]["labels"].get(DEGRADED_LABEL) == "true"
    clock.t += 10
    assert kube.gpunode is not None
    annotations = kube.gpunode["metadata"].setdefault("annotations", {})
    annotations[HEALTH_ACK_ANNOTATION] = acknowledge(
        annotations, [0], dt.datetime.fromtimestamp(clock.t, dt.timezone.utc))
    _ticks(agent, 3)
    assert kube.status()["gpus"][0].get("health") is None
    assert DEGRADED_LABEL not in kube.node["metadata"]["labels"]
    recovered = kube.gpunode_events("GpuRecovered")
    assert len(recovered) == 1 and "acknowledged" in recovered[0][1]


def test_a_malformed_acknowledgement_is_reported_and_acknowledges_nothing() -> None:
    kube, sim, agent, _clock = _full_node(1)
    _ticks(agent)
    sim.inject_row_remap(0, failed=True)
    _ticks(agent)
    assert kube.gpunode is not None
    kube.gpunode["metadata"]["annotations"] = {HEALTH_ACK_ANNOTATION: "{not json"}
    _ticks(agent)
    assert kube.status()["gpus"][0]["health"]["reason"] == "RowRemapFailure"
    assert len(kube.gpunode_events("HealthAcknowledgementIgnored")) >= 1


# ----------------------------------------------------------------- XID table
def _table(kube: HealthKube, text: str) -> None:
    kube.configmaps[(NS, "gpupack-xid-table")] = {"metadata": {"resourceVersion": kube._bump()},
                                                  "data": {"xids.yaml": text}}


def test_the_xid_table_configmap_overrides_the_builtin_table() -> None:
    kube, sim, agent, _clock = _full_node(2)
    _table(kube, "- {xid: 13, action: unhealthy, recovery: ResetGpu, description: not our apps}\n")
    _ticks(agent)
    sim.inject_xid(1, 13)
    _ticks(agent)
    health = kube.status()["gpus"][1]["health"]
    assert health["reason"] == "Xid13" and "not our apps" in health["message"]
    assert kube.status()["gpus"][0].get("health") is None
    assert kube.gpunode_events("XidApplicationError") == []
    assert kube.gpunode_events("XidTableInvalid") == []


def test_a_malformed_xid_table_is_reported_and_the_builtin_table_stays() -> None:
    kube, sim, agent, _clock = _full_node(1)
    _table(kube, "- {xid: 13, action: unhealthy}\n- {xid: 70000, action: unhealthy}\n")
    _ticks(agent)
    invalid = kube.gpunode_events("XidTableInvalid")
    assert len(invalid) == 1 and invalid[0][0] == "Warning"
    assert "entry 1" in invalid[0][1] and "70000" in invalid[0][1]
    assert "gpupack-xid-table" in invalid[0][1]
    sim.inject_xid(0, 13)
    _ticks(agent)
    assert kube.status()["gpus"][0].get("health") is None  # 13 is still the application's
    assert len(kube.gpunode_events("XidApplicationError")) == 1
    assert "entry 1" in kube.cond("GpusHealthy")["message"]


def test_a_table_that_turns_malformed_keeps_the_last_good_one() -> None:
    kube, sim, agent, clock = _full_node(1)
    _table(kube, "- {xid: 13, action: unhealthy}\n")
    _ticks(agent)
    _table(kube, "- {xid: 13, action: sometimes}\n")
    clock.t += 61  # the table is re-read every minute
    _ticks(agent)
    invalid = kube.gpunode_events("XidTableInvalid")
    assert len(invalid) == 1 and "entry 0 (xid 13)" in invalid[0][1]
    sim.inject_xid(0, 13)
    _ticks(agent)
    assert kube.status()["gpus"][0]["health"]["reason"] == "Xid13"


# --------------------------------------------------------------------- inbox
def test_a_fault_posted_to_the_inbox_is_picked_up_at_the_next_tick(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    kube, _sim, agent, _clock = _full_node(2, state_file=state)
    _ticks(agent)
    post_to_inbox(state, {"op": "xid", "gpu": 0, "xid": 48})
    agent.tick()
    health = kube.status()["gpus"][0]["health"]
    assert health["reason"] == "Xid48" and health["xid"] == 48 and health["withdrawn"] is True
    assert kube.status()["gpus"][1].get("health") is None
    assert not (tmp_path / "node.json.inbox").exists()  # consumed
    assert kube.node["status"]["allocatable"][WHOLE] == "1"


def test_an_inbox_ecc_burst_and_reset(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    kube, _sim, agent, _clock = _full_node(1, state_file=state)
    _ticks(agent)
    post_to_inbox(state, {"op": "ecc", "gpu": 0, "count": 2})
    _ticks(agent)
    assert kube.status()["gpus"][0]["health"]["reason"] == "EccUncorrectable"
    post_to_inbox(state, {"op": "reset", "gpu": 0})
    _ticks(agent)
    assert kube.status()["gpus"][0].get("health") is None


# ------------------------------------------------------------ lost GPUs and restarts
def test_a_gpu_that_recovers_while_another_is_lost_is_advertised_again() -> None:
    kube, sim, agent, _clock = _full_node(2)
    _ticks(agent)
    sim.inject_xid(0, 48)
    _ticks(agent)
    assert kube.node["status"]["allocatable"][WHOLE] == "1"
    sim.lose_gpu(1)
    _ticks(agent)
    assert kube.node["status"]["allocatable"][WHOLE] == "0"
    sim.reset_gpu(0)
    _ticks(agent, 3)
    assert kube.status()["gpus"][0].get("health") is None
    assert kube.node["status"]["capacity"][WHOLE] == "1"  # the lost GPU is not enumerated
    # A lost GPU does not keep a recovered one withheld: a restarted plugin does not see the lost one.
    assert kube.node["status"]["allocatable"][WHOLE] == "1"


def test_a_restarted_agent_still_reports_a_lost_gpu() -> None:
    kube, sim, agent, clock = _full_node(2)
    _ticks(agent)
    sim.lose_gpu(1)
    _ticks(agent)
    assert kube.status()["summary"]["unhealthyGpus"] == 1
    lost = kube.status()["gpus"][1]["health"]
    assert lost["recovery"] == "RebootNode"
    second = Agent(_settings(simulate="H200:2"), sim, kube, clock=clock)  # type: ignore[arg-type]
    _ticks(second, 2)
    # The restarted agent reports the lost GPU as its predecessor saw it (read back from the status).
    assert [g["index"] for g in kube.status()["gpus"]] == [0, 1]
    assert kube.status()["gpus"][1].get("health") == lost
    assert kube.status()["summary"]["unhealthyGpus"] == 1


def test_a_restarted_agent_keeps_the_taint_while_every_gpu_is_lost() -> None:
    kube, sim, agent, clock = _full_node(2)
    _ticks(agent)
    sim.lose_gpu(0)
    sim.lose_gpu(1)
    _ticks(agent)
    assert UNHEALTHY_TAINT in [t["key"] for t in kube.taints()]
    second = Agent(_settings(simulate="H200:2"), sim, kube, clock=clock)  # type: ignore[arg-type]
    _ticks(second, 2)
    # Every GPU still lost after a restart: the taint stays.
    assert UNHEALTHY_TAINT in [t["key"] for t in kube.taints()]
    assert kube.cond("GpusHealthy")["reason"] == "AllGpusUnhealthy"


def test_a_fault_is_published_at_once_despite_the_status_rate_limit() -> None:
    # A long rate limit and a still clock: without a fault nothing more is written, a fault is written at once.
    kube, sim, agent, clock = _mig_node(min_patch_seconds=3600.0)
    _ticks(agent)
    written = kube.status_patches
    clock.t += 1
    agent.tick()  # nothing changed on the node
    assert kube.status_patches == written
    sim.inject_xid(0, 94, gi_id=2)
    agent.tick()
    assert kube.status_patches == written + 1
    assert _instance(kube, 0, 2).get("health") is not None
