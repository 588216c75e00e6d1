"""``auto`` never waits on capacity only a repair could bring while another mode's can come (issue 33, item 5).

The demo's shape after an ECC fault: the only MPS node is degraded, and the H100s'
free MIG instances are all ``1g.10gb``, which a 10 GiB ask does not fit (it holds
9.75 GiB). Neither mode has capacity now; MPS wastes less, so ``auto`` recorded
``mps`` and the pod waited on a node no new pod may use, while the controller
could reshape an idle H100 for it.
"""

from __future__ import annotations

from typing import Any

from sharing.admission.inventory import build_inventory
from sharing.admission.options import Option, option_rank
from tests.unit.test_decision import A100, H100, mig_node, run, shared_node
from gpupack.testing.admission_reviews import gpu_container, make_pod

SMALL_MIG = [("1g.10gb", i, False) for i in range(7)]  # all idle, none fits a 10 GiB ask


def _mps_node(*, degraded: bool = False, unhealthy_gpu: bool = False) -> dict[str, Any]:
    node = shared_node("a100-a", "mps", 4, product=A100, gpus=1)
    if degraded:
        node["status"]["summary"] = {"degraded": True}
    if unhealthy_gpu:
        # A fault the device plugin withdraws the GPU for: the node is not degraded, the GPU is unhealthy.
        node["status"]["gpus"][0]["health"] = {"reason": "Xid79", "message": "fell off the bus", "xid": 79,
                                               "recovery": "ResetGpu", "withdrawn": True, "since": "2026-01-01T00:00:00Z"}
    return node


def _pod() -> dict[str, Any]:
    return make_pod(gpu_container("main", "200", "10Gi"))


def test_auto_does_not_pick_mps_when_the_only_mps_node_is_degraded() -> None:
    inventory = build_inventory([mig_node("h100-a", H100, SMALL_MIG), _mps_node(degraded=True)])
    decision = run(_pod(), inventory)
    assert decision.mode == "mig", decision.reason
    assert decision.containers[0].resource.startswith("nvidia.com/mig-")
    assert decision.gated and not decision.capacity_exists  # the controller reshapes the idle H100


def test_auto_does_not_pick_mps_when_the_mps_nodes_gpus_are_unhealthy() -> None:
    inventory = build_inventory([mig_node("h100-a", H100, SMALL_MIG), _mps_node(unhealthy_gpu=True)])
    (mps_node,) = [n for n in inventory.nodes if n.name == "a100-a"]
    assert not mps_node.degraded and not mps_node.gpus[0].healthy
    assert run(_pod(), inventory).mode == "mig"


def test_a_healthy_full_mps_node_still_wins_on_waste() -> None:
    """Replicas of a healthy node free up: waiting there is waiting for capacity that comes."""
    inventory = build_inventory([mig_node("h100-a", H100, SMALL_MIG), _mps_node()])
    assert run(_pod(), inventory).mode == "mps"


def test_a_degraded_mig_node_is_no_capacity_to_come_either() -> None:
    degraded_h100 = mig_node("h100-a", H100, SMALL_MIG)
    degraded_h100["status"]["summary"] = {"degraded": True}
    inventory = build_inventory([degraded_h100, _mps_node()])
    decision = run(make_pod(gpu_container("main", "200", "10Gi"), mode="mig"), inventory)
    assert decision.mode == "mig" and not decision.capacity_exists  # asked explicitly: it still gates
    assert run(_pod(), inventory).mode == "mps"


def test_option_rank_orders_now_then_can_come_then_waste() -> None:
    now = Option("mps", 0.9, True, ())
    later = Option("mig", 0.5, False, ())
    repair = Option("mps", 0.0, False, (), can_come=False)
    assert sorted([repair, later, now], key=option_rank) == [now, later, repair]
