"""Kubernetes time stamps and condition bookkeeping, one implementation for every component."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from kube.conditions import MESSAGE_LIMIT, Cond, merge_conditions
from kube.times import format_micro_time, format_time, parse_time

AT = datetime(2026, 12, 1, 7, 30, 5, 123456, tzinfo=timezone.utc)


def test_times_are_written_in_utc_to_the_second_or_the_microsecond() -> None:
    assert format_time(AT) == "2026-12-01T07:30:05Z"
    assert format_micro_time(AT) == "2026-12-01T07:30:05.123456Z"
    assert format_time(AT.astimezone(timezone(timedelta(hours=2)))) == "2026-12-01T07:30:05Z"
    assert format_time(AT.replace(tzinfo=None)) == "2026-12-01T07:30:05Z"  # naive: UTC
    assert format_time(AT.timestamp()) == "2026-12-01T07:30:05Z"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-01T07:30:05Z", AT.replace(microsecond=0)),
        ("2026-12-01T07:30:05.123456Z", AT),
        ("2026-12-01T09:30:05+02:00", AT.replace(microsecond=0)),
        ("2026-12-01T07:30:05", AT.replace(microsecond=0)),  # no offset: UTC
        ("yesterday", None),
        ("", None),
        (1764574205, None),
        (None, None),
    ],
)
def test_times_are_read_back_or_refused(text: object, expected: datetime | None) -> None:
    assert parse_time(text) == expected


def test_written_times_read_back() -> None:
    assert parse_time(format_time(AT)) == AT.replace(microsecond=0)
    assert parse_time(format_micro_time(AT)) == AT


def test_a_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    first = merge_conditions([], [Cond("Ready", "True", "Applied", "ok")], 3, AT)
    assert first == [{"type": "Ready", "status": "True", "reason": "Applied", "message": "ok",
                      "lastTransitionTime": "2026-12-01T07:30:05Z", "observedGeneration": 3}]
    later = AT + timedelta(minutes=5)
    same = merge_conditions(first, [Cond("Ready", "True", "StillApplied", "still ok")], 4, later)
    assert same[0]["lastTransitionTime"] == "2026-12-01T07:30:05Z" and same[0]["reason"] == "StillApplied"
    flipped = merge_conditions(same, [Cond("Ready", "False", "Invalid", "x" * (MESSAGE_LIMIT + 10))], None, later)
    assert flipped[0]["lastTransitionTime"] == "2026-12-01T07:35:05Z"
    assert len(flipped[0]["message"]) == MESSAGE_LIMIT and "observedGeneration" not in flipped[0]
