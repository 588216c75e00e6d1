"""The order in which a shared (MPS / time-slicing) pod is placed under node-wide replicas.

One implementation, :func:`place_shared`, called by the live planner
(``controller.planning.planner``) and by the simulator's product model
(``sharing.simulator.product``). Each brings its own :class:`SharedSteps`
over its own state (the planner's cycle ledger and ``SharedPlacer``, the
model's arrays), so the order of the steps (``sharing.packing.node_sharing``,
rules 1 and 2) is written once:

1. **a free replica** for the pod: of its own size (:data:`EXACT`) for a policy
   that :func:`~sharing.packing.node_sharing.splits_before_wasting`, else the one
   that wastes the least (:data:`LEAST_WASTE`);
2. **capacity being created** that holds it (live, nodes switching to its mode;
   the model creates capacity at once and has none);
3. **a split of an idle node**: for a policy that splits before it wastes, a
   small split only; when there is none, such a policy takes
4. **a larger free replica** (:data:`LARGER`, the least-waste choice), and only
   when there is none makes
5. **any split**.

The drivers differ in what they can see, not in the order: how many replicas
a split gets is :meth:`SharedSteps.split`'s, and both size it with
``sharing.rules.replicas.replicas_for_demand``, the planner for the pod and the
waiting pods behind it, the model (which sees no backlog) for the pod alone.
"""

from __future__ import annotations

from typing import Final, Literal, Protocol, TypeVar

from sharing.packing.node_sharing import splits_before_wasting

ReplicaStep = Literal["exact", "least-waste", "larger"]
EXACT: Final[ReplicaStep] = "exact"
"""A free replica of a node split into the pod's own size (``node_sharing.exact_replicas``)."""
LEAST_WASTE: Final[ReplicaStep] = "least-waste"
"""The free replica that wastes the least (``node_sharing.waste_first``), before any split."""
LARGER: Final[ReplicaStep] = "larger"
"""The least-waste choice again, taken once no small split was found: a replica larger than the pod's own size."""

Choice = TypeVar("Choice")
Outcome = TypeVar("Outcome", covariant=True)


class SharedSteps(Protocol[Choice, Outcome]):
    """One driver's steps for one pod, each over the driver's own state."""

    def replica(self, step: ReplicaStep) -> Outcome | None:
        """The pod in the free replica ``step`` allows that the engine's policy chooses (committed),
        or None when there is none."""
        ...

    def coming(self) -> Outcome | None:
        """The pod counted against capacity already being created for its mode, or None."""
        ...

    def idle_split(self, small_only: bool) -> Choice | None:
        """The idle node the policy would split for the pod (not committed); ``small_only``: only a
        small split (``node_sharing.small_splits``). None when there is none."""
        ...

    def split(self, choice: Choice) -> Outcome:
        """The split of ``choice`` for the pod, sized by ``replicas.replicas_for_demand`` (committed)."""
        ...


def place_shared(steps: SharedSteps[Choice, Outcome], policy: object) -> Outcome | None:
    """The pod placed by the first step that finds room (module docstring); None when none does."""
    split_first = splits_before_wasting(policy)
    placed = steps.replica(EXACT if split_first else LEAST_WASTE)
    if placed is None:
        placed = steps.coming()
    if placed is not None:
        return placed
    chosen = steps.idle_split(small_only=split_first)
    if chosen is None and split_first:
        placed = steps.replica(LARGER)
        if placed is not None:
            return placed
        chosen = steps.idle_split(small_only=False)
    return None if chosen is None else steps.split(chosen)
