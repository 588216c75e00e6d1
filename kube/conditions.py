"""``metav1.Condition`` bookkeeping, shared by the components that write conditions (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from kube.times import format_time

Status = Literal["True", "False", "Unknown"]

MESSAGE_LIMIT = 4000
"""Characters of a condition message kept (the API allows 32768; people read far less)."""


@dataclass(frozen=True)
class Cond:
    """One condition as a component states it; :func:`merge_conditions` adds the times."""

    type: str
    status: Status
    reason: str
    message: str


def merge_conditions(
    previous: Sequence[Mapping[str, Any]], new: Sequence[Cond], generation: int | None, now: datetime
) -> list[dict[str, Any]]:
    """New conditions, keeping ``lastTransitionTime`` where the status did not change."""
    before = {c.get("type"): c for c in previous}
    result = []
    for cond in new:
        old = before.get(cond.type)
        since = old.get("lastTransitionTime") if old and old.get("status") == cond.status else None
        entry: dict[str, Any] = {
            "type": cond.type, "status": cond.status, "reason": cond.reason, "message": cond.message[:MESSAGE_LIMIT],
            "lastTransitionTime": since or format_time(now),
        }
        if generation is not None:
            entry["observedGeneration"] = generation
        result.append(entry)
    return result
