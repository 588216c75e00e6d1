"""The per-source connection cap's bookkeeping (``webhook.source_limits``)."""

from __future__ import annotations

import logging

import pytest

from webhook.source_limits import SourceLimiter


def test_a_source_is_refused_beyond_its_limit_and_others_are_not() -> None:
    refused: list[None] = []
    limiter = SourceLimiter(3, on_refuse=lambda: refused.append(None))
    assert [limiter.admit("10.0.0.9") for _ in range(5)] == [True, True, True, False, False]
    assert limiter.admit("10.0.0.1")  # the API server's address is counted apart
    assert len(refused) == 2
    assert limiter.open_connections("10.0.0.9") == 3  # refusals hold nothing


def test_a_closed_connection_frees_its_place() -> None:
    limiter = SourceLimiter(1)
    assert limiter.admit("a") and not limiter.admit("a")
    limiter.release("a")
    assert limiter.admit("a")
    limiter.release("a")
    assert limiter.open_connections("a") == 0


def test_logged_once_per_change_of_state(caplog: pytest.LogCaptureFixture) -> None:
    limiter = SourceLimiter(4)
    caplog.set_level(logging.INFO, logger="gpupack.webhook.connections")
    for _ in range(4):
        limiter.admit("s")
    for _ in range(100):  # a flood churning at the limit: one close, one more refused, ...
        assert not limiter.admit("s")
        limiter.release("s")
        assert limiter.admit("s")
    assert limiter.is_limited("s")
    for _ in range(2):  # down to half the limit: no longer limited
        limiter.release("s")
    assert not limiter.is_limited("s")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert messages[0].startswith("refusing connections from s") and "again" in messages[1]
    assert "100 refused" in messages[1]


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SourceLimiter(0)
