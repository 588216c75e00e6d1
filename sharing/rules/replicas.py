"""How many replicas a shared GPU gets: the device-plugin backend's replica rule, in one place.

The stock NVIDIA device plugin shares a GPU by MPS or time-slicing as ``r``
equal replicas, and ``r`` is the same for every GPU of a node (its per-device
sharing fields are ignored on load; see docs/simulator.md, "Product model").
A container asking ``milli`` of a GPU's compute and ``memory`` bytes fits a
replica when ``r * milli <= 1000`` and ``r * memory <= GPU memory``
(:func:`fits_replicas`; a pod's containers each take one, :func:`fits_split`).

Which ``r`` a node is split into:

- the most a pod fits within a policy's bounds is its *own size*
  (:func:`most_replicas`): the replica that wastes the least of a GPU for it;
- an idle node split for a pod gets the count that serves the most of the
  demand it is split for, the pod and those waiting behind it
  (:func:`replicas_for_demand`); for a pod alone that is its own size.

The bounds are a SharingPolicy's ``replicas.min`` / ``replicas.max``, merged per
node by ``sharing.rules.node_policy`` (the narrowest range), ``1..MAX_REPLICAS``
where no policy applies. Nothing moves a shared node's ``r`` from measured GPU use: the
loop that did was measured on a production trace and removed (benchmarks/controller.md,
"The replica loop on real use"). The DRA backend has no replicas: a claim consumes its share of
the GPU's capacity (``sharing.dra.share_policy``).

A request above half a GPU fits only ``r = 1``: a GPU "shared" into one
replica, which is a whole GPU under another resource name on a node that then
cannot take whole-GPU pods. gpupack asks for a plain whole GPU instead
(:func:`takes_whole_gpu`), so such pods go where whole-GPU pods go.

The webhook (``sharing.admission.options``), the controller
(``controller.planning.planner``) and the simulator's product model
(``sharing.simulator.product``) all call these functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Final

MAX_MILLI: Final = 1000
"""A whole GPU's compute, in the request API's unit."""
MAX_REPLICAS: Final = 8
"""Largest replica count gpupack gives a node (SharingPolicy's default bound, ``replicas.max``)."""

Ask = tuple[int, int | None]
"""One GPU container's request: compute milli, and memory bytes (None: not asked)."""


def fits_replicas(replicas: int, milli: int, memory_bytes: int | None, gpu_memory_bytes: int) -> bool:
    """One container in a replica of a GPU split into ``replicas`` (memory ``None``: not asked)."""
    return replicas * milli <= MAX_MILLI and (memory_bytes is None or memory_bytes * replicas <= gpu_memory_bytes)


def fits_split(replicas: int, asks: Iterable[Ask], gpu_memory_bytes: int) -> bool:
    """Every container of a pod (``asks``, one each) in a replica of GPUs split into ``replicas``."""
    return all(fits_replicas(replicas, milli, memory, gpu_memory_bytes) for milli, memory in asks)


def most_replicas(asks: Sequence[Ask], gpu_memory_bytes: int, minimum: int = 1, maximum: int = MAX_REPLICAS,
                  admits: Callable[[int], bool] | None = None) -> int:
    """The most replicas in ``[minimum, maximum]`` a GPU of ``gpu_memory_bytes`` can be split into
    with every one of ``asks`` still fitting one (the pod's own size); 0 when none fits.

    ``admits(r)``: whether the pod may use the node once split into ``r``, beyond this rule
    (live: its node affinity on the labels the split gives the node)."""
    return next((r for r in range(maximum, minimum - 1, -1)
                 if fits_split(r, asks, gpu_memory_bytes) and (admits is None or admits(r))), 0)


def largest_replicas(milli: int, maximum: int = MAX_REPLICAS) -> int:
    """:func:`most_replicas` of one container asking ``milli`` and no memory, at least 1 (a request
    above half a GPU fits only a GPU "split" into one replica)."""
    if milli <= 0:
        raise ValueError(f"milli must be positive, got {milli}")
    return max(1, most_replicas(((milli, None),), 0, maximum=maximum))


def replicas_for_demand(
    demand: Sequence[Sequence[Ask]],
    *,
    gpus: int,
    gpu_memory_bytes: int,
    minimum: int = 1,
    maximum: int = MAX_REPLICAS,
    admits: Callable[[int, int], bool] | None = None,
) -> int:
    """The replica count an idle node of ``gpus`` GPUs is split into for ``demand``; 0 when its
    first pod fits no count in ``[minimum, maximum]``.

    ``demand``: the pod the node is split for, then the pods waiting after it that the split
    could serve, oldest first, each as its containers' asks. The count is one the first pod
    fits, and the one whose replicas serve the most of the demand: the pods in order, as many
    as the node's ``gpus * r`` replicas hold (the first that finds too few left ends the
    count; one that does not fit ``r`` is passed over), counted in the milli they ask. Ties
    go to the larger count (less replica waste), so a pod alone, all the product model sees,
    gets its own size (:func:`most_replicas`).

    ``admits(i, r)``: whether ``demand[i]`` may use the node once split into ``r``, beyond the
    replica rule (live: its node affinity on the labels the split gives the node)."""

    def fits(index: int, replicas: int) -> bool:
        return fits_split(replicas, demand[index], gpu_memory_bytes) and (admits is None or admits(index, replicas))

    fitting = [r for r in range(maximum, minimum - 1, -1) if fits(0, r)]

    def served(replicas: int) -> int:
        room = gpus * replicas
        total = 0
        for index, asks in enumerate(demand):
            if len(asks) > room:
                break
            if fits(index, replicas):
                room -= len(asks)
                total += sum(milli for milli, _ in asks)
        return total

    return max(fitting, key=lambda r: (served(r), r), default=0)


def takes_whole_gpu(milli: int) -> bool:
    """A request no split of a GPU into two or more replicas can hold: it gets a whole GPU."""
    return 2 * milli > MAX_MILLI


def needs_whole_gpu(milli: int, memory_bytes: int | None, gpu_memory_bytes: int) -> bool:
    """No split into two or more replicas holds the container (compute, or memory on GPUs of
    ``gpu_memory_bytes``; 0: memory unknown, compute alone decides)."""
    if gpu_memory_bytes <= 0:
        return takes_whole_gpu(milli)
    return not fits_replicas(2, milli, memory_bytes, gpu_memory_bytes)


def replica_milli(replicas: int) -> float:
    """Compute one replica reserves, in milli (what a pod occupies, whatever it asked)."""
    return MAX_MILLI / replicas
