"""The kube-scheduler scoring weights gpupack ships, read from ``manifests/`` (one source).

The product model scores the pods kube-scheduler places with the weights of
``manifests/scheduler/kube-scheduler-config.yaml``, the file the local control
plane and a real install run with, so the model cannot drift from what runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sharing.api.keys import SHARED_RESOURCE, WHOLE_RESOURCE
from sharing.packing.kube_scoring import MostAllocatedWeights

SHIPPED_CONFIG = Path(__file__).resolve().parents[2] / "manifests" / "scheduler" / "kube-scheduler-config.yaml"


class SchedulerConfigError(ValueError):
    """The configuration is not one the product model can follow."""


def load_weights(path: Path = SHIPPED_CONFIG) -> MostAllocatedWeights:
    """The MostAllocated weights of the default profile; a clear error for anything else."""
    try:
        doc: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SchedulerConfigError(f"{path}: cannot read the kube-scheduler configuration: {exc}") from None
    try:
        profile = next(p for p in doc["profiles"] if p.get("schedulerName", "default-scheduler") == "default-scheduler")
        fit = next(c["args"] for c in profile["pluginConfig"] if c["name"] == "NodeResourcesFit")
        strategy = fit["scoringStrategy"]
    except (KeyError, TypeError, StopIteration):
        raise SchedulerConfigError(f"{path}: no NodeResourcesFit scoringStrategy in the default-scheduler profile") from None
    if strategy.get("type") != "MostAllocated":
        raise SchedulerConfigError(f"{path}: scoring strategy {strategy.get('type')!r}; the product model models MostAllocated")
    weights = {r["name"]: int(r.get("weight", 1)) for r in strategy.get("resources", ())}
    missing = [n for n in ("cpu", "memory", WHOLE_RESOURCE, SHARED_RESOURCE) if n not in weights]
    if missing:
        raise SchedulerConfigError(f"{path}: MostAllocated weighs no {', '.join(missing)}")
    return MostAllocatedWeights(
        cpu=weights["cpu"], memory=weights["memory"], gpu=weights[WHOLE_RESOURCE], gpu_shared=weights[SHARED_RESOURCE]
    )
