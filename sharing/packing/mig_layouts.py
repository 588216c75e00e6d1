"""MIG layout strategies for the trace simulator's MIG variant (and the planner's core).

A GPU carries a layout: a multiset of MIG profiles (placements are left to
``mig.geometry``; every layout used here is one of ``maximal_layouts``, so it
fits). Pods use free instances; only an *idle* GPU (no instance in use) is
reshaped, because the GPU Operator's mig-manager destroys and recreates every
instance of a GPU whose config changes.

Strategies, all answering "which idle GPUs get which new layout, given the
profiles the waiting pods need":

* ``static:<layout>``: never reshape (all-balanced, all-1g, whole GPUs);
* ``greedy``: the strategy of the best-known open-source dynamic MIG
  partitioner: walk the idle GPUs in order and give each the geometry that
  supplies the most still-missing profiles;
* ``gpupack``: supply the missing profiles with as few reshapes as possible
  (the idle GPU and geometry that cover the most demand first), and among
  equally good geometries keep the leftover instances most useful for the
  recent request mix (an exponentially decayed histogram of requested
  profiles), so the next arrivals find an instance without another reshape.
  While the cluster has slack a pod may start at once on a larger free
  instance; under pressure it takes its own profile (``oversize = "adaptive"``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from mig.fit import smallest_covering_profile
from mig.geometry import maximal_layouts
from mig.migparted import builtin_config, layout_for
from mig.model import GpuModel, Profile

Layout = tuple[str, ...]


def usable_layouts(model: GpuModel) -> tuple[Layout, ...]:
    """Maximal layouts without media-extension profiles (no pod here asks for them)."""
    return tuple(l for l in maximal_layouts(model) if not any(model.profile(p).media_extensions for p in l))


def full_profile(model: GpuModel) -> Profile:
    """The whole-GPU profile (all compute slices)."""
    return max(model.profiles, key=lambda p: (p.compute_slices, p.memory_slices))


def profile_for(model: GpuModel, milli: int) -> Profile:
    """The documented mapping of an openb request onto ``model``: the smallest profile
    covering ``milli`` compute (ceil to slices) and the same share of the usable memory
    of the whole-GPU profile (openb pods state no GPU memory)."""
    full = full_profile(model)
    memory_mib = -(-milli * full.memory_mib // 1000)
    profile = smallest_covering_profile(model, milli, memory_mib * 1024 * 1024)
    return full if profile is None else profile


def static_layout(model: GpuModel, name: str) -> Layout:
    """``balanced`` (mig-parted's all-balanced), ``1g`` (all smallest 1g) or ``whole``."""
    if name == "balanced":
        names = layout_for(builtin_config("all-balanced"), model)
        if names is None:
            raise ValueError(f"all-balanced disables MIG on {model.product}")
        return tuple(sorted(names))
    if name == "1g":
        one = min(
            (p for p in model.profiles if p.compute_slices == 1 and not p.media_extensions),
            key=lambda p: p.memory_slices,
        )
        return (one.name,) * one.max_count
    if name == "whole":
        return (full_profile(model).name,)
    raise ValueError(f"unknown static layout {name!r}; choose balanced, 1g or whole")


@dataclass(frozen=True)
class Reshape:
    """Give idle GPU ``gpu`` the layout ``layout``."""

    gpu: int
    layout: Layout


class LayoutStrategy(Protocol):
    name: str
    oversize: str
    """May a pod use a free instance larger than the profile it asks for? ``any`` where the
    layout is fixed (a webhook then picks the smallest profile the inventory offers);
    ``never`` where pods ask for exactly one profile (``nvidia.com/mig-<profile>``);
    ``busy`` only on GPUs already in use (an idle GPU is reshaped rather than spent on a
    small pod); ``adaptive`` only while the cluster has slack (nobody waits and at least
    an eighth of the GPUs are idle), so pods start at once when there is room and are
    packed into exact profiles when there is not."""

    def initial(self, model: GpuModel) -> Layout:
        """Layout every GPU starts with."""
        ...

    def plan(
        self, model: GpuModel, idle: Sequence[tuple[int, Layout]], missing: Mapping[str, int], recent: Mapping[str, float]
    ) -> list[Reshape]:
        """Reshapes of idle GPUs (id, current layout) for the ``missing`` instance counts."""
        ...


def _supply(layout: Layout, missing: Mapping[str, int]) -> int:
    have = Counter(layout)
    return sum(min(have[p], n) for p, n in missing.items())


class StaticStrategy:
    """A fixed layout on every GPU; never reshapes."""

    oversize = "any"

    def __init__(self, which: str) -> None:
        self.which = which
        self.name = f"static-{which}"

    def initial(self, model: GpuModel) -> Layout:
        return static_layout(model, self.which)

    def plan(
        self, model: GpuModel, idle: Sequence[tuple[int, Layout]], missing: Mapping[str, int], recent: Mapping[str, float]
    ) -> list[Reshape]:
        return []


class GreedyStrategy:
    """Idle GPUs in order, each to the geometry supplying the most missing profiles."""

    name = "greedy"
    oversize = "never"

    def initial(self, model: GpuModel) -> Layout:
        return static_layout(model, "balanced")

    def plan(
        self, model: GpuModel, idle: Sequence[tuple[int, Layout]], missing: Mapping[str, int], recent: Mapping[str, float]
    ) -> list[Reshape]:
        need = Counter({p: n for p, n in missing.items() if n > 0})
        out: list[Reshape] = []
        layouts = usable_layouts(model)
        for gpu, current in idle:
            if not need:
                break
            best = max(layouts, key=lambda l: _supply(l, need))
            if _supply(best, need) <= _supply(current, need):
                continue
            if tuple(sorted(best)) != tuple(sorted(current)):
                out.append(Reshape(gpu, best))
            need -= Counter(best)
        return out


class GpupackStrategy:
    """Fewest reshapes for the missing profiles; leftovers matched to the recent request mix."""

    name = "gpupack"
    oversize = "adaptive"

    def initial(self, model: GpuModel) -> Layout:
        return static_layout(model, "balanced")

    def _leftover_value(self, model: GpuModel, layout: Layout, need: Counter[str], recent: Mapping[str, float]) -> float:
        left = Counter(layout) - need
        # Value a spare instance by how often its profile has been asked lately, times its
        # size: big spare instances that nobody asks for are the fragmentation to avoid.
        return sum(n * recent.get(p, 0.0) * model.profile(p).compute_slices for p, n in left.items())

    def plan(
        self, model: GpuModel, idle: Sequence[tuple[int, Layout]], missing: Mapping[str, int], recent: Mapping[str, float]
    ) -> list[Reshape]:
        return list(self.reshapes(model, idle, missing, recent))

    def reshapes(
        self, model: GpuModel, idle: Sequence[tuple[int, Layout]], missing: Mapping[str, int], recent: Mapping[str, float]
    ) -> Iterator[Reshape]:
        """:meth:`plan`'s reshapes one at a time, in the same order.

        Each reshape costs a pass over the idle GPUs, and a plan for a large backlog holds
        as many reshapes as there are idle GPUs; a caller that takes the first acceptable
        reshape (the live planner, per pod) stops after one pass instead of paying for the
        whole plan."""
        need = Counter({p: n for p, n in missing.items() if n > 0})
        layouts = usable_layouts(model)
        pool = list(idle)
        while need and pool:
            # What a layout would supply and leave spare depends on the layout alone, and
            # idle GPUs cut alike differ only in their index, where the lowest wins: so each
            # layout is scored once a pass, and only the first GPU of each current layout is
            # weighed (an idle pool of 1,600 GPUs holds a handful of distinct layouts).
            scored = [(layout, _supply(layout, need), self._leftover_value(model, layout, need, recent))
                      for layout in layouts]
            weighed: set[Layout] = set()
            best_key: tuple[float, ...] | None = None
            best: tuple[int, Layout] | None = None
            for i, (gpu, current) in enumerate(pool):
                if current in weighed:
                    continue
                weighed.add(current)
                cur_supply = _supply(current, need)
                cur_value = self._leftover_value(model, current, Counter(), recent)
                for layout, supply, spare_value in scored:
                    if supply <= cur_supply:
                        continue
                    # Most demand covered, then most useful spares, then the idle GPU whose
                    # current layout is least useful to lose, then the lowest index.
                    key = (supply, spare_value, -cur_value, -i)
                    if best_key is None or key > best_key:
                        best_key, best = key, (i, layout)
            if best is None:
                break
            i, layout = best
            gpu, _ = pool.pop(i)
            yield Reshape(gpu, layout)
            need -= Counter(layout)


def make_strategy(name: str) -> LayoutStrategy:
    """``static-balanced``, ``static-1g``, ``static-whole``, ``greedy`` or ``gpupack``."""
    if name in ("static-balanced", "static-1g", "static-whole"):
        return StaticStrategy(name.removeprefix("static-"))
    if name == "greedy":
        return GreedyStrategy()
    if name == "gpupack":
        return GpupackStrategy()
    raise ValueError(f"unknown MIG strategy {name!r}; choose one of {', '.join(MIG_STRATEGIES)}")


MIG_STRATEGIES: tuple[str, ...] = ("static-balanced", "static-1g", "static-whole", "greedy", "gpupack")
