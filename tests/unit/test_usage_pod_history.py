"""One pod container's history, as both usage sources add to it (``sharing.usage.pod_history``): samples,
memory-only samples that stick, and memory-limit hits raised as ``Recommender.record_oom`` raises them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sharing.usage.pod_history import add_sample, record_hit
from sharing.usage.recommender import MIB, ContainerHistory, Recommender, RecommenderSettings, WorkloadKey

SETTINGS = RecommenderSettings(sample_interval_s=60.0)


def test_a_sample_with_its_compute_is_observed() -> None:
    history = ContainerHistory(SETTINGS)
    assert add_sample(history, SETTINGS, 60.0, 30.0, 100 * MIB, was_memory_only=False) is history
    assert (history.samples, history.first_s, history.memory.peak()) == (1, 60.0, 100 * MIB)


def test_memory_without_compute_drops_the_duty_samples_and_adds_only_memory_from_then_on() -> None:
    history = ContainerHistory(SETTINGS)
    add_sample(history, SETTINGS, 0.0, 30.0, 100 * MIB, was_memory_only=False)
    kept = add_sample(history, SETTINGS, 60.0, None, 300 * MIB, was_memory_only=False)
    assert kept is not history and (kept.samples, kept.duty.total_weight, kept.memory.peak()) == (0, 0.0, 300 * MIB)
    # Later samples with a duty cycle add their memory only: the mark holds for the pod's life.
    assert add_sample(kept, SETTINGS, 120.0, 50.0, 400 * MIB, was_memory_only=True) is kept
    assert (kept.samples, kept.duty.total_weight, kept.memory.peak()) == (0, 0.0, 400 * MIB)


@pytest.mark.parametrize("margin_over_oom", [True, False])
def test_a_hit_raises_the_memory_as_record_oom_and_survives_the_compute_becoming_unknown(
        margin_over_oom: bool) -> None:
    settings = replace(SETTINGS, margin_over_oom=margin_over_oom)
    history = ContainerHistory(settings)
    add_sample(history, settings, 0.0, 30.0, 100 * MIB, was_memory_only=False)
    record_hit(history, settings, 30.0, 1024 * MIB)
    reference = Recommender(settings)
    key = WorkloadKey("ml", "Pod", "a", "c")
    reference.observe(key, 0.0, 30.0, 100 * MIB)
    reference.record_oom(key, 30.0, 1024 * MIB)
    expected = reference.histories[key]
    assert history.ooms == expected.ooms == 1
    assert (history.memory.peak(), history.oom_floor.peak()) == (expected.memory.peak(), expected.oom_floor.peak())
    after = add_sample(history, settings, 60.0, None, 200 * MIB, was_memory_only=False)
    assert after.ooms == 1 and max(after.memory.peak(), after.oom_floor.peak()) > 1024 * MIB
