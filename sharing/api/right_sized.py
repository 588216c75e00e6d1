"""The ``gpupack.io/right-sized-from`` annotation: what the webhook changed when it sized a pod from use.

Right-sizing ``Initial`` (and ``Recreate``, whose evicted pods come back through the same door)
replaces a container's ``gpupack.io/gpu-milli`` and ``gpupack.io/gpu-memory`` with its workload's
recommendation before the webhook decides the pod (``sharing.admission.right_sizing``). The
container's request is then rewritten into a device-plugin resource or a claim like any other, so
the original request would be lost; this record keeps it, beside what was given and which
recommendation (name, generation, ``lastUpdateTime``) said so. Users read it to see why their pod
got less than it asked; the Recreate updater reads it to compare a pod with a newer recommendation.

One JSON object, compact, keys sorted (as ``sharing.api.allocation`` writes its record)::

    {"computeOvercommit":1.5,"containers":[{"accountedMilli":80,"askedMemoryBytes":null,"askedMilli":1000,
      "memoryBytes":21474836480,"milli":120,"name":"main"}],"generation":1,"recommendation":"deployment-web",
      "updated":"2026-12-04T17:00:00Z","version":"v1"}

``askedMemoryBytes`` is null when the container asked for no ``gpupack.io/gpu-memory`` (the
namespace's SharingPolicy default applied then). ``milli`` is the recommendation's, the compute the
container is predicted to use; ``accountedMilli`` what shared placement counts for it,
``ceil(milli / computeOvercommit)`` (``sharing.rules.right_sizing.accounted_milli``), the
namespace's compute over-commit when it was sized. Both are absent from records written before them,
which read as no over-commit (``accountedMilli`` = ``milli``, ``computeOvercommit`` 1.0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from sharing.api.json_records import record_text, versioned_record
from sharing.api.keys import RIGHT_SIZED_ANNOTATION

VERSION: Final = "v1"


class RightSizedError(ValueError):
    """A ``gpupack.io/right-sized-from`` annotation that cannot be read; the message says why."""


@dataclass(frozen=True)
class SizedContainer:
    """One container the webhook sized: what it asked for and what it was given."""

    name: str
    asked_milli: int
    asked_memory_bytes: int | None
    milli: int
    """The recommendation's: the compute the container is predicted to use."""
    memory_bytes: int
    accounted_milli: int | None = None
    """What shared placement counts for it (module docstring); None: ``milli``."""

    @property
    def accounted(self) -> int:
        return self.milli if self.accounted_milli is None else self.accounted_milli


@dataclass(frozen=True)
class RightSizedFrom:
    """The record: the recommendation that sized the pod, and its containers."""

    recommendation: str
    generation: int
    updated: str | None
    containers: tuple[SizedContainer, ...]
    compute_overcommit: float = 1.0
    """The namespace's ``rightSizing.computeOvercommit`` when the pod was sized."""

    def to_annotation(self) -> str:
        """The annotation's text."""
        record: dict[str, Any] = {
            "version": VERSION, "recommendation": self.recommendation, "generation": self.generation,
            "updated": self.updated, "computeOvercommit": self.compute_overcommit,
            "containers": [
                {"name": c.name, "askedMilli": c.asked_milli, "askedMemoryBytes": c.asked_memory_bytes,
                 "milli": c.milli, "accountedMilli": c.accounted, "memoryBytes": c.memory_bytes}
                for c in self.containers
            ],
        }
        return record_text(record)

    @classmethod
    def from_annotation(cls, text: object) -> RightSizedFrom:
        """The record in ``text``; :class:`RightSizedError` naming the first problem otherwise."""
        raw = versioned_record(text, RIGHT_SIZED_ANNOTATION, RightSizedError, VERSION)
        name, generation, updated = raw.get("recommendation"), raw.get("generation"), raw.get("updated")
        if not isinstance(name, str) or not name:
            raise RightSizedError(f"{RIGHT_SIZED_ANNOTATION}: recommendation is not a name")
        if not isinstance(generation, int) or not _count(generation):
            raise RightSizedError(f"{RIGHT_SIZED_ANNOTATION}: generation is not a non-negative integer")
        if updated is not None and not isinstance(updated, str):
            raise RightSizedError(f"{RIGHT_SIZED_ANNOTATION}: updated is not a time")
        overcommit = raw.get("computeOvercommit", 1.0)
        if (not isinstance(overcommit, (int, float)) or isinstance(overcommit, bool)
                or not 1.0 <= overcommit <= 4.0):
            raise RightSizedError(f"{RIGHT_SIZED_ANNOTATION}: computeOvercommit {overcommit!r} is not a number "
                                  "in 1.0..4.0")
        items = raw.get("containers")
        if not isinstance(items, list) or not items:
            raise RightSizedError(f"{RIGHT_SIZED_ANNOTATION}: containers is not a non-empty list")
        return cls(name, generation, updated, tuple(_container(item, i) for i, item in enumerate(items)),
                   float(overcommit))


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _container(item: object, index: int) -> SizedContainer:
    where = f"{RIGHT_SIZED_ANNOTATION}: containers[{index}]"
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise RightSizedError(f"{where} is not an object with a name")
    fields = ("askedMilli", "milli", "memoryBytes")
    bad = next((f for f in fields if not _count(item.get(f))), None)
    asked_memory, accounted = item.get("askedMemoryBytes"), item.get("accountedMilli")
    if bad is None and asked_memory is not None and not _count(asked_memory):
        bad = "askedMemoryBytes"
    if bad is None and accounted is not None and not _count(accounted):
        bad = "accountedMilli"
    if bad is not None:
        raise RightSizedError(f"{where}.{bad} is not a non-negative integer")
    return SizedContainer(item["name"], item["askedMilli"], asked_memory, item["milli"], item["memoryBytes"],
                          accounted)


__all__ = ["VERSION", "RightSizedError", "RightSizedFrom", "SizedContainer"]
