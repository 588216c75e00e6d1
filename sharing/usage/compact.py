"""A container's usage history as a small API value and back: how the node agent publishes it and
the controller keeps it (``sharing.api.crd.UsageHistory``).

The format is the Kubernetes VPA's checkpoint (``VerticalPodAutoscalerCheckpoint``, kubernetes/
autoscaler ``vertical-pod-autoscaler/pkg/recommender/util/decaying_histogram.go``,
``SaveToChekpoint``): only the buckets that hold weight are written, their weights scaled to
integers so the largest is ``MAX_CHECKPOINT_WEIGHT`` (10,000), beside the total weight and the
reference time the weights are decayed to. Reading back spreads the total over the buckets in
those proportions, so a percentile stays in its bucket. One difference: VPA drops a bucket whose
scaled weight rounds to 0; here it keeps weight 1, because the right-sizer's p99 lives in the
rare high buckets, and dropping them would lower the recommendation.

Memory peaks are written as they are kept (one maximum per interval, ``sharing.usage.peaks``);
the limit hits with the time and limit of the last one. A history may hold memory without compute
(:func:`memory_only`: a pod whose compute is not its own, such as an MPS client): it is written
with no duty buckets and ``samples`` 0, and read back so; ``memoryLastSeconds`` keeps when its
memory was last seen, which the memory margin's schedule reads (``ContainerHistory.memory_observed_s``). Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from sharing.api.crd import MAX_CHECKPOINT_WEIGHT, HistogramCheckpoint, PeakCheckpoint, UsageHistory
from sharing.usage.histogram import DecayingHistogram
from sharing.usage.peaks import WindowedPeak
from sharing.usage.recommender import ContainerHistory, RecommenderSettings

MIB = 1024 * 1024


class LimitHits:
    """A container's memory-limit hits: how many, and the time and limit of the last one."""

    def __init__(self, count: int = 0, last_s: float | None = None, last_limit_bytes: int | None = None) -> None:
        self.count, self.last_s, self.last_limit_bytes = count, last_s, last_limit_bytes

    def hit(self, time_s: float, limit_bytes: int) -> None:
        self.count += 1
        self.last_s, self.last_limit_bytes = time_s, limit_bytes


def encode_histogram(histogram: DecayingHistogram) -> HistogramCheckpoint:
    """The histogram's sparse, integer-scaled form (module docstring)."""
    largest = max(histogram.weights, default=0.0)
    if not histogram.started or largest <= 0:
        return HistogramCheckpoint()
    buckets, weights = [], []
    for index, weight in enumerate(histogram.weights):
        if weight > 0:
            buckets.append(index)
            weights.append(max(1, min(MAX_CHECKPOINT_WEIGHT, round(weight * MAX_CHECKPOINT_WEIGHT / largest))))
    return HistogramCheckpoint(reference_seconds=histogram.reference_s, total_weight=histogram.total_weight,
                               buckets=buckets, weights=weights)


def decode_histogram(checkpoint: HistogramCheckpoint, into: DecayingHistogram) -> None:
    """Load ``checkpoint`` into the empty histogram ``into`` (its options give the bucket count)."""
    if not checkpoint.buckets or checkpoint.total_weight <= 0:
        return
    size = len(into.weights)
    beyond = [b for b in checkpoint.buckets if b >= size]
    if beyond:
        raise ValueError(f"histogram bucket {beyond[0]} is past this histogram's {size} buckets "
                         "(written with other options)")
    scale = checkpoint.total_weight / sum(checkpoint.weights)
    for bucket, weight in zip(checkpoint.buckets, checkpoint.weights):
        into.weights[bucket] = weight * scale
    into.reference_s, into.started = checkpoint.reference_seconds, True


def encode_peaks(peaks: WindowedPeak) -> PeakCheckpoint:
    interval = peaks.options.interval_s
    if interval != int(interval):
        raise ValueError(f"peak intervals must be whole seconds to be published, got {interval}")
    return PeakCheckpoint(interval_seconds=int(interval), intervals=[index for index, _ in peaks.intervals],
                          bytes=[math.ceil(value) for _, value in peaks.intervals])


