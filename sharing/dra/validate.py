"""The checks gpupack runs on its ResourceSlices before publishing them.

Two kinds of rule, each problem naming the slice, the device or counter, and
the rule:

* the API server's (``resource.k8s.io/v1`` validation in Kubernetes v1.37, limits
  in ``sharing.dra.limits``): names are DNS labels or subdomains, a slice holds
  counter sets or devices but not both, at most 8 counter sets and 64 devices
  (128 when none consumes counters), 32 attributes and capacities per device,
  string attributes of at most 64 characters, request policies only on devices
  that allow multiple allocations and with ``min``/``max``/``default`` on the step;
* kube-scheduler's, which the API server cannot check because they span slices
  (the allocator ignores a pool that breaks them): one generation and slice count
  across the pool, device and counter-set names unique in the pool, every
  consumed counter defined by a counter set of the pool;

plus gpupack's own: the driver is ``gpu.gpupack.io``, every device has a
``kind`` the DeviceClasses know, and no device consumes more than its counter
set holds (such a device could never be allocated).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sharing.dra import limits, names
from sharing.dra.model import Capacity, CounterSet, Device, DraModelError, ResourceSlice


@dataclass(frozen=True)
class Problem:
    where: str
    rule: str

    def __str__(self) -> str:
        return f"{self.where}: {self.rule}"


class InvalidSlices(DraModelError):
    """Slices gpupack must not publish; ``problems`` lists every rule they break."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        lines = "\n".join(f"- {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) in the ResourceSlices gpupack would publish:\n{lines}")


def _label(where: str, what: str, value: str) -> list[Problem]:
    if names.is_dns_label(value):
        return []
    return [Problem(where, f"{what} {value!r} must be a DNS label (lower-case letters, digits and '-', "
                           f"starting and ending with a letter or digit, at most {limits.MAX_LABEL} characters)")]


def _qualified_name(where: str, what: str, name: str) -> list[Problem]:
    domain, _, ident = name.rpartition("/")
    problems: list[Problem] = []
    if domain and (len(domain) > limits.MAX_DOMAIN or not names.is_dns_subdomain(domain)):
        problems.append(Problem(where, f"{what} {name!r}: the domain must be a DNS subdomain of at most "
                                       f"{limits.MAX_DOMAIN} characters"))
    if len(ident) > limits.MAX_ID or not names.is_c_identifier(ident):
        problems.append(Problem(where, f"{what} {name!r}: the name after the domain must be a C identifier of at most "
                                       f"{limits.MAX_ID} characters"))
    return problems


def _capacity(where: str, name: str, capacity: Capacity, shared: bool) -> list[Problem]:
    at = f"{where}, capacity {name}"
    if capacity.value < 0:
        return [Problem(at, f"value must not be negative, got {capacity.value}")]
    policy = capacity.request_policy
    if policy is None:
        return []
    if not shared:
        return [Problem(at, "a requestPolicy needs allowMultipleAllocations: true on the device")]
    problems: list[Problem] = []
    low, high, step, default = policy.valid_range.min, policy.valid_range.max, policy.valid_range.step, policy.default
    if low < 0 or low > capacity.value:
        problems.append(Problem(at, f"validRange.min {low} must be between 0 and the capacity {capacity.value}"))
    if default < low:
        problems.append(Problem(at, f"default {default} is less than validRange.min {low}"))
    if high is not None:
        if not low <= high <= capacity.value:
            problems.append(Problem(at, f"validRange.max {high} must be between min {low} and the capacity {capacity.value}"))
        if default > high:
            problems.append(Problem(at, f"default {default} is more than validRange.max {high}"))
    if step is not None:
        if step <= 0:
            problems.append(Problem(at, f"validRange.step must be positive, got {step}"))
            return problems
        if low + step > capacity.value:
            problems.append(Problem(at, f"min + step ({low + step}) is larger than the capacity {capacity.value}"))
        for label, value in (("default", default), ("validRange.max", high)):
            if value is not None and (value - low) % step:
                problems.append(Problem(at, f"{label} {value} is not min {low} plus a multiple of step {step}"))
    return problems


