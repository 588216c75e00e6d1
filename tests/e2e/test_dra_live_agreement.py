"""The live DRA path places what the simulator's DRA model places (``gpupack.demo.agreement``), at a size
where capacity runs out: two nodes of two MPS-shared A100s and 64 cores each, and more pods than they
hold. The pods ask CPU too, and every third asks for no GPU at all: labelled for the DRA pool, the
webhook gates it and the controller's packing engine places it, as the model's ``cpu_pods="engine"``
does; here the CPU runs out before the GPUs, so where those pods go decides which GPUs stay usable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupack.demo.agreement import NO_GPU, compare, live_placements, mixed_pods, model_placements
from gpupack.demo.stack import DemoNode

NODES = (DemoNode("a100-x", "A100-80GB", 2, sharing="mps"), DemoNode("a100-y", "A100-80GB", 2, sharing="mps"))


def test_live_dra_placements_agree_with_the_dra_model(control_plane: Any, tmp_path: Path) -> None:
    pods = mixed_pods(18, seed=5)
    assert sum(p.cpu_milli for p in pods) > 2 * 64_000  # more CPU than the nodes have: some pods must wait
    live = live_placements(tmp_path, NODES, pods, "gpupack", lambda line: None)
    model = model_placements(NODES, pods, "gpupack")
    result = compare(NODES, pods, live, model)
    assert result.placed_by_one_only == ()
    assert 0 < result.placed_live < len(pods)
    assert result.allocation_live == result.allocation_model
    assert {p: live[p] for p in live if live[p]} == {p: model[p] for p in model if model[p]}
    cpu_only = [p.name for p in pods if not p.milli]
    placed_cpu_only = [p for p in cpu_only if live[p]]
    assert placed_cpu_only and all(live[p][1] == NO_GPU for p in placed_cpu_only)  # type: ignore[index]
    assert {live[p][0] for p in placed_cpu_only} <= {n.name for n in NODES}  # type: ignore[index]
