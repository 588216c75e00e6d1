"""The node's pool as published, and the writes that turn it into the pool wanted (pure).

The API's rule (``k8s.io/api/resource/v1``, ``ResourcePool.Generation``): whenever
a driver changes anything in a pool it must change the generation in *every*
slice of it, and kube-scheduler only considers the slices of the highest
generation, once it has seen ``resourceSliceCount`` of them. So:

* the pool is **up to date** when the published slices are exactly the wanted
  ones by name, each with the wanted content, all at one generation and with
  the wanted slice count: then nothing is written (a node whose GPUs do not
  change costs the API server nothing);
* otherwise the new generation is one more than the highest published (1 for a
  new pool), and every wanted slice is written at it: created if missing,
  replaced if its content changed, and otherwise only its ``pool`` (generation
  and count) patched, a few bytes instead of the slice; surplus slices are
  deleted last, when the scheduler already ignores them (an older generation).

Content is compared by value, not by text: the API server stores quantities in
canonical form (``1000`` reads back as ``1k``), so quantities are compared as
numbers (``mig.units.parse_quantity``). Everything else must match exactly,
owner references included; a slice someone else edited is rewritten.
Every replace and patch carries the ``resourceVersion`` it was planned from, so
a concurrent writer makes it fail (409) rather than be overwritten.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mig.errors import MigError
from mig.units import parse_quantity
from sharing.dra import wire
from sharing.dra.model import ResourceSlice

QUANTITY_KEYS = frozenset({"value", "default", "min", "max", "step"})
"""Keys whose string values are quantities in what gpupack publishes (capacities, counters, request policies)."""


def canonical(value: Any, key: str = "") -> Any:
    """``value`` with every quantity as a number, so equal slices compare equal however they were spelt."""
    if isinstance(value, Mapping):
        return {k: canonical(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    if key in QUANTITY_KEYS and isinstance(value, str):
        try:
            return parse_quantity(value)
        except MigError:  # not a quantity after all: compared as text
            return value
    return value


def content(body: Mapping[str, Any]) -> Any:
    """What a slice says, less its pool's generation and count: the spec and the owner references."""
    spec = dict(body.get("spec") or {})
    pool = dict(spec.get("pool") or {})
    pool.pop("generation", None)
    pool.pop("resourceSliceCount", None)
    spec["pool"] = pool
    owners = [{k: o.get(k) for k in ("apiVersion", "kind", "name", "uid", "controller")}
              for o in (body.get("metadata") or {}).get("ownerReferences") or [] if isinstance(o, Mapping)]
    return canonical({"spec": spec, "owners": owners})


@dataclass(frozen=True)
class Published:
    """One slice as the API server holds it."""

    name: str
    resource_version: str
    generation: int
    slice_count: int
    content: Any

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Published:
        meta = obj.get("metadata") or {}
        pool = (obj.get("spec") or {}).get("pool") or {}
        return cls(str(meta.get("name", "")), str(meta.get("resourceVersion", "")), int(pool.get("generation") or 0),
                   int(pool.get("resourceSliceCount") or 0), content(obj))


@dataclass(frozen=True)
class Plan:
    """The writes that publish ``slices`` at ``generation``."""

    generation: int
    slices: tuple[ResourceSlice, ...]
    create: tuple[wire.ResourceSliceJSON, ...] = ()
    replace: tuple[wire.ResourceSliceJSON, ...] = ()
    """Bodies carry the ``resourceVersion`` they replace."""
    repool: tuple[tuple[str, dict[str, Any]], ...] = ()
    """(slice, merge patch of its pool and ``resourceVersion``): content unchanged."""
    delete: tuple[str, ...] = ()

    @property
    def writes(self) -> int:
        return len(self.create) + len(self.replace) + len(self.repool) + len(self.delete)


def up_to_date(wanted: Sequence[ResourceSlice], published: Mapping[str, Published]) -> bool:
    if {s.name for s in wanted} != set(published):
        return False
    if len({p.generation for p in published.values()}) > 1:
        return False
    return all(published[s.name].slice_count == s.slice_count
               and published[s.name].content == content(wire.slice_json(s)) for s in wanted)


def plan(wanted: Sequence[ResourceSlice], published: Mapping[str, Published]) -> Plan | None:
    """The writes from ``published`` to ``wanted`` (whose generation is ignored); None when up to date."""
    if up_to_date(wanted, published):
        return None
    generation = max((p.generation for p in published.values()), default=0) + 1
    slices = tuple(replace(s, generation=generation) for s in wanted)
    create: list[wire.ResourceSliceJSON] = []
    replaced: list[wire.ResourceSliceJSON] = []
    repool: list[tuple[str, dict[str, Any]]] = []
    for item in slices:
        body = wire.slice_json(item)
        old = published.get(item.name)
        if old is None:
            create.append(body)
        elif old.content != content(body):
            body["metadata"]["resourceVersion"] = old.resource_version  # type: ignore[typeddict-unknown-key]
            replaced.append(body)
        else:
            repool.append((item.name, {"metadata": {"resourceVersion": old.resource_version},
                                       "spec": {"pool": {"generation": generation,
                                                         "resourceSliceCount": item.slice_count}}}))
    names = {s.name for s in slices}
    delete = tuple(sorted(n for n in published if n not in names))
    return Plan(generation, slices, tuple(create), tuple(replaced), tuple(repool), delete)