def decode_peaks(checkpoint: PeakCheckpoint, into: WindowedPeak) -> None:
    """Add the checkpoint's peaks to ``into``; its intervals must be the checkpoint's."""
    if checkpoint.interval_seconds != into.options.interval_s:
        raise ValueError(f"peaks of {checkpoint.interval_seconds} s intervals cannot be read into "
                         f"{into.options.interval_s:g} s intervals")
    for index, value in sorted(zip(checkpoint.intervals, checkpoint.bytes)):
        into.add(float(value), index * into.options.interval_s)


def encode(history: ContainerHistory, hits: LimitHits, gpu_memory_mib: int) -> UsageHistory:
    """``history`` (and its limit hits) as the API's compact value."""
    sampled = history.samples > 0
    return UsageHistory(
        first_seconds=history.first_s if sampled else 0.0, last_seconds=history.last_s if sampled else 0.0,
        samples=history.samples, duty=encode_histogram(history.duty), memory=encode_peaks(history.memory),
        limit_hits=hits.count, last_hit_seconds=hits.last_s, last_hit_limit_bytes=hits.last_limit_bytes,
        gpu_memory_mib=gpu_memory_mib,
        memory_last_seconds=history.memory_last_s if math.isfinite(history.memory_last_s) else None)


def decode(value: UsageHistory, settings: RecommenderSettings) -> tuple[ContainerHistory, LimitHits]:
    """A history (of ``settings``' shape) and its limit hits from the API's compact value.
    ``ValueError`` when the value was written with another histogram or peak shape."""
    history = ContainerHistory(settings)
    decode_histogram(value.duty, history.duty)
    decode_peaks(value.memory, history.memory)
    if value.samples:
        history.first_s, history.last_s, history.samples = value.first_seconds, value.last_seconds, value.samples
        history.memory_last_s = value.last_seconds
    if value.memory_last_seconds is not None:
        history.memory_last_s = max(history.memory_last_s, value.memory_last_seconds)
    history.ooms = value.limit_hits
    return history, LimitHits(value.limit_hits, value.last_hit_seconds, value.last_hit_limit_bytes)


def merged(histories: Iterable[ContainerHistory], settings: RecommenderSettings) -> ContainerHistory:
    """One history holding the samples of all of ``histories`` (a workload's pods, per container):
    histograms merged (``DecayingHistogram.merge``), peaks (and OOM floors) by interval, spans, counts
    and hits summed."""
    out = ContainerHistory(settings)
    peaks: dict[int, float] = {}
    floors: dict[int, float] = {}
    for history in histories:
        out.duty.merge(history.duty)
        for index, value in history.memory.intervals:
            peaks[index] = max(value, peaks.get(index, 0.0))
        for index, value in history.oom_floor.intervals:
            floors[index] = max(value, floors.get(index, 0.0))
        out.first_s, out.last_s = min(out.first_s, history.first_s), max(out.last_s, history.last_s)
        out.memory_last_s = max(out.memory_last_s, history.memory_last_s)
        out.samples += history.samples
        out.ooms += history.ooms
    for index in sorted(peaks):
        out.memory.add(peaks[index], index * settings.memory.interval_s)
    for index in sorted(floors):
        out.oom_floor.add(floors[index], index * settings.memory.interval_s)
    return out


def memory_only(history: ContainerHistory, settings: RecommenderSettings) -> ContainerHistory:
    """``history``'s memory peaks and limit hits without its compute: no duty weight, and no sample count,
    first or last time (they measure the compute observed; ``node.usage.publication``, a pod whose compute
    is not its own). ``history``'s peaks are shared, not copied."""
    out = ContainerHistory(settings)
    out.memory, out.ooms, out.memory_last_s = history.memory, history.ooms, history.memory_last_s
    return out


__all__ = ["LimitHits", "decode", "decode_histogram", "decode_peaks", "encode", "encode_histogram", "encode_peaks",
           "memory_only", "merged"]
