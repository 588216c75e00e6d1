"""The agent loop against an in-memory stand-in for ``node.base.kube.Kube`` (our own wrapper).

Covers what the e2e test cannot force: NVML missing, an agent killed in the middle
of a reshape and restarted, and settings from the environment.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from controller.state.build import refused_gpus
from kube.errors import KubeError
from mig.catalog import get_model
from node.agent import Agent
from node.nvml.simulated import SimulatedNvml
from node.base.settings import AgentSettings

H200 = get_model("H200")


class FakeKube:
    """Just enough API server: merge patches, generations, labels; no watch."""

    def __init__(self, node: str) -> None:
        self.node: dict[str, Any] = {"metadata": {"name": node, "uid": "n-uid", "labels": {
            "nvidia.com/gpu.deploy.device-plugin": "true"}}, "status": {"capacity": {}, "allocatable": {}}}
        self.gpunode: dict[str, Any] | None = None
        self.pods: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str]] = []
        self.rv = 0
        self.fail_status_patches = False
        self.status_patches = 0
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}
        self.policies: list[dict[str, Any]] | None = []

    def _bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def get_node(self, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.node)

    def get_gpunode(self, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.gpunode)

    def create_gpunode(self, name: str, node_uid: str | None) -> dict[str, Any]:
        self.gpunode = {"metadata": {"name": name, "uid": "g-uid", "generation": 1, "resourceVersion": self._bump()},
                        "spec": {}}
        return copy.deepcopy(self.gpunode)

    def set_spec(self, spec: dict[str, Any]) -> None:
        assert self.gpunode is not None
        self.gpunode["spec"] = spec
        self.gpunode["metadata"]["generation"] += 1

    def patch_gpunode_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        if self.fail_status_patches:
            raise KubeError(503, "unavailable")
        self.status_patches += 1
        assert self.gpunode is not None
        self.gpunode.setdefault("status", {}).update(copy.deepcopy(status))
        self.gpunode["metadata"]["resourceVersion"] = self._bump()
        return copy.deepcopy(self.gpunode)

    def wait_gpunode_change(self, name: str, rv: str, timeout_s: float) -> None:
        return None

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        labels = self.node["metadata"]["labels"]
        for key, value in patch["metadata"]["labels"].items():
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value

    def patch_node_status(self, name: str, patch: dict[str, Any]) -> None:
        for key in ("capacity", "allocatable"):
            self.node["status"][key].update(patch["status"][key])

    def list_node_pods(self, node_name: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.pods)

    def delete_node_pods(self, namespace: str, selector: str, node_name: str) -> int:
        return 0

    def list_sharing_policies(self) -> list[dict[str, Any]]:
        if self.policies is None:
            raise KubeError(403, "sharingpolicies is forbidden")
        return copy.deepcopy(self.policies)

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.configmaps.get((namespace, name)))

    def write_configmap(self, namespace: str, name: str, data: dict[str, str], rv: str | None) -> None:
        current = self.configmaps.get((namespace, name))
        if (current is None) != (rv is None) or (current and current["metadata"]["resourceVersion"] != rv):
            raise KubeError(409, "conflict")
        self.configmaps[(namespace, name)] = {"metadata": {"resourceVersion": self._bump()}, "data": dict(data)}

    def event(self, involved: Any, type_: str, reason: str, message: str, host: str | None = None) -> None:
        self.events.append((type_, reason, message))
        if involved.get("kind") == "Pod":  # the agent's admission policy admits an Event on a pod only so
            assert host == self.node["metadata"]["name"], (involved, host)


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        self.t += 0.5
        return self.t


def _settings(**changes: Any) -> AgentSettings:
    return AgentSettings(node_name="n1", simulate="H200:1", emulate_device_plugin=True, idle_seconds=1.0,
                         min_patch_seconds=0.1, metrics_port=0).with_(**changes)


def _layout(kube: FakeKube) -> list[str]:
    assert kube.gpunode is not None
    return sorted(i["profile"] for i in kube.gpunode["status"]["gpus"][0]["instances"])


def _cond(kube: FakeKube, type_: str) -> dict[str, Any]:
    assert kube.gpunode is not None
    return next(c for c in kube.gpunode["status"]["conditions"] if c["type"] == type_)


def test_nvml_missing_gives_a_condition_not_a_crash() -> None:
    kube = FakeKube("n1")
    agent = Agent(_settings(simulate="", emulate_device_plugin=False), None, kube,  # type: ignore[arg-type]
                  backend_error="NVML could not be opened: NVML_ERROR_LIBRARY_NOT_FOUND", clock=Clock())
    agent.tick()
    agent.tick()
    cond = _cond(kube, "NvmlReady")
    assert cond["status"] == "False" and cond["reason"] == "NvmlUnavailable"
    assert "LIBRARY_NOT_FOUND" in cond["message"]
    # The device plugin's sharing config is still written and selected for the node.
    cm = kube.configmaps[("gpu-operator", "gpupack-device-plugin-config")]
    assert "migStrategy: mixed" in cm["data"]["gpupack-n1"]
    assert kube.node["metadata"]["labels"]["nvidia.com/device-plugin.config"] == "gpupack-n1"


def test_journal_write_failure_stops_before_nvml(tmp_path: Path) -> None:
    kube = FakeKube("n1")
    sim = SimulatedNvml(H200, 1, tmp_path / "s.json", seed="n1")
    sim.create_gpu_instance(0, H200.profile("7g.141gb").profile_id, H200.profile("7g.141gb").placements[0])
    clock = Clock()
    agent = Agent(_settings(), sim, kube, clock=clock)  # type: ignore[arg-type]
    agent.tick()
    agent.tick()
    kube.set_spec({"gpus": [{"index": 0, "migEnabled": True, "layout": [{"profile": "3g.71gb"}] * 2}]})
    kube.fail_status_patches = True
    with pytest.raises(KubeError):
        agent.tick()
    assert [str(i.placed) for i in sim.gpu_instances(0)] == ["7g.141gb@0:8"]


@pytest.mark.parametrize("kill_after", [1, 2, 3, 4])
def test_agent_killed_mid_reshape_is_resumed_by_the_next_agent(tmp_path: Path, kill_after: int) -> None:
    """Kill the agent after ``kill_after`` NVML changes; a new agent (same state file) finishes."""
    kube = FakeKube("n1")
    state = tmp_path / "s.json"
    sim = SimulatedNvml(H200, 1, state, seed="n1")
    for start in (0, 4):
        sim.create_gpu_instance(0, H200.profile("3g.71gb").profile_id, H200.profile("3g.71gb").placements[start // 4])
    clock = Clock()
    agent = Agent(_settings(), sim, kube, clock=clock)  # type: ignore[arg-type]
    for _ in range(3):
        agent.tick()
    kube.set_spec({"gpus": [{"index": 0, "migEnabled": True, "layout": [{"profile": "1g.18gb"}] * 7}]})
    changes = {"n": 0}

    class Killed(BaseException):
        pass

    def hook(op: str, _index: int, when: str) -> None:
        if op in ("create", "destroy") and when == "after":
            changes["n"] += 1
            if changes["n"] == kill_after:
                raise Killed

    sim.hook = hook
    with pytest.raises(Killed):
        for _ in range(20):
            agent.tick()
    assert kube.gpunode is not None
    assert kube.gpunode["status"]["reconfiguration"]["phase"] == "Applying"
    assert kube.node["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] == "paused-for-mig-change"

    fresh = SimulatedNvml(H200, 1, state, seed="n1")
    second = Agent(_settings(), fresh, kube, clock=clock)  # type: ignore[arg-type]
    for _ in range(10):
        second.tick()
    assert kube.gpunode["status"]["reconfiguration"]["phase"] == "Succeeded"
    assert _layout(kube) == ["1g.18gb"] * 7
    assert kube.node["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert kube.node["status"]["allocatable"]["nvidia.com/mig-1g.18gb"] == "7"
    assert kube.node["status"]["allocatable"]["nvidia.com/mig-3g.71gb"] == "0"
    assert _cond(kube, "LayoutApplied")["status"] == "True"
    assert any(reason == "MigReconfigurationSucceeded" for _t, reason, _m in kube.events)


def test_settings_from_environment_and_bad_values() -> None:
    settings = AgentSettings.from_env({"GPUPACK_AGENT_IDLE_SECONDS": "30", "GPUPACK_AGENT_MODE": "operator",
                                       "GPUPACK_AGENT_PAUSE_DEVICE_PLUGIN": "false"})
    assert settings.idle_seconds == 30.0 and settings.mode == "operator" and settings.pause_device_plugin is False
    with pytest.raises(ValueError, match="GPUPACK_AGENT_POLL_SECONDS"):
        AgentSettings.from_env({"GPUPACK_AGENT_POLL_SECONDS": "soon"})
    with pytest.raises(ValueError, match="not one of direct, operator"):
        AgentSettings.from_env({"GPUPACK_AGENT_MODE": "yolo"})
    with pytest.raises(ValueError, match="expected true or false"):
        AgentSettings.from_env({"GPUPACK_AGENT_EMULATE_DEVICE_PLUGIN": "maybe"})


def _publish_as_controller(kube: FakeKube, namespace: str = "gpu-operator") -> None:
    """What the controller's cycle does with the agent's request (``controller.writes.mig_configs``)."""
    from controller.writes.mig_configs import published_config
    from sharing.api.gpunode import read_gpunode

    assert kube.gpunode is not None
    reading = read_gpunode(kube.gpunode)
    assert reading is not None and reading.mig_config_request is not None
    key = (namespace, "default-mig-parted-config")
    data = dict(kube.configmaps.get(key, {}).get("data") or {})
    text = published_config(data.get("config.yaml"), [(reading.name, reading.mig_config_request)])
    if text is not None:
        kube.configmaps[key] = {"metadata": {"resourceVersion": kube._bump()}, "data": {**data, "config.yaml": text}}


def test_operator_mode_hands_idle_gpus_to_mig_manager_and_follows_its_state(tmp_path: Path) -> None:
    from mig.migparted import parse_config

    kube = FakeKube("n1")
    sim = SimulatedNvml(H200, 2, seed="n1")
    for index in (0, 1):
        sim.create_gpu_instance(index, H200.profile("7g.141gb").profile_id, H200.profile("7g.141gb").placements[0])
    busy_gi = sim.gpu_instances(1)[0].gi_id
    sim.start_process(1, 99, 1000, busy_gi)
    clock = Clock()
    agent = Agent(_settings(mode="operator", emulate_device_plugin=False, simulate="H200:2"), sim, kube,  # type: ignore[arg-type]
                  clock=clock)
    for _ in range(4):  # instances idle for > idle_seconds
        agent.tick()
    kube.node["metadata"]["labels"]["nvidia.com/mig.config.state"] = "success"  # left from an earlier config
    kube.set_spec({"gpus": [{"index": i, "migEnabled": True, "layout": [{"profile": "3g.71gb"}] * 2} for i in (0, 1)]})
    agent.tick()
    assert kube.gpunode is not None
    reconf = kube.gpunode["status"]["reconfiguration"]
    assert reconf["phase"] == "Applying" and reconf["mode"] == "operator"
    # The agent only asks: mig-manager's ConfigMap is the controller's to write, and the label
    # waits until the config is there (mig-manager would fail on a name it cannot find).
    assert ("gpu-operator", "default-mig-parted-config") not in kube.configmaps
    assert "nvidia.com/mig.config" not in kube.node["metadata"]["labels"]
    agent.tick()
    assert "nvidia.com/mig.config" not in kube.node["metadata"]["labels"]
    assert "waiting for the controller to publish" in _cond(kube, "LayoutApplied")["message"]
    _publish_as_controller(kube)
    agent.tick()
    name = kube.node["metadata"]["labels"]["nvidia.com/mig.config"]
    assert name == reconf["migConfig"]
    assert kube.node["metadata"]["labels"]["nvidia.com/mig.config.state"] == "pending"  # not the old success
    config = parse_config(kube.configmaps[("gpu-operator", "default-mig-parted-config")]["data"]["config.yaml"])
    entries = config.mig_configs[name]
    assert entries[0].mig_devices == {"3g.71gb": 2}
    assert entries[1].mig_devices == {"7g.141gb": 1}  # busy GPU: unchanged entry, mig-manager leaves it alone
    assert sim.gpu_instances(0)[0].profile == "7g.141gb"  # the agent itself did not touch NVML
    agent.tick()
    assert _cond(kube, "LayoutApplied")["reason"] == "Reconfiguring"
    kube.node["metadata"]["labels"]["nvidia.com/mig.config.state"] = "success"
    agent.tick()
    assert kube.gpunode["status"]["reconfiguration"]["phase"] == "Succeeded"
    assert refused_gpus(kube.gpunode) == frozenset()  # in flight, then done: nothing given up on
    # mig-manager said success but the GPU did not change (here: no real mig-manager): no loop.
    agent.tick()
    assert kube.gpunode["status"]["reconfiguration"]["phase"] == "Succeeded"
    assert _cond(kube, "LayoutApplied")["reason"] == "LayoutMismatch"
    # The controller reads which GPUs the agent gave up on from the typed status, not the message
    # (whose "GPUs [0]" the earlier reading, "GPU <n>:", never matched).
    answer = kube.gpunode["status"]["gpus"][0]["layoutRefusal"]
    assert answer["phase"] == "Failed" and answer["generation"] == kube.gpunode["metadata"]["generation"]
    assert refused_gpus(kube.gpunode) == {0}


def test_direct_mode_waits_while_mig_manager_is_busy() -> None:
    kube = FakeKube("n1")
    sim = SimulatedNvml(H200, 1, seed="n1")
    agent = Agent(_settings(), sim, kube, clock=Clock())  # type: ignore[arg-type]
    agent.tick()
    kube.node["metadata"]["labels"]["nvidia.com/mig.config.state"] = "pending"
    kube.set_spec({"gpus": [{"index": 0, "migEnabled": True, "layout": [{"profile": "7g.141gb"}]}]})
    for _ in range(3):
        agent.tick()
    assert sim.gpu_instances(0) == ()
    assert _cond(kube, "LayoutApplied")["reason"] == "MigManagerBusy"
    kube.node["metadata"]["labels"]["nvidia.com/mig.config.state"] = "success"
    for _ in range(3):
        agent.tick()
    assert [i.profile for i in sim.gpu_instances(0)] == ["7g.141gb"]


def test_pinned_placements_are_honoured() -> None:
    kube = FakeKube("n1")
    sim = SimulatedNvml(H200, 1, seed="n1")
    agent = Agent(_settings(), sim, kube, clock=Clock())  # type: ignore[arg-type]
    agent.tick()
    kube.set_spec({"gpus": [{"index": 0, "migEnabled": True, "layout": [
        {"profile": "3g.71gb", "start": 4}, {"profile": "2g.35gb", "start": 0}]}]})
    for _ in range(4):
        agent.tick()
    assert sorted(str(i.placed) for i in sim.gpu_instances(0)) == ["2g.35gb@0:2", "3g.71gb@4:4"]
    assert _cond(kube, "LayoutApplied")["status"] == "True"


def test_status_patches_are_rate_limited_with_a_heartbeat() -> None:
    kube = FakeKube("n1")
    sim = SimulatedNvml(H200, 1, seed="n1")
    clock = Clock()
    agent = Agent(_settings(min_patch_seconds=2.0, heartbeat_seconds=60.0), sim, kube, clock=clock)  # type: ignore[arg-type]
    for _ in range(3):
        agent.tick()
        clock.t += 3
    settled = kube.status_patches
    for _ in range(20):  # nothing changes: no patches until the heartbeat is due
        agent.tick()
    assert kube.status_patches == settled
    clock.t += 61
    agent.tick()
    assert kube.status_patches == settled + 1
    sim.create_gpu_instance(0, H200.profile("7g.141gb").profile_id, H200.profile("7g.141gb").placements[0])
    agent.tick()  # a change within min_patch_seconds waits ...
    assert kube.status_patches == settled + 1
    clock.t += 3
    agent.tick()  # ... and goes out once the interval has passed
    assert kube.status_patches == settled + 2
    assert _layout(kube) == ["7g.141gb"]


def test_device_plugin_label_is_restored_to_what_it_was() -> None:
    kube = FakeKube("n1")
    del kube.node["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"]  # not a GPU Operator node
    sim = SimulatedNvml(H200, 1, seed="n1")
    agent = Agent(_settings(), sim, kube, clock=Clock())  # type: ignore[arg-type]
    agent.tick()
    kube.set_spec({"gpus": [{"index": 0, "migEnabled": True, "layout": [{"profile": "7g.141gb"}]}]})
    paused_seen: list[str | None] = []
    original = kube.patch_node

    def spy(name: str, patch: dict[str, Any]) -> None:
        paused_seen.append(patch["metadata"]["labels"].get("nvidia.com/gpu.deploy.device-plugin", "-"))
        original(name, patch)

    kube.patch_node = spy  # type: ignore[method-assign]
    for _ in range(3):
        agent.tick()
    assert "paused-for-mig-change" in paused_seen
    assert "nvidia.com/gpu.deploy.device-plugin" not in kube.node["metadata"]["labels"]
    assert [i.profile for i in sim.gpu_instances(0)] == ["7g.141gb"]


def test_gpus_that_cannot_be_reshaped_say_why() -> None:
    kube = FakeKube("n1")
    sim = SimulatedNvml(H200, 3, seed="n1", mig_enabled=True)
    sim.set_mig_mode(1, False)  # pending until reset
    sim.set_mig_mode(2, False)
    sim.reset_gpu(2)  # MIG off
    agent = Agent(_settings(simulate="H200:3"), sim, kube, clock=Clock())  # type: ignore[arg-type]
    agent.tick()
    layout = [{"profile": "7g.141gb"}]
    kube.set_spec({"gpus": [{"index": i, "migEnabled": True, "layout": layout} for i in (1, 2)]
                   + [{"index": 5, "migEnabled": True, "layout": layout}]})
    agent.tick()
    message = _cond(kube, "LayoutApplied")["message"]
    assert _cond(kube, "LayoutApplied")["reason"] == "LayoutRefused"
    assert "GPU 1: a MIG-mode change is pending" in message
    assert "GPU 2: changing MIG mode needs a GPU reset" in message
    assert "GPU 5: no such GPU on this node (3 GPU(s))" in message
    assert refused_gpus(kube.gpunode) == {1, 2}  # typed, per GPU the node has
    assert kube.gpunode["status"]["gpus"][2]["layoutRefusal"]["phase"] == "Refused"
    assert sim.gpu_instances(0) == ()
    assert sim.device_info(1).mig_enabled and sim.device_info(1).mig_pending is False  # untouched, still pending
    assert sim.device_info(2).mig_enabled is False


def _policy(name: str, reshaping: dict[str, Any], selector: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "gpupack.io/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": selector or {}}, "reshaping": reshaping}}


def test_sharing_policy_freezes_layouts_and_sets_the_idle_time() -> None:
    kube = FakeKube("n1")
    kube.node["metadata"]["labels"]["pool"] = "a"
    sim = SimulatedNvml(H200, 1, seed="n1")
    seven = H200.profile("7g.141gb")
    sim.create_gpu_instance(0, seven.profile_id, seven.placements[0])
    clock = Clock()
    kube.policies = [_policy("frozen", {"maxConcurrent": 0}, {"pool": "a"}),
                     _policy("other-pool", {"idleSeconds": 5}, {"pool": "b"})]
    agent = Agent(_settings(), sim, kube, clock=clock)  # type: ignore[arg-type]
    agent.tick()
    kube.set_spec({"gpus": [{"index": 0, "migEnabled": True, "layout": [{"profile": "3g.71gb"}] * 2}]})
    for _ in range(3):
        agent.tick()
    cond = _cond(kube, "LayoutApplied")
    assert cond["reason"] == "ReshapingNotAllowed" and "frozen by SharingPolicy frozen" in cond["message"]
    assert [i.profile for i in sim.gpu_instances(0)] == ["7g.141gb"]
    # Unfrozen, with a 600 s idle time: the instance must be idle that long first.
    kube.policies = [_policy("slow", {"idleSeconds": 600}, {"pool": "a"})]
    agent.tick()
    assert _cond(kube, "LayoutApplied")["reason"] == "WaitingForIdle"
    assert "600s" in _cond(kube, "LayoutApplied")["message"]
    clock.t += 601
    for _ in range(3):
        agent.tick()
    assert [i.profile for i in sim.gpu_instances(0)] == ["3g.71gb", "3g.71gb"]


def test_reshaping_windows_gate_new_reshapes_only() -> None:
    import datetime as dt

    kube = FakeKube("n1")
    sim = SimulatedNvml(H200, 1, seed="n1")
    clock = Clock()
    clock.t = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc).timestamp()  # a Monday, 12:00 UTC
    kube.policies = [_policy("nights", {"windows": [{"start": "22:00", "end": "02:00", "days": ["Mon"]}],
                                        "idleSeconds": 0})]
    agent = Agent(_settings(), sim, kube, clock=clock)  # type: ignore[arg-type]
    agent.tick()
    kube.set_spec({"gpus": [{"index": 0, "migEnabled": True, "layout": [{"profile": "7g.141gb"}]}]})
    agent.tick()
    assert sim.gpu_instances(0) == ()
    assert "outside the reshaping windows of SharingPolicy nights (22:00-02:00 Mon UTC)" in _cond(
        kube, "LayoutApplied")["message"]
    clock.t = dt.datetime(2026, 12, 1, 1, 30, tzinfo=dt.timezone.utc).timestamp()  # Tue 01:30: Monday's window
    for _ in range(3):
        agent.tick()
    assert [i.profile for i in sim.gpu_instances(0)] == ["7g.141gb"]


def test_unreadable_policies_fall_back_to_the_agent_settings() -> None:
    kube = FakeKube("n1")
    kube.policies = None  # RBAC without sharingpolicies
    sim = SimulatedNvml(H200, 1, seed="n1")
    agent = Agent(_settings(), sim, kube, clock=Clock())  # type: ignore[arg-type]
    agent.tick()
    kube.set_spec({"gpus": [{"index": 0, "migEnabled": True, "layout": [{"profile": "7g.141gb"}]}]})
    for _ in range(3):
        agent.tick()
    assert [i.profile for i in sim.gpu_instances(0)] == ["7g.141gb"]
    assert agent.rules.idle_seconds == 1.0 and agent.rules.problems


class DownKube(FakeKube):
    """The API server is down: every call gets no answer, as :mod:`kube.client` reports it."""

    def __init__(self, node: str) -> None:
        super().__init__(node)
        self.calls = 0

    def __getattribute__(self, name: str) -> Any:
        attribute = super().__getattribute__(name)
        if callable(attribute) and not name.startswith("_") and name != "event":
            def down(*_args: Any, **_kwargs: Any) -> Any:
                self.calls += 1
                raise KubeError(0, "API server unreachable: connection refused")
            return down
        return attribute


def test_an_api_outage_backs_off_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    """The agent used to spin (about 160 ticks a second, a traceback each) while the API server was down."""
    kube = DownKube("n1")
    sim = SimulatedNvml(H200, 1, seed="n1")
    sleeps: list[float] = []
    agent = Agent(_settings(poll_seconds=2.0), sim, kube, clock=Clock(), sleep=sleeps.append)  # type: ignore[arg-type]
    with caplog.at_level("DEBUG", logger="gpupack.agent"):
        agent.run_forever(stop=lambda: len(sleeps) >= 12)
    assert kube.calls == 12  # one failed call per attempt, each followed by a pause
    assert all(1.0 <= s <= 30.0 for s in sleeps) and max(sleeps) > 8.0, sleeps  # grows to the ceiling
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "Kubernetes API error" in warnings[0].getMessage()
    assert agent.metrics.registry.get_sample_value("gpupack_agent_consecutive_failures") == 12
    # The API server comes back: the next tick succeeds, and the agent says so once.
    healthy = FakeKube("n1")
    agent.kube = healthy  # type: ignore[assignment]
    caplog.clear()
    with caplog.at_level("INFO", logger="gpupack.agent"):
        agent.run_forever(stop=lambda: healthy.status_patches > 0)
    assert any("recovered after 12 failed attempts" in r.getMessage() for r in caplog.records)
    assert agent.metrics.registry.get_sample_value("gpupack_agent_consecutive_failures") == 0


def test_every_status_patch_carries_a_heartbeat() -> None:
    """The controller tells a live agent from a dead one by status.heartbeatTime."""
    kube = FakeKube("n1")
    clock = Clock()
    agent = Agent(_settings(heartbeat_seconds=30.0), SimulatedNvml(H200, 1, seed="n1"), kube,  # type: ignore[arg-type]
                  clock=clock)
    agent.tick()
    assert kube.gpunode is not None
    first = kube.gpunode["status"]["heartbeatTime"]
    patches = kube.status_patches
    clock.t += 5  # nothing changed, heartbeat not due: no patch
    agent.tick()
    assert kube.status_patches == patches
    clock.t += 60  # heartbeat due: the same status again, with a new time
    agent.tick()
    assert kube.status_patches == patches + 1 and kube.gpunode["status"]["heartbeatTime"] > first


def test_layout_applied_waits_for_every_gpu_of_the_spec() -> None:
    """One GPU is reshaped per tick. The tick that finished the first used to report
    LayoutApplied=True ("every GPU has the requested layout") before the second was even looked at."""
    kube = FakeKube("n1")
    sim = SimulatedNvml(H200, 2, seed="n1", mig_enabled=True)
    agent = Agent(_settings(), sim, kube, clock=Clock())  # type: ignore[arg-type]
    agent.tick()
    kube.set_spec({"gpus": [{"index": i, "migEnabled": True, "layout": [{"profile": "3g.71gb"}] * 2}
                            for i in (0, 1)]})
    seen: list[tuple[str, list[str], list[str]]] = []
    for _ in range(8):
        agent.tick()
        layouts = [sorted(i.profile for i in sim.gpu_instances(g)) for g in (0, 1)]
        seen.append((_cond(kube, "LayoutApplied")["status"], *layouts))
    target = ["3g.71gb", "3g.71gb"]
    # True only once both GPUs have their layout, and from then on.
    assert all(status == "False" for status, g0, g1 in seen if g0 != target or g1 != target)
    assert seen[-1] == ("True", target, target)


def test_a_shared_node_reports_the_replicas_its_pods_hold() -> None:
    """Issue 33, item 5: without ``status.sharing.inUse`` the webhook took every replica of a full
    MPS node as free and recorded auto pods ``mps`` there while MIG instances sat idle."""
    kube = FakeKube("n1")
    sim = SimulatedNvml(H200, 1, seed="n1", mig_enabled=False)
    clock = Clock()
    agent = Agent(_settings(), sim, kube, clock=clock)  # type: ignore[arg-type]
    agent.tick()
    kube.set_spec({"sharing": {"mode": "mps", "replicas": 4}, "gpus": [{"index": 0, "migEnabled": False}]})
    for i in range(3):
        kube.pods.append({"metadata": {"name": f"p{i}", "namespace": "team", "uid": f"u{i}"},
                          "spec": {"nodeName": "n1", "containers": [
                              {"name": "c", "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}]},
                          "status": {"phase": "Running"}})
    kube.pods.append({"metadata": {"name": "elsewhere", "namespace": "team", "uid": "u9"},
                      "spec": {"nodeName": "n2", "containers": [
                          {"name": "c", "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}]}})
    for _ in range(3):
        agent.tick()
        clock.t += 3
    assert kube.gpunode is not None
    assert kube.gpunode["status"]["sharing"] == {"mode": "mps", "replicas": 4, "inUse": 3}
