"""The controller's manifests: consistent with the code, the RBAC and the MIG catalog."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from controller.settings import ENV_PREFIX, ControllerSettings
from mig.catalog import all_models

ROOT = Path(__file__).resolve().parents[2]


def test_scheduler_config_weights_every_gpu_resource_of_the_catalog() -> None:
    config = yaml.safe_load((ROOT / "manifests/scheduler/kube-scheduler-config.yaml").read_text())
    (profile,) = config["profiles"]
    fit = next(p for p in profile["pluginConfig"] if p["name"] == "NodeResourcesFit")
    strategy = fit["args"]["scoringStrategy"]
    assert strategy["type"] == "MostAllocated"
    listed = {r["name"] for r in strategy["resources"]}
    catalog = {p.resource_name for m in all_models() for p in m.profiles}
    assert catalog | {"nvidia.com/gpu", "nvidia.com/gpu.shared"} <= listed
    assert {"name": "NodeResourcesBalancedAllocation"} in profile["plugins"]["score"]["disabled"]


def test_deployment_env_names_are_real_settings() -> None:
    deployment = yaml.safe_load((ROOT / "manifests/controller/deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    fields = {f.upper() for f in ControllerSettings.__dataclass_fields__}
    for env in container["env"]:
        assert env["name"].startswith(ENV_PREFIX) and env["name"][len(ENV_PREFIX):] in fields, env["name"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "gpupack-controller"


def test_grafana_dashboard_queries_only_metrics_that_exist() -> None:
    from prometheus_client import generate_latest

    from controller.metrics import ControllerMetrics

    from node.metrics import AgentMetrics
    from webhook.metrics import Metrics as WebhookMetrics

    metrics = ControllerMetrics()
    exposed = "\n".join(
        generate_latest(registry).decode()
        for registry in (metrics.registry, AgentMetrics().registry, WebhookMetrics().registry)
    )
    # Labelled metrics only show up once a child exists: list their names from the collectors.
    for registry in (metrics.registry, AgentMetrics().registry, WebhookMetrics().registry):
        exposed += "\n" + "\n".join(m.name for m in registry.collect())
    dashboard = json.loads((ROOT / "manifests/grafana/gpupack-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    import re

    for expr in exprs:
        for name in re.findall(r"gpupack_[a-z_]+", expr):
            base = re.sub(r"_(bucket|sum|count|total|created)$", "", name)
            assert base in exposed or name in exposed, f"dashboard uses {name}, which no component exports"
