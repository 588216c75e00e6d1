"""The compact form of a usage history (``sharing.usage.compact``): percentiles survive encoding
within their bucket, peaks and counts exactly, and merged histories equal one history of all samples."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from sharing.api.crd import MAX_CHECKPOINT_WEIGHT, HistogramCheckpoint, PeakCheckpoint, UsageHistory, to_wire
from sharing.usage.compact import LimitHits, decode, encode, encode_histogram, merged
from sharing.usage.histogram import HistogramOptions
from sharing.usage.peaks import PeakOptions
from sharing.usage.recommender import ContainerHistory, RecommenderSettings

SETTINGS = RecommenderSettings()
GIB = 1024**3
QUANTILES = (0.5, 0.9, 0.95, 0.99, 1.0)


def _history(samples: list[tuple[float, float, int]], settings: RecommenderSettings = SETTINGS) -> ContainerHistory:
    history = ContainerHistory(settings)
    for t, duty, memory in samples:
        history.observe(t, duty, memory)
    return history


def _bursty(seed: int, start: float = 1.7e9, n: int = 3000) -> list[tuple[float, float, int]]:
    rng = random.Random(seed)
    # An inference pod: mostly idle, bursts to 60-100 % in 1 % of minutes, memory moving between loads.
    return [(start + 60 * i, rng.choice((0.0, 0.0, 0.0, 3.0, 8.0)) if rng.random() > 0.01 else rng.uniform(60, 100),
             int((20 + 5 * rng.random()) * GIB)) for i in range(n)]


def _bucket(value: float) -> int:
    return SETTINGS.duty.bucket(value - 1e-9)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_percentiles_survive_encoding_within_a_bucket(seed: int) -> None:
    history = _history(_bursty(seed))
    back, _ = decode(encode(history, LimitHits(), 81559), SETTINGS)
    for q in QUANTILES:
        assert abs(_bucket(back.duty.percentile(q)) - _bucket(history.duty.percentile(q))) <= 1, q
    assert back.duty.total_weight == pytest.approx(history.duty.total_weight)


def test_a_rare_bucket_is_kept_where_vpa_would_round_it_away() -> None:
    history = _history([(1.7e9 + i, 1.0, GIB) for i in range(100_000)] + [(1.7e9 + 100_001, 95.0, GIB)])
    checkpoint = encode_histogram(history.duty)
    assert max(checkpoint.weights) == MAX_CHECKPOINT_WEIGHT
    assert checkpoint.weights[-1] == 1  # 1e-5 of the largest: 0 once rounded, kept at 1
    back, _ = decode(encode(history, LimitHits(), 0), SETTINGS)
    assert back.duty.percentile(1.0) == history.duty.percentile(1.0) > 90


def test_peaks_counts_times_and_hits_come_back_exactly() -> None:
    history = _history(_bursty(4, n=600))
    value = encode(history, LimitHits(2, 1.7e9 + 500, 40 * GIB), 81559)
    back, hits = decode(UsageHistory.model_validate(to_wire(value)), SETTINGS)  # through the wire form
    assert list(back.memory.intervals) == [(i, float(int(v) + (v != int(v)))) for i, v in history.memory.intervals]
    assert back.memory.peak() == pytest.approx(history.memory.peak(), abs=1)
    assert (back.first_s, back.last_s, back.samples) == (history.first_s, history.last_s, history.samples)
    assert (hits.count, hits.last_s, hits.last_limit_bytes, back.ooms) == (2, 1.7e9 + 500, 40 * GIB, 2)
    assert value.gpu_memory_mib == 81559


def test_an_empty_history_encodes_empty_and_decodes_to_no_samples() -> None:
    back, hits = decode(encode(ContainerHistory(SETTINGS), LimitHits(), 0), SETTINGS)
    assert back.samples == 0 and back.duty.is_empty() and back.memory.peak() == 0 and hits.count == 0


def test_merged_pods_equal_one_history_of_all_their_samples() -> None:
    a, b = _bursty(5, n=1500), _bursty(6, start=1.7e9 + 30 * 60, n=1500)
    together = _history(sorted(a + b))
    parts = [decode(encode(_history(s), LimitHits(), 0), SETTINGS)[0] for s in (a, b)]
    merged_history = merged(parts, SETTINGS)
    for q in QUANTILES:
        assert abs(_bucket(merged_history.duty.percentile(q)) - _bucket(together.duty.percentile(q))) <= 1, q
    assert merged_history.memory.peak() == pytest.approx(together.memory.peak(), abs=1)
    assert (merged_history.first_s, merged_history.last_s, merged_history.samples) == (
        together.first_s, together.last_s, together.samples)


def test_a_history_of_other_options_is_refused_with_the_reason() -> None:
    narrow = RecommenderSettings(duty=HistogramOptions(max_value=100.0, first_bucket=5.0))
    with pytest.raises(ValueError, match="past this histogram's"):
        decode(encode(_history([(1.7e9, 99.0, GIB)]), LimitHits(), 0), narrow)
    half_hour = RecommenderSettings(memory=PeakOptions(interval_s=1800.0))
    with pytest.raises(ValueError, match="3600 s intervals cannot be read into 1800 s"):
        decode(encode(_history([(1.7e9, 9.0, GIB)]), LimitHits(), 0), half_hour)


@pytest.mark.parametrize(("model", "raw", "error"), [
    (HistogramCheckpoint, {"buckets": [1, 2], "weights": [3]}, "differ in length"),
    (HistogramCheckpoint, {"buckets": [1, 1], "weights": [3, 3]}, "must not repeat"),
    (HistogramCheckpoint, {"buckets": [1], "weights": [MAX_CHECKPOINT_WEIGHT + 1]}, "less than or equal"),
    (PeakCheckpoint, {"intervals": [1], "bytes": []}, "differ in length"),
], ids=["lengths", "repeated-bucket", "weight-too-large", "peak-lengths"])
def test_malformed_checkpoints_are_refused(model: type[HistogramCheckpoint | PeakCheckpoint], raw: dict[str, object],
                                          error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        model.model_validate(raw)
