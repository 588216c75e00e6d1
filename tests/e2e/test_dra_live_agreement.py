"""The live DRA path places what the simulator's DRA model places (``gpupack.demo.agreement``), at a size
where capacity runs out: one node of two MPS-shared A100s and more 100-450 milli pods than they hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupack.demo.agreement import compare, live_placements, model_placements, shared_pods
from gpupack.demo.stack import DemoNode

NODES = (DemoNode("a100-x", "A100-80GB", 2, sharing="mps"),)


def test_live_dra_placements_agree_with_the_dra_model(control_plane: Any, tmp_path: Path) -> None:
    pods = shared_pods(12, seed=5)
    assert sum(p.milli for p in pods) > 2 * 1000  # more than the node holds: some pods must wait
    live = live_placements(tmp_path, NODES, pods, "gpupack", lambda line: None)
    model = model_placements(NODES, pods, "gpupack")
    result = compare(NODES, pods, live, model)
    assert result.placed_by_one_only == ()
    assert 0 < result.placed_live < len(pods)
    assert result.allocation_live == result.allocation_model
    assert {p: live[p] for p in live if live[p]} == {p: model[p] for p in model if model[p]}
