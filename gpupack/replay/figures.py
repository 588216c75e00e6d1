"""The replay's figures: live allocation per arrived-demand level, beside both simulator models on the same plan.

The live figure is computed exactly as the simulator computes its own
(``sharing.simulator.metrics.alloc_by_level``, the function ``run_product``
calls): after every attempt, in arrival order, the GPU milli arrived so far
(never-placed pods included) and the GPU milli of the pods bound so far (a
pod bound is its request allocated: ``gpu_milli`` times ``gpu_count``, the
protocol's accounting), over the plan's GPUs. ``simulated_alloc_at`` is the
product model (``sharing.simulator.product.run_product``) and
``fgd_alloc_at`` the FGD paper's protocol (``sharing.simulator.replay.run_once``),
each run on the same node list, trace, seed, inflation and node sample, so on
the same plan (``sharing.simulator.arrivals.plan_run``) and with the policy the
live controller runs. The product model rebuilds its typical pods before every
pod (``typical_every=1``): the replay submits one pod at a time, so each
planning cycle sees the pods placed so far and that one.

kube-scheduler breaks ties between equally scored nodes at random, live and in
the product model alike, so a live run and one model run can part ways on a
tie and end a point apart on a small cluster with neither wrong: the product
model's figure is the mean of :data:`DEFAULT_DRAWS` draws of those ties. :func:`follow_live` separates that from a real difference: the product
model again, its ties broken the live run's way pod by pod
(``run_product(follow=...)``); every pod it still places elsewhere is a
decision the live system made that the model's rules would not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from sharing.api.priority import PodPriority
from sharing.packing.specs import GPU_MILLI, NodeSpec, PodSpec
from sharing.simulator.preempting import PriorityFigures
from sharing.simulator.metrics import alloc_by_level
from sharing.simulator.product import Divergence, run_product
from sharing.simulator.replay import run_once
from sharing.simulator.scheduler_config import load_weights

Levels = dict[int, float | None]


def live_alloc_at(pods: Sequence[PodSpec], bound: Sequence[bool], total_gpus: int,
                  withdrawn: Sequence[int] | None = None) -> Levels:
    """Allocation % per arrived-demand level of attempts ``pods`` (arrival order) with outcomes ``bound``;
    ``withdrawn``: per attempt, the GPU milli of placed pods preempted during it (taken off from then
    on, as the product model withdraws a victim)."""
    if len(pods) != len(bound) or (withdrawn is not None and len(withdrawn) != len(pods)):
        raise ValueError(f"{len(pods)} pods but {len(bound)} outcomes"
                         + ("" if withdrawn is None else f" and {len(withdrawn)} withdrawals"))
    demand = np.cumsum([p.gpu_total_milli for p in pods], dtype=np.int64)
    used = np.cumsum([p.gpu_total_milli if b else 0 for p, b in zip(pods, bound)], dtype=np.int64)
    if withdrawn is not None:
        used -= np.cumsum(np.asarray(withdrawn, dtype=np.int64))
    return alloc_by_level(demand, used, total_gpus)


def final_alloc_percent(pods: Sequence[PodSpec], bound: Sequence[bool], total_gpus: int, withdrawn: int = 0) -> float:
    """GPU milli of the bound pods (less ``withdrawn``, those preempted) over all GPU milli, in percent,
    at the end of the run."""
    return 100.0 * (sum(p.gpu_total_milli for p, b in zip(pods, bound) if b) - withdrawn) / (total_gpus * GPU_MILLI)


DEFAULT_DRAWS = 5
"""Draws of kube-scheduler's random ties the product model's figure is the mean of."""


@dataclass(frozen=True)
class ModelFigures:
    """Both simulator models on the replay's plan."""

    product_alloc_at: Levels
    """Mean over the draws of kube-scheduler's ties, per level."""
    product_failed_pods: float
    fgd_alloc_at: Levels
    fgd_failed_pods: int
    product_draws_at_130: tuple[float | None, ...] = ()
    """Each draw's figure at 130 % (or the highest level reached)."""
    product_priority: tuple[PriorityFigures, ...] = ()
    """Each draw's figures per class and of preemption (with priorities; empty without)."""


def mean_levels(runs: Sequence[Levels]) -> Levels:
    """Per level the mean of ``runs`` (None where any run has none)."""
    out: Levels = {}
    for level in runs[0]:
        values = [r.get(level) for r in runs]
        out[level] = None if any(v is None for v in values) else round(sum(v for v in values if v is not None) / len(values), 2)
    return out


def model_figures(nodes: Sequence[NodeSpec], trace_pods: Sequence[PodSpec], policy: str, seed: int,
                  inflate: float, max_nodes: int | None, draws: int = DEFAULT_DRAWS,
                  say: Callable[[str], None] | None = None,
                  priorities: Mapping[str, PodPriority] | None = None) -> ModelFigures:
    """The product model and the FGD protocol on the plan the replay submits (module docstring).

    Live, kube-scheduler breaks ties between equally scored nodes at random, so one live run is one
    draw of them; the product model's figure is the mean of ``draws`` draws (``scheduler_draw``).
    ``say`` hears a line as each run starts (on the whole cluster a draw takes minutes).
    ``priorities``: each pod's, by trace name (``--priority qos``): the product model then preempts
    with the engine's choice of victims (``--preemption engine``), as the live controller does."""
    if draws < 1:
        raise ValueError(f"draws must be at least 1, got {draws}")
    runs = []
    for d in range(draws):
        if say is not None:
            say(f"product model: draw {d + 1} of {draws} of kube-scheduler's ties")
        runs.append(run_product(nodes, trace_pods, policy, seed, load_weights(), "engine", inflate,
                                max_nodes=max_nodes, typical_every=1, scheduler_draw=d,
                                priorities=priorities, preemption="none" if priorities is None else "engine"))
    if say is not None:
        say("FGD protocol: one run")
    fgd = run_once(nodes, trace_pods, policy, seed, inflate, max_nodes=max_nodes)
    return ModelFigures(mean_levels([r.alloc_at for r in runs]), round(sum(r.failed_pods for r in runs) / draws, 1),
                        fgd.alloc_at, fgd.failed_pods, tuple(level_at(r.alloc_at, 130) for r in runs),
                        tuple(r.priority for r in runs if r.priority is not None))


@dataclass(frozen=True)
class Following:
    """The product model run along a live run's choices (module docstring)."""

    alloc_at: Levels
    divergences: tuple[Divergence, ...]


def follow_live(nodes: Sequence[NodeSpec], trace_pods: Sequence[PodSpec], policy: str, seed: int, inflate: float,
                max_nodes: int | None, live_nodes: Sequence[str | None],
                priorities: Mapping[str, PodPriority] | None = None) -> Following:
    """The product model on the replay's plan, ties broken toward ``live_nodes`` (per pod in arrival
    order, the trace name of the node it was bound to, or None): as far as the live run went, all
    of the plan or the pods submitted before it stopped early."""
    run = run_product(nodes, trace_pods, policy, seed, load_weights(), "engine", inflate, max_nodes=max_nodes,
                      follow=live_nodes, typical_every=1, stop_after=len(live_nodes), priorities=priorities,
                      preemption="none" if priorities is None else "engine")
    return Following(run.alloc_at, run.divergences)


def level_at(levels: Levels, level: int) -> float | None:
    """The value at ``level``, or else at the highest level below it that has one (a run whose
    arrivals stop short of 130 % has nothing at 130)."""
    for at in range(level, -1, -1):
        value = levels.get(at)
        if value is not None:
            return value
    return None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (linear interpolation, numpy's default); None for no values."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else None
