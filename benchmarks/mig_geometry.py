"""Benchmark of the MIG geometry engine (a script, not a test).

Measures:
  1. enumerating every maximal layout of every catalog model, cold (caches cleared);
  2. one million random fit checks (random model, 1..7 random profiles), with the
     engine's per-(model, multiset) cache warm as it is in a running webhook/controller,
     and the same checks with the cache disabled (every call searches).

Usage: python3 benchmarks/mig_geometry.py [--checks N] [--seed S]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time

from mig import geometry
from mig.catalog import all_models
from mig.geometry import fits, maximal_layouts


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checks", type=int, default=1_000_000, help="number of random fit checks (default 1,000,000)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    models = all_models()

    geometry._fits_cached.cache_clear()
    geometry._all_valid_multisets.cache_clear()
    geometry._maximal_for_geometry.cache_clear()
    start = time.perf_counter()
    total = sum(len(maximal_layouts(m)) for m in models)
    enumerate_s = time.perf_counter() - start
    print(f"machine: {machine()}")
    print(f"enumerate maximal layouts of {len(models)} models ({total} layouts), cold: {enumerate_s:.3f} s")

    rng = random.Random(args.seed)
    cases = []
    for _ in range(args.checks):
        model = rng.choice(models)
        cases.append((model, [rng.choice(model.profile_names) for _ in range(rng.randint(1, 7))]))

    def run(batch: list[tuple[object, list[str]]]) -> tuple[float, int]:
        yes = 0
        begin = time.perf_counter()
        for model, names in batch:
            if fits(model, names) is not None:  # type: ignore[arg-type]
                yes += 1
        return time.perf_counter() - begin, yes

    geometry._fits_cached.cache_clear()
    warm_s, yes = run(cases)
    print(f"{args.checks:,} random fit checks (cache warming up as it goes): {warm_s:.2f} s, "
          f"{warm_s / args.checks * 1e6:.2f} us/check, {yes / args.checks:.1%} fit")
    warm_again_s, _ = run(cases)
    print(f"same checks again, cache warm: {warm_again_s:.2f} s, {warm_again_s / args.checks * 1e6:.2f} us/check "
          f"({geometry._fits_cached.cache_info().currsize:,} distinct inputs cached)")

    sample = cases[: min(len(cases), 20_000)]
    per_call = []
    for model, names in sample:
        geometry._fits_cached.cache_clear()
        begin = time.perf_counter()
        fits(model, names)  # type: ignore[arg-type]
        per_call.append(time.perf_counter() - begin)
    print(f"uncached search ({len(sample):,} checks, cache cleared before each): "
          f"median {statistics.median(per_call) * 1e6:.1f} us, "
          f"p99 {statistics.quantiles(per_call, n=100)[98] * 1e6:.1f} us")


if __name__ == "__main__":
    main()
