"""Moving a Deployment's only replica make-before-break: a rollout, where an eviction would leave none.

``Recreate`` evicts a pod only while another pod of its workload is Ready
(``controller.planning.right_size_evictions``), so a workload of one replica never moves by
eviction. A Deployment can move it without a gap: a rolling update that surges brings the new pod
up, waits for it to be Ready, and only then removes the old one. The controller starts one the
way ``kubectl rollout restart`` does, by writing an annotation on the pod template
(``right-sizing.gpupack.io/resized-at``, ``sharing.api.keys.RESIZED_AT_ANNOTATION``); the new pod is sized at
admission like any other (``Initial``'s logic).

:func:`make_before_break` says whether a Deployment would do so: not paused, one replica, strategy
``RollingUpdate`` whose ``maxUnavailable`` comes to 0 and ``maxSurge`` to at least 1 at one
replica (percentages round as the Deployment controller rounds them: unavailable down, surge up;
the defaults 25 % / 25 % give 0 and 1), and no rollout already under way. Pure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from kube.times import format_time
from sharing.api.fields import as_map, is_int
from sharing.api.keys import RESIZED_AT_ANNOTATION

_PERCENT = re.compile(r"^([0-9]+)%$")
DEFAULT_SURGE = DEFAULT_UNAVAILABLE = "25%"
"""The Deployment API's defaults for ``rollingUpdate``."""


def _at_one_replica(value: object, round_up: bool) -> int | None:
    """An ``IntOrString`` of ``rollingUpdate`` at one replica (None: not one)."""
    if is_int(value):
        return value
    match = _PERCENT.match(value) if isinstance(value, str) else None
    if match is None:
        return None
    share = int(match.group(1)) / 100
    return math.ceil(share) if round_up else math.floor(share)


def make_before_break(deployment: Mapping[str, Any]) -> str | None:
    """None when a rollout of ``deployment`` brings the new pod up before the old one goes; else why not."""
    meta, spec, status = as_map(deployment.get("metadata")), as_map(deployment.get("spec")), as_map(
        deployment.get("status"))
    if spec.get("paused") is True:
        return "it is paused"
    replicas = spec.get("replicas", 1)
    if replicas != 1:
        return f"it has {replicas} replicas, not one"
    strategy = as_map(spec.get("strategy"))
    kind = strategy.get("type", "RollingUpdate")
    if kind != "RollingUpdate":
        return f"its strategy is {kind}: the old pod would go before the new one is up"
    rolling = as_map(strategy.get("rollingUpdate"))
    unavailable = _at_one_replica(rolling.get("maxUnavailable", DEFAULT_UNAVAILABLE), round_up=False)
    surge = _at_one_replica(rolling.get("maxSurge", DEFAULT_SURGE), round_up=True)
    if unavailable != 0 or not surge:
        return (f"its rolling update (maxSurge {rolling.get('maxSurge', DEFAULT_SURGE)}, maxUnavailable "
                f"{rolling.get('maxUnavailable', DEFAULT_UNAVAILABLE)}) would not bring the new pod up first: "
                "it needs maxSurge of at least 1 and maxUnavailable 0")
    observed, generation = status.get("observedGeneration"), meta.get("generation")
    settled = (is_int(observed) and is_int(generation) and observed >= generation
               and status.get("replicas") == status.get("updatedReplicas") == status.get("readyReplicas") == 1)
    return None if settled else "a rollout of it is under way"


def rollout_patch(deployment: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The merge patch that starts the rollout, guarded by the Deployment's resourceVersion (409 if it changed)."""
    version = as_map(deployment.get("metadata")).get("resourceVersion")
    return {"metadata": {"resourceVersion": version},
            "spec": {"template": {"metadata": {"annotations": {RESIZED_AT_ANNOTATION: format_time(now)}}}}}


__all__ = ["make_before_break", "rollout_patch"]
