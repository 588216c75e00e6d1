"""Priority rules every component applies: who may preempt whom, the waiting order, openb's classes.

* :func:`may_preempt`: a pod preempts only pods of *strictly* lower priority, and never when
  its policy is ``Never`` (kube-scheduler's rule, ``pkg/scheduler/framework/preemption``:
  victims are pods with ``priority < preemptor's``; ``PodEligibleToPreemptOthers`` refuses
  ``preemptionPolicy: Never``). Equal priority never preempts, so two pods of one class can
  never preempt each other back and forth.
* :func:`waiting_order`: the sort key of a waiting pod, highest priority first, then the oldest,
  then by name so equal pods order the same in every driver (the controller's planner and the
  product model).
* :data:`QOS_PRIORITIES` / :func:`qos_priority`: the openb traces' ``qos`` column as priorities
  for ``gpupack simulate --priority qos`` (issue 36): latency-sensitive (``LS``), ``Guaranteed``
  and ``Burstable`` pods are high, best-effort (``BE``) pods are low and preemptible. The three
  high classes share one value, so none of them preempts another.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from sharing.api.priority import PodPriority

HIGH_PRIORITY: Final = 1000
"""The value ``--priority qos`` gives openb's LS, Guaranteed and Burstable pods."""
LOW_PRIORITY: Final = 0
"""The value ``--priority qos`` gives openb's BE pods (Kubernetes' default priority)."""

QOS_PRIORITIES: Final[Mapping[str, int]] = MappingProxyType({
    "LS": HIGH_PRIORITY,
    "Guaranteed": HIGH_PRIORITY,
    "Burstable": HIGH_PRIORITY,
    "BE": LOW_PRIORITY,
})
"""openb's ``qos`` value -> the pod's priority under ``--priority qos``."""

WaitingKey = tuple[int, float, str]


def may_preempt(preemptor: PodPriority, victim: int) -> bool:
    """Whether ``preemptor`` may preempt a pod of priority ``victim``: strictly lower, and not ``Never``."""
    return preemptor.preempts and victim < preemptor.value


def waiting_order(priority: int, created_s: float, name: str) -> WaitingKey:
    """Sort key of a waiting pod: highest ``priority`` first, then oldest (``created_s``), then ``name``."""
    return (-priority, created_s, name)


def qos_priority(qos: str) -> PodPriority:
    """The priority of an openb pod whose ``qos`` column is ``qos``; ValueError on a value openb lacks."""
    try:
        value = QOS_PRIORITIES[qos]
    except KeyError:
        raise ValueError(f"qos {qos!r} is unknown: openb's classes are {', '.join(QOS_PRIORITIES)}") from None
    return PodPriority(value=value, class_name=qos)