def _device(where: str, device: Device) -> list[Problem]:
    at = f"{where}, device {device.name}"
    problems = _label(at, "device name", device.name)
    total = len(device.attributes) + len(device.capacity)
    if total > limits.MAX_ATTRIBUTES_AND_CAPACITIES:
        problems.append(Problem(at, f"{total} attributes and capacities; at most {limits.MAX_ATTRIBUTES_AND_CAPACITIES}"))
    for name, value in device.attributes.items():
        problems += _qualified_name(at, "attribute", name)
        if isinstance(value, str) and len(value) > limits.MAX_ATTRIBUTE_VALUE_LENGTH:
            problems.append(Problem(at, f"attribute {name} is {len(value)} characters long; "
                                        f"at most {limits.MAX_ATTRIBUTE_VALUE_LENGTH}"))
    for name, capacity in device.capacity.items():
        problems += _qualified_name(at, "capacity", name)
        problems += _capacity(at, name, capacity, device.allow_multiple_allocations)
    kind = device.attributes.get(names.KIND)
    if kind not in names.KINDS:
        problems.append(Problem(at, f"attribute {names.KIND} must be one of {', '.join(names.KINDS)} "
                                    f"(the DeviceClasses select on it), got {kind!r}"))
    if len(device.consumes_counters) > limits.MAX_CONSUMPTIONS_PER_DEVICE:
        problems.append(Problem(at, f"consumes from {len(device.consumes_counters)} counter sets; "
                                    f"at most {limits.MAX_CONSUMPTIONS_PER_DEVICE}"))
    for set_name, times in Tally(c.counter_set for c in device.consumes_counters).items():
        if times > 1:
            problems.append(Problem(at, f"consumes from counter set {set_name} in {times} entries; one is allowed"))
    for used in device.consumes_counters:
        problems += _label(at, "counter set", used.counter_set)
        problems += _counters(f"{at}, consumption from {used.counter_set}", used.counters,
                              limits.MAX_COUNTERS_PER_CONSUMPTION)
    return problems


def _counters(where: str, counters: Mapping[str, int], most: int) -> list[Problem]:
    problems: list[Problem] = []
    if not counters:
        problems.append(Problem(where, "needs at least one counter"))
    if len(counters) > most:
        problems.append(Problem(where, f"{len(counters)} counters; at most {most}"))
    for name, value in counters.items():
        problems += _label(where, "counter", name)
        if value < 0:
            problems.append(Problem(where, f"counter {name} must not be negative, got {value}"))
    return problems


def _counter_set(where: str, counter_set: CounterSet) -> list[Problem]:
    at = f"{where}, counter set {counter_set.name}"
    return _label(at, "counter set name", counter_set.name) + _counters(at, counter_set.counters,
                                                                        limits.MAX_COUNTERS_PER_SET)


