"""Kubernetes time stamps, written and read one way by every component.

API objects carry RFC 3339 times in UTC: ``metav1.Time`` to the second
(``2026-12-01T07:30:00Z``: conditions, annotations gpupack writes, the
agent's journal) and ``metav1.MicroTime`` to the microsecond (Leases).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def _utc(value: datetime | float) -> datetime:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc) if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return datetime.fromtimestamp(value, timezone.utc)


def format_time(value: datetime | float) -> str:
    """``metav1.Time`` of a datetime (naive: UTC) or a Unix time stamp."""
    return _utc(value).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(value: datetime | float) -> str:
    """``metav1.MicroTime`` of a datetime (naive: UTC) or a Unix time stamp."""
    return _utc(value).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: Any) -> datetime | None:
    """An aware datetime from an RFC 3339 string (a missing offset means UTC); None when
    ``value`` is not one, so a reader of an API object can skip a bad field."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def seconds_since(value: Any, now: datetime) -> float | None:
    """How long before ``now`` (aware) the RFC 3339 stamp ``value`` lies, never negative (a clock
    ahead of ours reads as just now); None when ``value`` is not a stamp. The silence of a GPUNode's
    agent (``status.heartbeatTime``) for the controller and the DRA plugin's health stream alike."""
    stamp = parse_time(value)
    return None if stamp is None else max(0.0, (now - stamp).total_seconds())
