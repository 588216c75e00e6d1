"""On MIG GPUs too, the live DRA path places what the simulator's DRA model places
(``gpupack.demo.agreement``, "MIG"): two nodes of two H100s in dynamic MIG mode and 64 cores each,
and more MIG pods than they hold, in GPU slices and in CPU. The live controller's choice (node by
``sharing.dra.mig_choice.place_pod``'s score, then GPU and placement), pinned in each claim and
allocated by kube-scheduler, is the model's, pod by pod, down to the placement's start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupack.demo.agreement import compare, live_placements, mig_claim_device, mig_model_placements, mig_pods
from gpupack.demo.stack import DemoNode
from mig.catalog import get_model
from sharing.dra.names import label, parse_device_name
from sharing.packing.mig_layouts import profile_for

NODES = (DemoNode("h100-m", "H100-80GB", 2), DemoNode("h100-n", "H100-80GB", 2))
H100 = get_model("H100-80GB")


def test_live_dra_mig_placements_agree_with_the_dra_mig_model(control_plane: Any, tmp_path: Path) -> None:
    pods = mig_pods(16, seed=3)
    slices = sum(profile_for(H100, p.milli).compute_slices for p in pods)
    assert slices > 4 * H100.compute_slices and sum(p.cpu_milli for p in pods) > 2 * 64_000  # some must wait
    live = live_placements(tmp_path, NODES, pods, "gpupack", lambda line: None, where_of=mig_claim_device)
    model = mig_model_placements(NODES, pods)
    result = compare(NODES, pods, live, model)
    assert result.placed_by_one_only == ()
    assert 0 < result.placed_live < len(pods)
    assert result.allocation_live == result.allocation_model
    assert {p: live[p] for p in live if live[p]} == {p: model[p] for p in model if model[p]}
    # Each pod got an instance of the profile the openb mapping gives its ask (the webhook's choice).
    asked = {p.name: profile_for(H100, p.milli).name for p in pods}
    for name, where in live.items():
        if where is not None:
            assert parse_device_name(where[1]).profile_label == label(asked[name]), (name, where)