def slice_problems(item: ResourceSlice) -> list[Problem]:
    """What the API server would refuse in one slice (and gpupack's own per-slice rules)."""
    where = f"slice {item.name}"
    problems: list[Problem] = []
    if not names.is_dns_subdomain(item.name):
        problems.append(Problem(where, "the slice name must be a DNS subdomain of at most 253 characters"))
    if item.driver != names.DRIVER:
        problems.append(Problem(where, f"driver must be {names.DRIVER}, got {item.driver!r}"))
    if len(item.pool) > limits.MAX_POOL_NAME or not all(names.is_dns_subdomain(p) for p in item.pool.split("/")):
        problems.append(Problem(where, f"pool name {item.pool!r} must be DNS subdomains separated by '/', "
                                       f"at most {limits.MAX_POOL_NAME} characters"))
    if not names.is_dns_subdomain(item.node_name):
        problems.append(Problem(where, f"nodeName {item.node_name!r} must be a node's name"))
    if item.generation < 0:
        problems.append(Problem(where, f"pool generation must be 0 or more, got {item.generation}"))
    if item.slice_count <= 0:
        problems.append(Problem(where, f"resourceSliceCount must be greater than zero, got {item.slice_count}"))
    if item.devices and item.shared_counters:
        problems.append(Problem(where, "only one of sharedCounters or devices is allowed in a slice"))
    most = limits.MAX_DEVICES_ADVANCED if any(d.consumes_counters for d in item.devices) else limits.MAX_DEVICES
    if len(item.devices) > most:
        problems.append(Problem(where, f"{len(item.devices)} devices; at most {most}"
                                       + (" when devices consume counters" if most == limits.MAX_DEVICES_ADVANCED else "")))
    if len(item.shared_counters) > limits.MAX_COUNTER_SETS:
        problems.append(Problem(where, f"{len(item.shared_counters)} counter sets; at most {limits.MAX_COUNTER_SETS}"))
    for counter_set in item.shared_counters:
        problems += _counter_set(where, counter_set)
    for device in item.devices:
        problems += _device(where, device)
    return problems


def _repeats(values: Iterable[str]) -> list[str]:
    return sorted(v for v, n in Tally(values).items() if n > 1)


def pool_problems(pool: Sequence[ResourceSlice]) -> list[Problem]:
    """What makes kube-scheduler ignore or mistrust a pool of slices (rules that span slices)."""
    if not pool:
        return []
    where = f"pool {pool[0].pool}"
    problems: list[Problem] = []
    for what, values in (("generation", {s.generation for s in pool}), ("resourceSliceCount", {s.slice_count for s in pool}),
                         ("nodeName", {s.node_name for s in pool})):
        if len(values) > 1:
            problems.append(Problem(where, f"slices disagree on {what}: {sorted(values, key=str)}"))
    if any(s.slice_count != len(pool) for s in pool):
        problems.append(Problem(where, f"resourceSliceCount says {sorted({s.slice_count for s in pool})} but the pool has "
                                       f"{len(pool)} slice(s); kube-scheduler waits for the missing ones"))
    for what, repeated in (("slice names", _repeats(s.name for s in pool)),
                           ("device names", _repeats(d.name for s in pool for d in s.devices)),
                           ("counter set names", _repeats(c.name for s in pool for c in s.shared_counters))):
        if repeated:
            problems.append(Problem(where, f"{what} repeat: {', '.join(repeated)}"))
    sets = {c.name: c for s in pool for c in s.shared_counters}
    for item in pool:
        for device in item.devices:
            for used in device.consumes_counters:
                at = f"slice {item.name}, device {device.name}"
                defined = sets.get(used.counter_set)
                if defined is None:
                    problems.append(Problem(at, f"consumes from counter set {used.counter_set}, which no slice of the pool defines"))
                    continue
                for counter, value in used.counters.items():
                    if counter not in defined.counters:
                        problems.append(Problem(at, f"consumes counter {counter}, which counter set {defined.name} does not define"))
                    elif value > defined.counters[counter]:
                        problems.append(Problem(at, f"consumes {value} of counter {counter}; counter set {defined.name} "
                                                    f"holds {defined.counters[counter]}, so it could never be allocated"))
    return problems


def problems(slices: Sequence[ResourceSlice]) -> list[Problem]:
    """Every problem of ``slices`` (one or several pools), per slice and per pool."""
    found: list[Problem] = []
    for item in slices:
        found += slice_problems(item)
    pools: dict[tuple[str, str], list[ResourceSlice]] = {}
    for item in slices:
        pools.setdefault((item.driver, item.pool), []).append(item)
    for pool in pools.values():
        found += pool_problems(pool)
    return found


def check(slices: Sequence[ResourceSlice]) -> None:
    """Raise :class:`InvalidSlices` listing every problem of ``slices``; return quietly if none."""
    found = problems(slices)
    if found:
        raise InvalidSlices(found)
