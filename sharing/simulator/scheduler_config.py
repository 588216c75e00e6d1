"""The kube-scheduler scoring weights gpupack ships, read from ``manifests/`` (one source).

The product model scores the pods kube-scheduler places with the weights of
``manifests/scheduler/kube-scheduler-config.yaml``, the file the local control
plane and a real install run with, so the model cannot drift from what runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from urllib.parse import urlparse

from sharing.api.keys import PRIORITIZE_VERB, SCHEDULER_EXTENDER_PREFIX, SHARED_RESOURCE, WHOLE_RESOURCE
from sharing.packing.kube_scoring import MostAllocatedWeights

SHIPPED_CONFIG = Path(__file__).resolve().parents[2] / "manifests" / "scheduler" / "kube-scheduler-config.yaml"


EXTENDER_OUTRANKING_WEIGHT = 17
"""The least weight at which the prioritize extender's score outranks every plugin's: kube-scheduler
scales an extender's 0..10 by its weight and by 10 (``schedule_one.go``), and the default score
plugins of kube-scheduler v1.37.2 (``apis/config/v1/default_plugins.go``) weigh at most 16 in all at
100 each (TaintToleration 3, NodeAffinity 2, NodeResourcesFit 1, VolumeBinding 1, PodTopologySpread 2,
InterPodAffinity 2, NodeResourcesBalancedAllocation 1, ImageLocality 1, DynamicResources 2,
PodGroupPodsCount 1): 17 x 10 x 10 = 1,700 > 1,600."""


class SchedulerConfigError(ValueError):
    """The configuration is not one the product model can follow."""


def load_weights(path: Path = SHIPPED_CONFIG) -> MostAllocatedWeights:
    """The MostAllocated weights of the default profile; a clear error for anything else."""
    doc = _read(path)
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


def _read(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SchedulerConfigError(f"{path}: cannot read the kube-scheduler configuration: {exc}") from None


def load_priority_extender(path: Path = SHIPPED_CONFIG) -> bool:
    """Whether kube-scheduler calls gpupack's prioritize extender (``webhook``, the placement preference
    by priority), so the product model places kube-scheduler's pods by that preference first.

    A configured extender whose weight does not outrank the plugins' scores is refused: the model
    would rank preferred nodes first where kube-scheduler might not."""
    doc = _read(path)
    extenders = doc.get("extenders") if isinstance(doc, dict) else None
    for extender in extenders if isinstance(extenders, list) else ():
        if not isinstance(extender, dict) or extender.get("prioritizeVerb") != PRIORITIZE_VERB:
            continue
        if not urlparse(str(extender.get("urlPrefix", ""))).path.rstrip("/").endswith(SCHEDULER_EXTENDER_PREFIX):
            continue
        weight = extender.get("weight", 1)
        if not isinstance(weight, int) or weight < EXTENDER_OUTRANKING_WEIGHT:
            raise SchedulerConfigError(
                f"{path}: gpupack's prioritize extender has weight {weight!r}; below {EXTENDER_OUTRANKING_WEIGHT} "
                "the plugins' scores can outrank it, and the product model cannot say where kube-scheduler places")
        return True
    return False
