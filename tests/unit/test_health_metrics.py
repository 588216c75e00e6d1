"""GPU health metrics (``AgentMetrics.observe_health``) and the alert rules built on them.

The metrics are fed synthetic ``HealthReport``s over snapshots of a SimulatedNvml, and
once the reports of a real ``HealthTracker``; the rules are checked against what
``AgentMetrics`` exports and against both installs (kustomize leaves them out, the
Helm chart renders them only with ``prometheusRules.enabled``; real Helm renders
them in tests/e2e/test_helm_chart.py).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from mig.catalog import get_model
from node.health.ack import read_acknowledgements
from node.health.signals import read_signals
from node.health.tracker import Ended, Fault, HealthReport, HealthTracker
from node.metrics import XID_KINDS, AgentMetrics
from node.nvml.protocol import XidEvent
from node.nvml.simulated import SimulatedNvml
from node.base.snapshot import NodeSnapshot, read_snapshot
from tests.unit.test_controller_helm import _generator

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "manifests" / "prometheus-rules"
CHART = ROOT / "manifests" / "helm" / "gpupack"
H200 = get_model("H200")
THREE_G = H200.profile("3g.71gb")
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
NOW = T0.timestamp()


def _snapshot(mig: bool = True) -> NodeSnapshot:
    """Two H200s; with ``mig``, GPU 0 cut into two 3g.71gb instances (gi ids 1 and 2)."""
    sim = SimulatedNvml(H200, 2, mig_enabled=mig)
    if mig:
        for placement in THREE_G.placements[:2]:
            sim.create_gpu_instance(0, THREE_G.profile_id, placement)
    return read_snapshot(sim, sim.kind)


def _fault(reason: str = "Xid48", *, since: datetime = T0, xid: int | None = 48, withdrawn: bool = True) -> Fault:
    return Fault(reason, f"{reason} test fault", since, "ResetGpu", withdrawn, "boot-1", "", xid)


def _value(metrics: AgentMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def _series(metrics: AgentMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value
            for family in metrics.registry.collect() for s in family.samples if s.name == name}


# ---------------------------------------------------------------------- gauges
def test_a_healthy_node_reads_healthy_everywhere() -> None:
    metrics, snap = AgentMetrics(), _snapshot()
    metrics.observe_health(HealthReport({}), snap, NOW)
    uuids = {g.info.index: g.info.uuid for g in snap.gpus}
    assert _series(metrics, "gpupack_gpu_healthy") == {
        (("gpu", "0"), ("uuid", uuids[0])): 1.0, (("gpu", "1"), ("uuid", uuids[1])): 1.0}
    assert _series(metrics, "gpupack_mig_instance_healthy") == {
        (("gi", "1"), ("gpu", "0")): 1.0, (("gi", "2"), ("gpu", "0")): 1.0}
    assert _series(metrics, "gpupack_gpu_fault_seconds") == {}
    assert _value(metrics, "gpupack_node_gpu_degraded") == 0
    assert _series(metrics, "gpupack_gpu_xid_errors_total") == {}


@pytest.mark.parametrize(
    "key, gpu0, gpu1, gi1, gi2",
    [
        ((1, None), 1.0, 0.0, 1.0, 1.0),
        ((0, None), 0.0, 1.0, 1.0, 1.0),  # a whole-GPU fault: its instances keep their own reading
        ((0, 2), 1.0, 1.0, 1.0, 0.0),  # an instance's fault leaves the GPU healthy
    ],
    ids=["gpu-1", "gpu-0", "instance-0/2"],
)
def test_a_fault_reads_zero_on_its_device_only(key: tuple[int, int | None], gpu0: float, gpu1: float,
                                               gi1: float, gi2: float) -> None:
    metrics, snap = AgentMetrics(), _snapshot()
    metrics.observe_health(HealthReport({key: _fault()}), snap, NOW)
    assert _value(metrics, "gpupack_gpu_healthy", gpu="0", uuid=snap.gpus[0].info.uuid) == gpu0
    assert _value(metrics, "gpupack_gpu_healthy", gpu="1", uuid=snap.gpus[1].info.uuid) == gpu1
    assert _value(metrics, "gpupack_mig_instance_healthy", gpu="0", gi="1") == gi1
    assert _value(metrics, "gpupack_mig_instance_healthy", gpu="0", gi="2") == gi2


@pytest.mark.parametrize("withdrawn, degraded", [(False, 1.0), (True, 0.0)], ids=["advertised", "withdrawn"])
def test_degraded_follows_a_fault_the_device_plugin_keeps_advertising(withdrawn: bool, degraded: float) -> None:
    metrics = AgentMetrics()
    metrics.observe_health(HealthReport({(0, None): _fault(withdrawn=withdrawn)}), _snapshot(), NOW)
    assert _value(metrics, "gpupack_node_gpu_degraded") == degraded
    metrics.observe_health(HealthReport({}), _snapshot(), NOW + 5)
    assert _value(metrics, "gpupack_node_gpu_degraded") == 0


def test_fault_seconds_count_from_since_and_the_series_goes_with_the_fault() -> None:
    metrics, snap = AgentMetrics(), _snapshot()
    gpu_fault = _fault("EccUncorrectable", since=T0 - timedelta(hours=2), xid=None)
    inst_fault = _fault("Xid94", since=T0 - timedelta(seconds=30), xid=94)
    metrics.observe_health(HealthReport({(1, None): gpu_fault, (0, 2): inst_fault}), snap, NOW)
    assert _series(metrics, "gpupack_gpu_fault_seconds") == {
        (("gi", ""), ("gpu", "1"), ("reason", "EccUncorrectable")): 7200.0,
        (("gi", "2"), ("gpu", "0"), ("reason", "Xid94")): 30.0}
    metrics.observe_health(HealthReport({(1, None): gpu_fault, (0, 2): inst_fault}), snap, NOW + 60)
    assert _value(metrics, "gpupack_gpu_fault_seconds", gpu="1", gi="", reason="EccUncorrectable") == 7260
    # The instance's fault ends: its series goes, the GPU's stays.
    metrics.observe_health(HealthReport({(1, None): gpu_fault}, ended=(Ended((0, 2), inst_fault, "reset"),)),
                           snap, NOW + 120)
    assert _series(metrics, "gpupack_gpu_fault_seconds") == {
        (("gi", ""), ("gpu", "1"), ("reason", "EccUncorrectable")): 7320.0}
    assert _value(metrics, "gpupack_mig_instance_healthy", gpu="0", gi="2") == 1
    metrics.observe_health(HealthReport({}), snap, NOW + 180)
    assert _series(metrics, "gpupack_gpu_fault_seconds") == {}
    assert _value(metrics, "gpupack_gpu_healthy", gpu="1", uuid=snap.gpus[1].info.uuid) == 1


def test_fault_seconds_read_a_naive_since_as_utc_and_never_go_negative() -> None:
    metrics = AgentMetrics()
    naive = _fault("Xid48", since=(T0 - timedelta(seconds=10)).replace(tzinfo=None))
    future = _fault("Xid79", since=T0 + timedelta(seconds=10), xid=79)
    metrics.observe_health(HealthReport({(0, None): naive, (1, None): future}), _snapshot(), NOW)
    assert _value(metrics, "gpupack_gpu_fault_seconds", gpu="0", gi="", reason="Xid48") == 10
    assert _value(metrics, "gpupack_gpu_fault_seconds", gpu="1", gi="", reason="Xid79") == 0


def test_instances_that_vanish_take_their_series_with_them() -> None:
    metrics = AgentMetrics()
    metrics.observe_health(HealthReport({}), _snapshot(mig=True), NOW)
    assert len(_series(metrics, "gpupack_mig_instance_healthy")) == 2
    metrics.observe_health(HealthReport({}), _snapshot(mig=False), NOW + 5)
    assert _series(metrics, "gpupack_mig_instance_healthy") == {}
    assert len(_series(metrics, "gpupack_gpu_healthy")) == 2


def test_while_nvml_is_down_the_last_devices_seen_keep_their_readings() -> None:
    metrics, snap = AgentMetrics(), _snapshot()
    metrics.observe_health(HealthReport({}), snap, NOW)
    down = NodeSnapshot(backend=snap.backend, error="NVML library not found")
    metrics.observe_health(HealthReport({(0, None): _fault()}), down, NOW + 5)
    assert _value(metrics, "gpupack_gpu_healthy", gpu="0", uuid=snap.gpus[0].info.uuid) == 0
    assert _value(metrics, "gpupack_gpu_healthy", gpu="1", uuid=snap.gpus[1].info.uuid) == 1
    assert len(_series(metrics, "gpupack_mig_instance_healthy")) == 2
    assert _value(metrics, "gpupack_gpu_fault_seconds", gpu="0", gi="", reason="Xid48") == 5


# --------------------------------------------------------------------- counter
def test_xids_are_counted_once_each_by_kind() -> None:
    metrics, snap = AgentMetrics(), _snapshot()
    known, unknown = _fault("Xid48", xid=48), _fault("UnknownXid", xid=9999)
    memory = _fault("EccUncorrectable", xid=None)  # began, but no XID: not counted
    report = HealthReport(
        {(1, None): known, (0, 1): unknown, (0, None): memory},
        began=(((1, None), known), ((0, 1), unknown), ((0, None), memory)),
        application_xids=(XidEvent(0, 13, gi_id=2), XidEvent(0, 13, gi_id=1), XidEvent(1, 31)),
        unknown_xids=(XidEvent(0, 9999, gi_id=1),),
    )
    metrics.observe_health(report, snap, NOW)
    assert _series(metrics, "gpupack_gpu_xid_errors_total") == {
        (("gpu", "0"), ("kind", "application"), ("xid", "13")): 2.0,
        (("gpu", "1"), ("kind", "application"), ("xid", "31")): 1.0,
        (("gpu", "0"), ("kind", "unknown"), ("xid", "9999")): 1.0,  # not also "unhealthy"
        (("gpu", "1"), ("kind", "unhealthy"), ("xid", "48")): 1.0,
    }
    # The next tick: the faults last (not began again), no new XIDs: nothing more is counted.
    metrics.observe_health(HealthReport(dict(report.faults)), snap, NOW + 5)
    assert _value(metrics, "gpupack_gpu_xid_errors_total", gpu="1", xid="48", kind="unhealthy") == 1
    assert _value(metrics, "gpupack_gpu_xid_errors_total", gpu="0", xid="13", kind="application") == 2
    assert {dict(k)["kind"] for k in _series(metrics, "gpupack_gpu_xid_errors_total")} <= set(XID_KINDS)


def test_the_tracker_s_reports_drive_the_metrics() -> None:
    """A real HealthTracker over a SimulatedNvml, tick by tick, as the agent calls it."""
    sim = SimulatedNvml(H200, 2, mig_enabled=False)
    tracker, metrics = HealthTracker(), AgentMetrics()

    def tick(at: datetime) -> HealthReport:
        snap = read_snapshot(sim, sim.kind)
        signals, _ = read_signals(sim, snap)
        report = tracker.observe(signals, snap, {}, read_acknowledgements({}), at, shared=False)
        metrics.observe_health(report, snap, at.timestamp())
        return report

    tick(T0)
    sim.inject_xid(1, 48)
    sim.inject_xid(0, 13)
    sim.inject_xid(0, 9999)
    tick(T0 + timedelta(seconds=5))
    uuid0, uuid1 = (sim.device_info(i).uuid for i in (0, 1))
    assert _value(metrics, "gpupack_gpu_healthy", gpu="0", uuid=uuid0) == 0  # the unknown XID faults GPU 0
    assert _value(metrics, "gpupack_gpu_healthy", gpu="1", uuid=uuid1) == 0
    counts = {(dict(k)["xid"], dict(k)["kind"]): v for k, v in _series(metrics, "gpupack_gpu_xid_errors_total").items()}
    assert counts == {("48", "unhealthy"): 1, ("13", "application"): 1, ("9999", "unknown"): 1}
    tick(T0 + timedelta(minutes=10))
    assert _value(metrics, "gpupack_gpu_fault_seconds", gpu="1", gi="", reason="Xid48") == 595
    sim.reset_gpu(1)  # Xid48 needs a GPU reset
    report = tick(T0 + timedelta(minutes=11))
    assert [e.key for e in report.ended] == [(1, None)]
    assert _value(metrics, "gpupack_gpu_healthy", gpu="1", uuid=uuid1) == 1
    assert _value(metrics, "gpupack_gpu_fault_seconds", gpu="1", gi="", reason="Xid48") is None
    assert _value(metrics, "gpupack_gpu_fault_seconds", gpu="0", gi="", reason="UnknownXid") == 655


# ----------------------------------------------------------------- alert rules
def _rule_object() -> dict[str, Any]:
    (obj,) = [d for d in yaml.safe_load_all((RULES / "gpu-health-rules.yaml").read_text()) if d]
    assert isinstance(obj, dict)
    return obj


def _exported_names() -> set[str]:
    names = set()
    for family in AgentMetrics().registry.collect():
        names.add(family.name)
        if family.type == "counter":
            names.add(family.name + "_total")
    return names


def test_alert_rules_parse_and_name_only_metrics_the_agent_exports() -> None:
    obj = _rule_object()
    assert obj["apiVersion"] == "monitoring.coreos.com/v1" and obj["kind"] == "PrometheusRule"
    assert obj["metadata"]["namespace"] == "gpupack-system"
    rules = [r for group in obj["spec"]["groups"] for r in group["rules"]]
    alerts = {r["alert"]: r for r in rules}
    assert {"GpuUnhealthy", "GpuFaultUnrecovered", "NodeAllGpusUnhealthy", "XidStorm", "NodeGpuDegraded"} <= set(alerts)
    assert len(alerts) == len(rules)
    assert alerts["GpuUnhealthy"]["for"] == "5m" and alerts["GpuUnhealthy"]["labels"]["severity"] == "warning"
    assert "86400" in alerts["GpuFaultUnrecovered"]["expr"]
    assert 'kind="application"' in alerts["XidStorm"]["expr"]
    exported = _exported_names()
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        used = set(re.findall(r"gpupack_[a-z_]+", rule["expr"]))
        assert used and used <= exported, f"{name} uses {used - exported}, which AgentMetrics does not export"
        for label in re.findall(r"\{([a-z_]+)=", rule["expr"]):
            assert label in ("kind", "gpu", "gi", "reason", "xid"), (name, label)


def test_default_kustomization_leaves_the_rules_out() -> None:
    base = yaml.safe_load((ROOT / "manifests" / "kustomization.yaml").read_text())
    assert not any("prometheus" in entry for entry in base.get("resources", []) + base.get("components", []))
    for overlay in ("hardened", "agent-operator-mode"):
        text = (ROOT / "manifests" / overlay / "kustomization.yaml").read_text()
        assert "prometheus-rules" not in text, overlay
    own = yaml.safe_load((RULES / "kustomization.yaml").read_text())
    assert own["kind"] == "Kustomization" and own["resources"] == ["gpu-health-rules.yaml"]


def test_the_chart_has_the_rules_behind_a_value_that_is_off_by_default() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["prometheusRules"] == {"enabled": False, "labels": {}}
    text = _generator().render()["templates/prometheus-rules.yaml"]
    body = text.split("\n", 1)[1]  # after the generated-file header
    assert body.startswith("{{- if .Values.prometheusRules.enabled }}\n") and body.endswith("{{- end }}\n")
    # Prometheus's own {{ }} templates reach the cluster unchanged: Helm sees raw strings.
    source = (RULES / "gpu-health-rules.yaml").read_text()
    kept = re.findall(r"\{\{`(\{\{.*?\}\})`\}\}", text)
    assert kept and kept == re.findall(r"\{\{.*?\}\}", source)
    for name, other in _generator().render().items():
        if name != "templates/prometheus-rules.yaml":
            assert "monitoring.coreos.com" not in other, name
