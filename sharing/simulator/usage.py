"""``gpupack simulate usage``'s run: a usage trace replayed minute by minute, with its baselines.

Each pod of the trace lives from its first sample to its last and first asks for a whole GPU
(what it held in production). A run reports, from one replay of the trace on GPUs of one model
(its memory from ``mig.catalog``), the figures of ``sharing.simulator.usage_figures`` for the
packing under test beside the oracle's saving and the naive static packing's figures
(``sharing.simulator.usage_baselines``), so every figure sits next to its bounds.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from mig.catalog import get_model
from sharing.simulator.usage_baselines import StaticRule, oracle_seatings, static_seatings
from sharing.simulator.usage_figures import measure
from sharing.simulator.usage_replay import RightSizing, right_sizing_seatings
from sharing.usage.recommender import WorkloadKey
from sharing.usage.trace import UsageTrace

MIB = 1024 * 1024


def gpu_memory_bytes(model_name: str) -> tuple[str, int]:
    """(product name, memory in bytes) of a GPU model; ``mig.errors.UnknownModelError`` (listing
    the known names) for a name the catalog does not know."""
    model = get_model(model_name)
    return model.product, model.memory_mib * MIB


def baselines(trace: UsageTrace, model_name: str, static: StaticRule = StaticRule()) -> dict[str, Any]:
    """The oracle's and the peak oracle's savings and the static packing's figures, whole run and
    after its warm-up."""
    product, memory = gpu_memory_bytes(model_name)
    oracle = measure(trace, memory, oracle_seatings(trace, memory))
    peak_oracle = measure(trace, memory, oracle_seatings(trace, memory, by_peak=True))
    warmup = round(static.warmup_s / trace.step_s)
    after = measure(trace, memory, static_seatings(trace, memory, static), from_step=warmup)
    return {
        "gpu": product,
        "gpu_memory_bytes": memory,
        "pods": oracle.pods,
        "gpu_hours_baseline": oracle.gpu_hours_baseline,
        "oracle_gpu_hours_saved_pct": oracle.gpu_hours_saved_pct,
        "peak_oracle_gpu_hours_saved_pct": peak_oracle.gpu_hours_saved_pct,
        "static": dataclasses.asdict(measure(trace, memory, static_seatings(trace, memory, static))),
        "static_after_warmup": dataclasses.asdict(after),
    }


def run_usage(trace: UsageTrace, model_name: str, policy: RightSizing = RightSizing(),
              workloads: Mapping[str, WorkloadKey] | None = None, static: StaticRule = StaticRule()) -> dict[str, Any]:
    """The issue's JSON for one run of ``policy`` on ``trace``: its figures, and beside them the
    oracle's saving and the static packing's figures (``baselines``)."""
    bounds = baselines(trace, model_name, static)
    memory = bounds["gpu_memory_bytes"]
    figures = measure(trace, memory, right_sizing_seatings(trace, memory, policy, workloads))
    return {"mode": policy.mode, **bounds, **dataclasses.asdict(figures)}


DRAWN_KEYS = ("gpu_hours", "gpu_hours_saved_pct", "saturated_gpu_minutes_pct", "gpu_memory_overflow_minutes",
              "pod_minutes_over_limit_pct", "evictions_per_pod_day", "evictions_after_first_per_pod_day")
"""The figures ``run_usage_draws`` summarises over its draws."""


def run_usage_draws(trace: UsageTrace, model_name: str, policy: RightSizing, draws: int, seed: int,
                    missed_samples: float = 0.0, workloads: Mapping[str, WorkloadKey] | None = None) -> dict[str, Any]:
    """``policy`` run ``draws`` times with observation noise drawn from ``seed``, ``seed + 1``, ...
    (``sharing.simulator.usage_replay``, "Observation noise"; ``missed_samples`` the probability of
    missing a sample): each figure's mean, least and most,
    and each draw's saving. What a live run is compared with on few pods, where one pod's move
    shifts the saving by points."""
    if draws < 1:
        raise ValueError(f"draws must be at least 1, got {draws}")
    memory = gpu_memory_bytes(model_name)[1]
    runs = [dataclasses.asdict(measure(trace, memory, right_sizing_seatings(
        trace, memory, dataclasses.replace(policy, observation_seed=seed + index, missed_samples=missed_samples), workloads)))
        for index in range(draws)]
    return {
        "count": draws, "seed": seed, "missed_samples": missed_samples,
        "mean": {k: round(sum(r[k] for r in runs) / draws, 3) for k in DRAWN_KEYS},
        "min": {k: min(r[k] for r in runs) for k in DRAWN_KEYS},
        "max": {k: max(r[k] for r in runs) for k in DRAWN_KEYS},
        "gpu_hours_saved_pct": [r["gpu_hours_saved_pct"] for r in runs],
    }


def parse_workloads(text: str, source: str, pods: Sequence[str]) -> dict[str, WorkloadKey]:
    """pod -> workload from a CSV with the columns ``container_ip`` and ``workload`` (header first).

    Pods the file does not name stay their own workloads; a pod the trace does not hold, an empty
    workload name or a pod named twice is an error naming the source and line."""
    rows = csv.reader(text.splitlines())
    header = [name.strip() for name in next(rows, [])]
    if header[:2] != ["container_ip", "workload"] or len(header) != 2:
        raise ValueError(f"{source}:1: expected the header container_ip,workload, got {','.join(header)!r}")
    known = set(pods)
    out: dict[str, WorkloadKey] = {}
    for line, row in enumerate(rows, start=2):
        if not row:
            continue
        if len(row) != 2 or not row[1].strip():
            raise ValueError(f"{source}:{line}: expected a container_ip and a workload name")
        pod, workload = row[0].strip(), row[1].strip()
        if pod not in known:
            raise ValueError(f"{source}:{line}: pod {pod!r} is not in the trace")
        if pod in out:
            raise ValueError(f"{source}:{line}: pod {pod!r} named twice")
        out[pod] = WorkloadKey("trace", "Workload", workload, "main")
    return out
