"""Memory-only observation: an MPS client's memory is watched while its compute is not read
(sharing.usage.recommender.observe_memory, sharing.usage.compact, the simulator's shares)."""

from __future__ import annotations

import dataclasses
import math

from sharing.simulator.usage_replay import RightSizing, right_sizing_seatings
from sharing.usage.compact import LimitHits, decode, encode, memory_only, merged
from sharing.usage.recommender import Recommender, RecommenderSettings, WorkloadKey
from sharing.usage.trace import PodUsage, SignalCounts, UsageTrace
from sharing.usage.updater import UpdaterSettings

GIB = 2**30
KEY = WorkloadKey("ml", "Deployment", "web", "main")
SETTINGS = RecommenderSettings(min_observed_s=3600.0, memory_margin=0.05, first_memory_margin=0.5,
                               margin_settle_s=6 * 3600.0)


def test_memory_only_samples_raise_the_peak_and_settle_the_margin_but_not_the_observed_time() -> None:
    rec = Recommender(SETTINGS)
    for minute in range(61):
        rec.observe(KEY, minute * 60.0, 20.0, 10 * GIB)
    first = rec.recommend(KEY)
    assert first is not None and first.memory_bytes == int(10 * GIB * 1.5)  # the first margin
    for minute in range(61, 6 * 60 + 1):
        rec.observe_memory(KEY, minute * 60.0, 12 * GIB)
    later = rec.recommend(KEY)
    assert later is not None
    assert later.observed_s == first.observed_s  # compute was seen for an hour only
    assert later.duty_percent == first.duty_percent
    assert later.memory_bytes == math.ceil(12 * GIB * 1.05)  # the settled margin over the memory-only peak
    history = rec.histories[KEY]
    assert history.samples == 61 and history.memory_observed_s == 6 * 3600.0


def test_the_compact_form_keeps_when_memory_was_last_seen() -> None:
    rec = Recommender(SETTINGS)
    rec.observe(KEY, 0.0, 20.0, GIB)
    rec.observe_memory(KEY, 7200.0, 2 * GIB)
    value = encode(rec.histories[KEY], LimitHits(), 81920)
    assert value.memory_last_seconds == 7200.0
    back, _ = decode(value, SETTINGS)
    assert back.memory_observed_s == 7200.0 and back.samples == 1
    client = memory_only(back, SETTINGS)
    client.observe_memory(9000.0, GIB)
    whole = merged([back, decode(encode(client, LimitHits(), 81920), SETTINGS)[0]], SETTINGS)
    assert whole.memory_last_s == 9000.0 and whole.samples == 1 and whole.memory_observed_s == 9000.0


def _pods() -> UsageTrace:
    # Two quiet pods for an hour, then one bursts: its compute is only seen by a run that reads shared compute.
    quiet = tuple([5.0] * 240)
    bursty = tuple([5.0] * 120 + [90.0] * 120)
    pods = (PodUsage("a", 0, quiet, (10 * GIB,) * 240), PodUsage("b", 0, bursty, (10 * GIB,) * 240))
    return UsageTrace(0.0, 60.0, 240, pods, SignalCounts(), SignalCounts())


def test_the_simulator_reads_a_shared_pods_compute_only_when_told() -> None:
    trace = _pods()
    base = RightSizing(recommender=RecommenderSettings(min_observed_s=600.0, first_memory_margin=None),
                       updater=UpdaterSettings(interval_s=600.0))
    blind = [dict(s) for s in right_sizing_seatings(trace, 80 * GIB, base)]
    seeing = [dict(s) for s in right_sizing_seatings(trace, 80 * GIB, dataclasses.replace(base, shared_compute_observed=True))]
    assert blind[60]["a"].gpu == blind[60]["b"].gpu  # both packed on one GPU after ten minutes
    # The burst is read only where shared compute is observed: there it moves b off a's GPU.
    assert seeing[-1]["a"].gpu != seeing[-1]["b"].gpu
    assert blind[-1]["a"].gpu == blind[-1]["b"].gpu
