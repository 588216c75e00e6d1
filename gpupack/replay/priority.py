"""Priorities in a live replay (``gpupack replay --priority qos``): openb's classes as PriorityClasses,
the pods the live system preempted, and the figures per class read as the simulator reads its own.

* **Classes.** One PriorityClass per openb ``qos`` class (:func:`priority_class_name`:
  ``openb-ls``, ``openb-be``, ...), valued by ``sharing.rules.priority.QOS_PRIORITIES``, the
  table ``gpupack simulate --priority qos`` reads: LS, Guaranteed and Burstable high, BE low and
  preemptible. Each pod names its class (``priorityClassName``), and the API server resolves it
  into ``spec.priority`` as it would for any user's pod.
* **Preempted.** A pod the live system preempted is a pod the replay saw bound that is then
  deleted by someone else (the replay deletes only pods never placed): by gpupack's controller,
  which writes ``DisruptionTarget`` with reason ``PreemptionByGpupack`` first, or by
  kube-scheduler's own preemption (``PreemptionByScheduler``). :func:`preempted_by` says which
  from the pod. It counts as not placed from the attempt during which it went, as the product
  model withdraws a victim (``sharing.simulator.preempting``).
* **Figures** (:func:`live_priority_figures`): per class the percentage of its arrived milli
  placed, at each arrived-demand level and at the end, through the simulator's own tally
  (``sharing.simulator.preempting.ClassTally``); the preemptions (attempts during which a pod
  was preempted: the pod in flight preempted), pods and milli preempted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from gpupack.devcluster.apply import Manifest
from sharing.api.keys import PREEMPTION_REASON
from sharing.api.priority import PodPriority
from sharing.packing.specs import PodSpec
from sharing.rules.priority import QOS_PRIORITIES
from sharing.simulator.preempting import ClassTally
from sharing.simulator.tally import ArrivalTally
from sharing.simulator.workload import trace_name

SCHEDULER_REASON: Final = "PreemptionByScheduler"
"""Reason of the ``DisruptionTarget`` condition kube-scheduler writes on a pod it preempts."""
DISRUPTION_TARGET: Final = "DisruptionTarget"

PreemptedBy = Literal["controller", "scheduler", "unknown"]


def priority_class_name(qos: str) -> str:
    """The PriorityClass of openb class ``qos`` (``LS`` -> ``openb-ls``)."""
    return f"openb-{qos.lower()}"


def priority_classes() -> list[Manifest]:
    """One PriorityClass per openb class, valued as ``--priority qos`` values it (module docstring)."""
    return [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
             "metadata": {"name": priority_class_name(qos)}, "value": value,
             "preemptionPolicy": "PreemptLowerPriority",
             "description": f"openb qos {qos} in gpupack replay --priority qos"}
            for qos, value in QOS_PRIORITIES.items()]


def pod_classes(pods: Sequence[PodSpec], priorities: Mapping[str, PodPriority]) -> dict[str, str]:
    """Per plan pod name, the PriorityClass it names; ValueError for a pod without a class."""
    out = {}
    for pod in pods:
        priority = priorities.get(trace_name(pod.name))
        if priority is None:
            raise ValueError(f"pod {pod.name!r} has no qos class in the pod list")
        out[pod.name] = priority_class_name(priority.class_name)
    return out


def preempted_by(pod: Mapping[str, Any]) -> PreemptedBy:
    """Who preempted a bound pod being deleted, from its ``DisruptionTarget`` condition."""
    status = pod.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for cond in conditions if isinstance(conditions, list) else []:
        if isinstance(cond, Mapping) and cond.get("type") == DISRUPTION_TARGET:
            reason = cond.get("reason")
            if reason == PREEMPTION_REASON:
                return "controller"
            if reason == SCHEDULER_REASON:
                return "scheduler"
    return "unknown"


@dataclass(frozen=True)
class Preempted:
    """A bound pod the live system deleted: during which attempt (index in arrival order) and by whom."""

    name: str
    attempt: int
    by: PreemptedBy


def withdrawn_by_attempt(pods: Sequence[PodSpec], names: Sequence[str],
                         preempted: Sequence[Preempted]) -> dict[int, list[int]]:
    """Per attempt, the indexes (into ``pods``) of the placed pods preempted during it."""
    index = {n: i for i, n in enumerate(names)}
    out: dict[int, list[int]] = {}
    for p in preempted:
        if p.name in index:
            out.setdefault(p.attempt, []).append(index[p.name])
    return out


def live_priority_figures(pods: Sequence[PodSpec], names: Sequence[str], bound: Sequence[bool],
                          preempted: Sequence[Preempted], priorities: Mapping[str, PodPriority],
                          total_gpus: int) -> dict[str, Any]:
    """The live run's figures under the keys ``gpupack simulate --priority`` reports (module docstring)."""
    tally = ArrivalTally(len(pods))
    classes = ClassTally(len(pods), [priorities[trace_name(p.name)].class_name for p in pods])
    withdrawn = withdrawn_by_attempt(pods, names, preempted)
    for i, (pod, placed) in enumerate(zip(pods, bound)):
        for v in withdrawn.get(i, ()):
            victim = pods[v]
            tally.withdraw(victim.gpu_total_milli, victim.gpu_total_milli)
            classes.withdraw(priorities[trace_name(victim.name)].class_name, victim.gpu_total_milli)
        tally.record(i, pod, float(pod.gpu_total_milli) if placed else None, 0)
        classes.record(i, priorities[trace_name(pod.name)].class_name, pod.gpu_total_milli, placed)
    victims = [pods[v] for vs in withdrawn.values() for v in vs]
    figures = tally.figures(total_gpus)
    return {
        "alloc_at": figures["alloc_at"],
        "final_alloc_percent": round(figures["final_alloc_percent"], 2),
        "alloc_at_by_class": {c: {str(k): v for k, v in levels.items()}
                              for c, levels in classes.by_level(tally.arrived, total_gpus).items()},
        "placed_by_class": classes.final(),
        "preemptions": len(withdrawn),
        "preempted_pods": len(victims),
        "preempted_milli": sum(p.gpu_total_milli for p in victims),
        "preempted_by": dict(sorted(Counter(p.by for p in preempted).items())),
    }
