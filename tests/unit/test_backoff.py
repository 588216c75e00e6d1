"""``kube.backoff``: growing, bounded, jittered pauses and one log line per change of state."""

from __future__ import annotations

import random

from kube.backoff import Backoff


def test_pauses_double_up_to_the_ceiling_with_jitter_below_them() -> None:
    backoff = Backoff(base_s=1.0, max_s=8.0, rng=random.Random(7))
    pauses = [backoff.failed("down")[0] for _ in range(8)]
    ceilings = [1, 2, 4, 8, 8, 8, 8, 8]
    assert all(c / 2 <= p <= c for p, c in zip(pauses, ceilings)), pauses
    assert len(set(pauses)) == len(pauses)  # jittered: agents of a fleet do not retry in lockstep


def test_only_a_new_problem_is_news_and_success_resets() -> None:
    backoff = Backoff(base_s=1.0, max_s=60.0, rng=random.Random(1))
    assert backoff.failed("connection refused")[1] is True
    assert backoff.failed("connection refused")[1] is False
    assert backoff.failed("503 Service Unavailable")[1] is True
    assert backoff.succeeded() == 3
    assert backoff.succeeded() == 0
    pause, news = backoff.failed("connection refused")
    assert news and pause <= 1.0  # back to the first pause after a success
