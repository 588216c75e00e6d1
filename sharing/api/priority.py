"""A pod's priority as the API server resolved it: the one reader of ``spec.priority`` and its policy.

The API server's Priority admission plugin turns ``spec.priorityClassName`` into
``spec.priority`` (an int32) and ``spec.preemptionPolicy`` when the pod is created, so
gpupack reads those two fields and never looks the class up itself; the class name is kept
only for messages. A pod without them has priority 0 and may preempt (Kubernetes' defaults
when no PriorityClass is global default).

The checks follow Kubernetes' own validation (``pkg/apis/scheduling``): a user's
PriorityClass is at most ``HIGHEST_USER_PRIORITY`` (one billion); only the reserved
``system-`` classes go above it, up to ``SYSTEM_NODE_CRITICAL_PRIORITY``; nothing is below
int32's least value. A value outside that, a value that is not an integer (a bool, a float,
a string) or an unknown preemption policy is a :class:`ValueError` naming the pod, the field
and the value: the API server would never have written it, so the object was forged or
mangled, and guessing a priority for it could make it preempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

PREEMPT_LOWER_PRIORITY: Final = "PreemptLowerPriority"
"""``spec.preemptionPolicy``: the pod may preempt pods of lower priority (Kubernetes' default)."""
NEVER: Final = "Never"
"""``spec.preemptionPolicy``: the pod waits and never preempts (it is still ordered by priority)."""
PREEMPTION_POLICIES: Final = (PREEMPT_LOWER_PRIORITY, NEVER)

INT32_MIN: Final = -2147483648
"""Least ``spec.priority`` (the field is an int32)."""
HIGHEST_USER_PRIORITY: Final = 1_000_000_000
"""Highest value a user's PriorityClass may have (Kubernetes' ``HighestUserDefinablePriority``)."""
SYSTEM_NODE_CRITICAL_PRIORITY: Final = 2_000_001_000
"""``system-node-critical``'s value: the highest any pod carries (Kubernetes' ``SystemCriticalPriority`` + 1000)."""
SYSTEM_CLASS_PREFIX: Final = "system-"
"""Names reserved for Kubernetes' own classes, the only ones above ``HIGHEST_USER_PRIORITY``."""


@dataclass(frozen=True)
class PodPriority:
    """A pod's priority: its value, whether it may preempt, and its class's name (for messages)."""

    value: int = 0
    """``spec.priority`` (the API server resolved the class into it)."""
    preemption_policy: str = PREEMPT_LOWER_PRIORITY
    class_name: str = ""
    """``spec.priorityClassName``; empty where the pod names none."""

    @property
    def preempts(self) -> bool:
        """Whether the pod may preempt others (its policy is not ``Never``)."""
        return self.preemption_policy != NEVER


def checked_priority(value: object, class_name: str = "", where: str = "priority") -> int:
    """``value`` as a pod priority, or a ValueError saying why it cannot be one (``where`` names it)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} must be an integer, got {value!r}")
    highest = SYSTEM_NODE_CRITICAL_PRIORITY if class_name.startswith(SYSTEM_CLASS_PREFIX) else HIGHEST_USER_PRIORITY
    if not INT32_MIN <= value <= highest:
        reason = (f"at most {highest} for class {class_name!r}" if value > highest and class_name
                  else f"at most {highest} (higher is only for system- classes)" if value > highest
                  else f"at least {INT32_MIN}")
        raise ValueError(f"{where} {value} is out of range: it must be {reason}")
    return value


def checked_policy(policy: object, where: str = "preemptionPolicy") -> str:
    """``policy`` as a preemption policy, or a ValueError naming the valid ones."""
    if policy not in PREEMPTION_POLICIES:
        raise ValueError(f"{where} {policy!r} is unknown: it must be one of {', '.join(PREEMPTION_POLICIES)}")
    return str(policy)


def pod_priority(pod: Mapping[str, Any]) -> PodPriority:
    """The priority of ``pod`` (a raw pod object): ``spec.priority``, ``spec.preemptionPolicy``, class name.

    Missing fields take Kubernetes' defaults (0, ``PreemptLowerPriority``, no class); a field of
    the wrong type or out of range is a :class:`ValueError` naming the pod.
    """
    metadata = pod.get("metadata")
    name = metadata.get("name", "?") if isinstance(metadata, Mapping) else "?"
    spec = pod.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise ValueError(f"pod {name}: spec must be an object, got {type(spec).__name__}")
    class_name = spec.get("priorityClassName") or ""
    if not isinstance(class_name, str):
        raise ValueError(f"pod {name}: spec.priorityClassName must be a string, got {class_name!r}")
    value = spec.get("priority")
    policy = spec.get("preemptionPolicy")
    return PodPriority(
        value=0 if value is None else checked_priority(value, class_name, f"pod {name}: spec.priority"),
        preemption_policy=(PREEMPT_LOWER_PRIORITY if policy is None
                           else checked_policy(policy, f"pod {name}: spec.preemptionPolicy")),
        class_name=class_name,
    )


def priority_of(pod: Mapping[str, Any]) -> tuple[PodPriority, str | None]:
    """The pod's priority (:func:`pod_priority`, the one reader), and None; or, when that reader
    refuses its fields, priority 0 with ``Never`` and why: the API server never writes such
    fields, so the pod is planned, may be preempted like any pod of priority 0, and never preempts
    on a guess. The readers that must not stop on one odd pod (the controller's snapshot, the
    scheduler extender's pod watch) read priorities through this."""
    try:
        return pod_priority(pod), None
    except ValueError as exc:
        return PodPriority(0, NEVER), str(exc)
