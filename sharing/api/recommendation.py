"""A ``GPURecommendation`` object as its readers need it: one compact, typed reading.

The controller's recommender writes one ``GPURecommendation`` per workload (``sharing.api.crd``,
named by ``sharing.api.workload.recommendation_name``). Whoever acts on it (the webhook sizing a new
pod, the Recreate updater) needs only: which workload it is for, whether the recommendation is
provided (condition :data:`PROVIDED_CONDITION` ``True``: the recommender has seen enough history),
and per container the compute and memory it recommends. :func:`read_recommendation` validates the
object with the typed model (so a reader never acts on a value the CRD schema would refuse) and
keeps that much, in bytes and milli, so a cache of thousands of them stays small.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from sharing.api.crd import GPURecommendation
from sharing.api.fields import as_map
from sharing.api.workload import WorkloadRef

PROVIDED_CONDITION: Final = "RecommendationProvided"
"""Condition type of a GPURecommendation: ``True`` once the recommendation may be acted on."""


class RecommendationError(ValueError):
    """A GPURecommendation object that cannot be read; the message names the object and the problem."""


@dataclass(frozen=True)
class RecommendedSize:
    """One container's recommendation: predicted compute (milli of one GPU, 0..1000) and a memory limit."""

    container: str
    milli: int
    memory_bytes: int


@dataclass(frozen=True)
class RecommendationReading:
    """What acting on a recommendation needs of the object."""

    namespace: str
    name: str
    generation: int
    target: WorkloadRef
    provided: bool
    """Condition :data:`PROVIDED_CONDITION` is ``True``."""
    sizes: tuple[RecommendedSize, ...] = ()
    updated: str | None = None
    """``status.lastUpdateTime`` as written (RFC 3339), None when absent."""

    def size_of(self, container: str) -> RecommendedSize | None:
        """The recommendation for ``container``, if the object has one."""
        return next((s for s in self.sizes if s.container == container), None)


def read_recommendation(obj: Mapping[str, Any]) -> RecommendationReading:
    """The reading of a ``GPURecommendation`` object (a dict as the API server sends it);
    :class:`RecommendationError` when it does not validate against the typed model."""
    meta = as_map(obj.get("metadata"))
    where = f"GPURecommendation {meta.get('namespace')!s:.64}/{meta.get('name')!s:.253}"
    namespace = meta.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise RecommendationError(f"{where}: metadata.namespace is missing (the object is namespaced)")
    generation = meta.get("generation", 0)
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
        raise RecommendationError(f"{where}: metadata.generation {generation!r:.32} is not a non-negative integer")
    try:
        model = GPURecommendation.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        location = ".".join(str(part) for part in first["loc"])
        raise RecommendationError(f"{where}: {location}: {first['msg']}") from None
    status = model.status
    provided = status is not None and any(
        c.type == PROVIDED_CONDITION and c.status == "True" for c in status.conditions)
    sizes = tuple(RecommendedSize(c.container_name, c.gpu_milli, c.gpu_memory_bytes)
                  for c in (status.containers if status is not None else ()))
    updated = status.last_update_time if status is not None else None
    return RecommendationReading(
        namespace=namespace,
        name=model.metadata.name,
        generation=generation,
        target=WorkloadRef(namespace, model.spec.target_ref.kind, model.spec.target_ref.name),
        provided=provided,
        sizes=sizes,
        updated=updated.isoformat().replace("+00:00", "Z") if updated is not None else None,
    )


__all__ = ["PROVIDED_CONDITION", "RecommendationError", "RecommendationReading", "RecommendedSize",
           "read_recommendation"]
