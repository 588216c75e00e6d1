"""The free-capacity index finds what a look at every node finds, as the ledger changes."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from controller.planning.capacity import FreeCapacity

PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb")


def brute_force(ledger: FreeCapacity, need: Counter[str], allowed: set[str]) -> str | None:
    """The planner's rule over every node: every instance free, fewest free instances, then name."""
    fitting = [n for n in ledger.mig if n in allowed and all(ledger.mig_free(n)[p] >= k for p, k in need.items())]
    return min(fitting, key=lambda n: (sum(ledger.mig_free(n).values()), n)) if fitting else None


@pytest.mark.parametrize("seed", range(10))
def test_best_fit_from_the_index_equals_a_scan_of_every_node(seed: int) -> None:
    rng = random.Random(seed)
    ledger = FreeCapacity()
    for n in range(rng.randint(1, 40)):
        ledger.mig[f"n{n:02d}"] = +Counter({p: rng.randint(0, 3) for p in PROFILES})
    names = sorted(ledger.mig)
    for _ in range(200):
        need = Counter(rng.choice(PROFILES) for _ in range(rng.choice([1, 1, 2])))
        allowed = {n for n in names if rng.random() < 0.8}
        expected = brute_force(ledger, need, allowed)
        assert ledger.best_mig(need, allowed.__contains__) == expected
        if expected is not None and rng.random() < 0.7:
            ledger.take_mig(expected, tuple(need.elements()))
        elif rng.random() < 0.3:
            ledger.destroy_mig(rng.choice(names), [rng.choice(PROFILES)])


def test_a_taken_instance_leaves_the_index() -> None:
    ledger = FreeCapacity(mig={"a": Counter({"1g.10gb": 1}), "b": Counter({"1g.10gb": 2})})
    need = Counter({"1g.10gb": 1})
    assert ledger.best_mig(need, lambda _: True) == "a"  # best fit: the fewest free instances
    ledger.take_mig("a", ("1g.10gb",))
    assert ledger.best_mig(need, lambda _: True) == "b"
    ledger.take_mig("b", ("1g.10gb",))
    ledger.take_mig("b", ("1g.10gb",))
    assert ledger.best_mig(need, lambda _: True) is None
