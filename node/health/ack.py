"""An admin's acknowledgement of GPU faults: the one reading of ``gpupack.io/health-acknowledged``.

A fault whose recovery the node agent cannot see (a replaced GPU, a reset made
where the agent could not tell, a fault gpupack should not have raised) ends
when an admin acknowledges it on the GPUNode. The annotation maps a GPU index
to a time, as JSON: ``{"0": "2026-12-01T16:00:00Z"}``. Every fault of that GPU
(and of its MIG instances) that began at or before that time is over; a fault
that begins later needs a new acknowledgement, so an old one never hides a new
failure. ``gpupack agent health ack`` writes it; ``kubectl annotate`` works too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kube.times import format_time, parse_time
from sharing.api.keys import HEALTH_ACK_ANNOTATION

__all__ = ["Acknowledgements", "acknowledge", "read_acknowledgements"]


@dataclass(frozen=True)
class Acknowledgements:
    """GPU index -> faults that began at or before this time are over."""

    until: Mapping[int, datetime]
    problem: str | None = None
    """Why (part of) the annotation was not understood; None when it was."""

    def covers(self, index: int, since: datetime) -> bool:
        """Whether a fault of GPU ``index`` that began at ``since`` has been acknowledged."""
        until = self.until.get(index)
        # Times are written to the second (metav1.Time): compare at that resolution.
        return until is not None and since.replace(microsecond=0) <= until


def read_acknowledgements(annotations: Mapping[str, Any] | None) -> Acknowledgements:
    """The acknowledgements on a GPUNode; a malformed annotation acknowledges nothing, and says why."""
    raw = (annotations or {}).get(HEALTH_ACK_ANNOTATION)
    if raw is None:
        return Acknowledgements({})
    try:
        data = json.loads(raw) if isinstance(raw, str) else None
    except RecursionError:
        return Acknowledgements({}, f"{HEALTH_ACK_ANNOTATION} is nested too deep; expected "
                                    '{"<gpu index>": "<RFC 3339 time>"}')
    except json.JSONDecodeError as exc:
        return Acknowledgements({}, f"{HEALTH_ACK_ANNOTATION} is not JSON ({exc.msg}); expected "
                                    '{"<gpu index>": "<RFC 3339 time>"}')
    if not isinstance(data, dict):
        return Acknowledgements({}, f"{HEALTH_ACK_ANNOTATION} must be a JSON object of GPU index to time")
    until: dict[int, datetime] = {}
    bad: list[str] = []
    for key, value in data.items():
        when = parse_time(value) if isinstance(value, str) else None
        if not str(key).isdigit() or when is None:
            bad.append(f"{key!r}: {value!r}")
            continue
        until[int(key)] = when
    problem = (f"{HEALTH_ACK_ANNOTATION}: entries ignored (want a GPU index and an RFC 3339 time): "
               + ", ".join(bad)) if bad else None
    return Acknowledgements(until, problem)


def acknowledge(annotations: Mapping[str, Any] | None, indexes: list[int], when: datetime) -> str:
    """The annotation's new value: ``indexes`` acknowledged up to ``when``, the others kept."""
    current = dict(read_acknowledgements(annotations).until)
    for index in indexes:
        if index < 0:
            raise ValueError(f"GPU index must be 0 or more, got {index}")
        current[index] = when
    return json.dumps({str(i): format_time(t) for i, t in sorted(current.items())}, separators=(",", ":"))
