"""The MIG layout engine's reshapes: the same choices as the plain search, one at a time.

``GpupackStrategy.reshapes`` scores each layout once a pass and weighs only the first
idle GPU of each current layout; the reference below is the plain search (every GPU,
every layout), so any shortcut that changed a choice would show here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from mig.catalog import get_model
from mig.model import GpuModel
from sharing.packing.mig_layouts import GpupackStrategy, Layout, Reshape, usable_layouts

A100 = get_model("A100-80GB")
LAYOUTS = usable_layouts(A100)
PROFILES = sorted({p for layout in LAYOUTS for p in layout})


def reference_plan(model: GpuModel, idle: Sequence[tuple[int, Layout]], missing: Mapping[str, int],
                   recent: Mapping[str, float]) -> list[Reshape]:
    """Every idle GPU against every layout, each pass: the search without shortcuts."""
    engine = GpupackStrategy()

    def supply(layout: Layout, need: Counter[str]) -> int:
        have = Counter(layout)
        return sum(min(have[p], n) for p, n in need.items())

    need = Counter({p: n for p, n in missing.items() if n > 0})
    pool = list(idle)
    out: list[Reshape] = []
    while need and pool:
        best_key: tuple[float, ...] | None = None
        best: tuple[int, Layout] | None = None
        for i, (_, current) in enumerate(pool):
            cur_value = engine._leftover_value(model, current, Counter(), recent)
            for layout in usable_layouts(model):
                if supply(layout, need) <= supply(current, need):
                    continue
                key = (supply(layout, need), engine._leftover_value(model, layout, need, recent), -cur_value, -i)
                if best_key is None or key > best_key:
                    best_key, best = key, (i, layout)
        if best is None:
            break
        i, layout = best
        gpu, _ = pool.pop(i)
        out.append(Reshape(gpu, layout))
        need -= Counter(layout)
    return out


idle_pools = st.lists(st.sampled_from(LAYOUTS), min_size=1, max_size=40).map(
    lambda layouts: [(gpu, layout) for gpu, layout in enumerate(layouts)])
demands = st.dictionaries(st.sampled_from(PROFILES), st.integers(0, 30), max_size=len(PROFILES))
mixes = st.dictionaries(st.sampled_from(PROFILES), st.floats(0, 5, allow_nan=False), max_size=len(PROFILES))


@settings(max_examples=150, deadline=None)
@given(idle_pools, demands, mixes)
def test_reshapes_choose_as_the_plain_search(idle: list[tuple[int, Layout]], missing: dict[str, int],
                                             recent: dict[str, float]) -> None:
    assert GpupackStrategy().plan(A100, idle, missing, recent) == reference_plan(A100, idle, missing, recent)


def test_reshapes_come_one_at_a_time() -> None:
    """A caller that takes the first reshape gets the plan's first without the rest being searched."""
    idle = [(gpu, ("7g.80gb",)) for gpu in range(200)]
    missing = {"1g.10gb": 1000}
    first = next(GpupackStrategy().reshapes(A100, idle, missing, {}))
    assert first == GpupackStrategy().plan(A100, idle, missing, {})[0]
    assert Counter(first.layout)["1g.10gb"] == 7


def test_a_pool_cut_alike_reshapes_the_lowest_index_first() -> None:
    idle = [(gpu, ("3g.40gb", "4g.40gb")) for gpu in (5, 6, 7)]
    plan = GpupackStrategy().plan(A100, idle, {"1g.10gb": 7}, {})
    assert [r.gpu for r in plan] == [5]
