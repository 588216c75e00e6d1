"""The DRA pool's MIG GPUs as this cycle sees them, for the engine's choice of a placement.

A MIG-enabled GPU of a DRA node offers (``sharing.dra.mig_devices``, through
the agent's ``node.advertising.dra_offers``) its existing instances as
themselves and, where its SharingPolicy lets it be reshaped, every placement of
an allowed profile that overlaps none of them. :func:`mig_gpus` builds those
GPUs from the cluster (what is held, promised, faulted; what the policy lets the
agent create); the choice among them is ``sharing.dra.mig_choice`` (``choose``,
``place_all``), which the simulator's DRA model on MIG GPUs calls too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

from controller.state.dra_usage import Hold
from controller.state.snapshot import Node
from mig.model import PlacedInstance
from sharing.dra.mig_choice import MigGpu
from sharing.rules.node_policy import NodePolicy
from sharing.rules.reshape_gate import reshape_gate


def creation_rule(policy: NodePolicy | None, now: datetime) -> Callable[[str], bool]:
    """The agent's rule for offering new placements (``node.advertising.dra.reshape_blocked``): the
    gate for a layout gpupack chooses (``sharing.rules.reshape_gate``: a SharingPolicy selects the
    node, pins no static layout, has not frozen it, its window is open); then only its allowed profiles."""
    if not reshape_gate(policy, now, dynamic_layout=True).allowed or policy is None:  # None: refused; typed
        return lambda profile: False
    return policy.allows_profile


def mig_gpus(nodes: Iterable[Node], holds: Iterable[Hold], policies: Mapping[str, NodePolicy],
             now: datetime) -> list[MigGpu]:
    """The MIG GPUs of ``nodes`` with what ``holds`` take of them."""
    held: dict[tuple[str, int], set[PlacedInstance]] = {}
    models = {n.name: n.model for n in nodes}
    whole: set[tuple[str, int]] = set()
    """GPUs a claim holds whole (``DRA_WHOLE_GPU``; the plugin gives it the full-size instance): nothing
    else fits on them."""
    for hold in holds:
        if hold.device.kind == "gpu":
            whole.add((hold.node, hold.device.gpu))
            continue
        instance = hold.device.placed(models.get(hold.node))
        if instance is not None:
            held.setdefault((hold.node, hold.device.gpu), set()).add(instance)
    out: list[MigGpu] = []
    for node in sorted(nodes, key=lambda n: n.name):
        if node.model is None:
            continue
        rule = creation_rule(policies.get(node.name), now)
        for gpu in node.gpus:
            if not gpu.mig_enabled or not gpu.healthy or (node.name, gpu.index) in whole:
                continue
            taken = held.get((node.name, gpu.index), set())
            spare = [i for i in gpu.instances if i not in taken and i not in gpu.unhealthy_instances]
            occupied = sorted(set(gpu.instances) | taken)
            out.append(MigGpu(node.name, gpu.index, node.model, occupied, sorted(spare), rule))
    return out
