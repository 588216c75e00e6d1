"""Mode choice and per-container decision: what a gpupack request becomes.

Given a :class:`~sharing.api.request.PodRequest`, the namespace's
:class:`~sharing.admission.inventory.AdmissionPolicy` and the cluster :class:`~sharing.admission.inventory.Inventory`,
:func:`decide` returns a :class:`PodDecision`: one mode for the whole pod (the
device plugin's sharing config is node-wide and all containers of a pod land on
one node, so mixing modes in a pod could never schedule), per container the
resource to request (``nvidia.com/mig-<profile>`` or ``nvidia.com/gpu.shared``)
and MPS limits, the node affinity that keeps the pod on compatible nodes, and
whether the pod waits at the ``gpupack.io/capacity`` gate.

``auto`` minimises waste (defined in ``sharing.admission.options``, which computes the
options). Ties go to the stronger isolation: MIG, then MPS, then time-slicing.
An option whose capacity exists now always beats one that would have to wait
at the gate. A shared-mode request that no split into two or more replicas can
hold gets plain whole GPUs (mode ``whole``, ``nvidia.com/gpu``) instead of a
GPU split into one replica (``sharing.rules.replicas``).

With ``engine_places`` (the webhook's default, ``placement: engine``) every pod
waits at the gate, so the cluster controller's packing engine chooses its node
and kube-scheduler only binds it there; otherwise only pods whose capacity does
not exist yet wait (``placement: scheduler``).

``backend`` is the node pool the pod goes to (``sharing.admission.pool_choice``): the
decision is made over that pool's nodes only. On the DRA pool
(``sharing.admission.options``' DRA rules) each container's ``resource`` is the name of
its request in the pod's ResourceClaim (``gpu-<n>``, :func:`sharing.admission.dra_claims.request_name`),
no MPS env is set (the kubelet plugin sets the limits from the claim), and the
pod is always gated: the packing engine creates the claim pinned to the devices
it chose. A DRA pool with no node yet still admits the pod, gated, in a mode
that needs no GPU model (capacity may come); only MIG needs a model. Since the
claim is created only when the engine places the pod, an ``auto`` pod decided
a share there also records its MIG option, when the pool has one
(``PodDecision.mig_fallback``): the engine places it on MIG instead when no
shared GPU has room (docs/dra-placement.md, "The mode of an auto pod").

A right-sized container (``ContainerRequest.predicted_milli``, set by
``sharing.admission.right_sizing``) asks the shared options and a whole GPU for its *accounted* milli
(``milli``: the predicted use divided by the namespace's compute over-commit,
``sharing.rules.right_sizing.accounted_milli``), and MIG for its *predicted* milli: MIG slices are
physical and cannot be over-committed. Its MPS share has no SM cap of its own
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100``): a recommendation's milli is a duty cycle, the share of
time the pod kept the GPU busy with all its SMs, not a share of the SMs (docs/right-sizing.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Final

from sharing.api.allocation import Allocation, ContainerAllocation, resource_for
from sharing.api.backend import DEFAULT_BACKEND, Backend
from sharing.admission.dra_claims import request_name
from sharing.admission.inventory import Inventory, AdmissionPolicy
from sharing.api.keys import BACKEND_LABEL, CAPACITY_GATE, DEGRADED_LABEL, SHARING_ANNOTATION, STRATEGY_LABEL
from sharing.api.modes import MODES, AllocationMode, Mode
from sharing.api.mps_env import PINNED_MEMORY_ENV, THREAD_PERCENTAGE_ENV, pinned_memory_value
from sharing.admission.options import (
    DRA_TERMS,
    Expression,
    NeverFits,
    NoMigOption,
    Option,
    Role,
    Term,
    covering_profile,
    dra_shared_option,
    dra_wants_whole_gpus,
    fmt_bytes,
    mig_option,
    option_rank,
    peak_devices,
    profile_waste,
    role,
    shared_option,
    wants_whole_gpus,
    whole_option,
)
from sharing.api.request import AdmissionRefusal, ContainerKind, PodRequest, Reason

__all__ = [  # the options' names are re-exported: callers need only this module (keys: ``sharing.api.keys``)
    "MPS_MEMORY_ENV", "MPS_THREADS_ENV", "AllocationMode", "ContainerDecision", "DecisionMemo", "Expression", "PodDecision", "Term",
    "covering_profile", "decide", "peak_devices", "policy_for", "profile_waste",
]

MPS_THREADS_ENV: Final = THREAD_PERCENTAGE_ENV
MPS_MEMORY_ENV: Final = PINNED_MEMORY_ENV
_RANK: Final[dict[str, int]] = {"mig": 0, "mps": 1, "time-slicing": 2, "whole": 3}
_MIB: Final = 1024**2


@dataclass(frozen=True)
class ContainerDecision:
    kind: ContainerKind
    index: int
    name: str
    milli: int
    memory_bytes: int | None
    resource: str
    profile: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    predicted_milli: int | None = None
    """Right-sized: the compute the container is predicted to use (``milli`` is what placement
    counts, ``ContainerRequest.predicted_milli``); None: not right-sized."""


@dataclass(frozen=True)
class PodDecision:
    mode: AllocationMode
    containers: tuple[ContainerDecision, ...]
    terms: tuple[Term, ...]
    gated: bool
    reason: str
    policy: str
    gpu_model: str | None = None
    replicas: int | None = None
    capacity_exists: bool = True
    """False: the pod waits for capacity to be created, not only for the engine's choice."""
    backend: Backend = DEFAULT_BACKEND
    claim: str | None = None
    """DRA pool: the ResourceClaim the pod references (named by the webhook, ``sharing.api.backend``)."""
    mig_fallback: tuple[str, ...] | None = None
    """DRA pool, an ``auto`` pod decided a share: per container the profile of the pool's MIG
    option, which the packing engine may place it on instead (``Allocation.mig_fallback``)."""

    def allocation(self) -> Allocation:
        """The ``gpupack.io/allocation`` record of this decision (``sharing.api.allocation``)."""
        return Allocation(
            mode=self.mode,
            gated=self.gated,
            capacity_existed=self.capacity_exists,
            policy=self.policy,
            reason=self.reason,
            containers=tuple(
                ContainerAllocation(c.name, c.kind, c.milli, c.memory_bytes, c.resource, c.profile,
                                    c.predicted_milli)
                for c in self.containers
            ),
            gpu_model=self.gpu_model,
            replicas=self.replicas,
            backend=self.backend,
            claim=self.claim,
            mig_fallback=self.mig_fallback,
        )


# --- the decision --------------------------------------------------------------


RIGHT_SIZED_THREAD_PERCENTAGE: Final = 100
"""The thread limit of a right-sized MPS container: none of its own. Set, not omitted, so the pod
says what it was given; a client's value only narrows the MPS control daemon's default, so the
device plugin's per-replica cap (``100 / r``) still holds (docs/right-sizing.md)."""


def _mps_env(milli: int, memory: int | None, right_sized: bool = False) -> tuple[tuple[str, str], ...]:
    # The device plugin already caps each replica at 1/r of the GPU; these
    # per-client limits narrow that to what the container asked for. A right-sized
    # container's milli is a predicted duty cycle, not a share of the SMs: no SM cap.
    threads = RIGHT_SIZED_THREAD_PERCENTAGE if right_sized else max(1, math.ceil(milli / 10))
    env = [(MPS_THREADS_ENV, str(threads))]
    if memory is not None:
        env.append((MPS_MEMORY_ENV, pinned_memory_value(math.ceil(memory / _MIB))))
    return tuple(env)


def decide(
    request: PodRequest, policy: AdmissionPolicy, inventory: Inventory, *, engine_places: bool = False,
    memo: DecisionMemo | None = None, backend: Backend = DEFAULT_BACKEND,
) -> PodDecision:
    """Decide one pod; raises :class:`AdmissionRefusal` for a pod to deny.

    ``engine_places``: gate the pod even when capacity exists, so that the controller's
    packing engine chooses its node (module docstring). ``memo``: the caller's memo for
    ``inventory`` (:class:`DecisionMemo`), or None to work everything out afresh.
    ``backend``: the pool the pod goes to; only its nodes count. The caller names the
    claim of a DRA decision (``PodDecision.claim``)."""
    allowed = policy.allowed_modes
    if request.mode != "auto" and request.mode not in allowed:
        raise AdmissionRefusal(
            Reason.MODE_FORBIDDEN,
            f"sharing mode {request.mode!r} ({SHARING_ANNOTATION}) is forbidden in namespace "
            f"{request.namespace!r} by SharingPolicy {policy.name!r}; allowed modes: "
            f"{', '.join(allowed) if allowed else 'none'}",
        )
    if not allowed:
        raise AdmissionRefusal(
            Reason.MODE_FORBIDDEN,
            f"every sharing mode is forbidden in namespace {request.namespace!r}: SharingPolicy "
            f"{policy.name!r} has no namespace rule that selects it (allowed modes: none)",
        )
    asks = [
        (c.milli, c.memory_bytes if c.memory_bytes is not None else policy.default_memory_bytes)
        for c in request.containers
    ]
    pool = inventory.pool(backend)
    largest = pool.max_gpu_memory_mib * _MIB
    for c, (_, mem) in zip(request.containers, asks):
        if largest and mem is not None and mem > largest:
            raise AdmissionRefusal(
                Reason.MEMORY_TOO_LARGE,
                f"container {c.name!r} asks for {fmt_bytes(mem)} of GPU memory; the largest GPU in "
                f"{_where(backend)} has {fmt_bytes(largest)}",
            )
    roles = tuple(role(c) for c in request.containers)
    # MIG slices are physical: a right-sized container's instance covers its predicted use.
    mig_asks = tuple((c.predicted_milli or milli, mem) for c, (milli, mem) in zip(request.containers, asks))
    choice = _choose(request.mode, tuple(asks), mig_asks, roles, policy, inventory, memo, backend)
    return _materialise(choice, request, asks, policy, engine_places or backend == "dra", backend)


CPU_POD_REASON: Final = (f"asks for no GPU and is labelled {BACKEND_LABEL}=dra: gated on {CAPACITY_GATE} until the "
                          "packing engine chooses its node in the DRA node pool")


def cpu_pod_decision() -> PodDecision:
    """The decision for a pod that asks for no GPU and is labelled ``gpupack.io/backend=dra``: the
    packing engine places it on the DRA pool beside the GPU pods (their CPU is what feeds the
    GPUs), so it waits at the gate, held to the pool's healthy nodes, until the controller pins it.
    The same for every such pod: its requests are read from the pod when it is placed."""
    return PodDecision(
        mode="cpu",
        containers=(),
        terms=tuple((*term, Expression(DEGRADED_LABEL, "DoesNotExist", ())) for term in DRA_TERMS),
        gated=True,
        reason=f"cpu: {CPU_POD_REASON}",
        policy="",
        backend="dra",
    )


def _where(backend: Backend) -> str:
    return "the DRA node pool" if backend == "dra" else "the cluster"


@dataclass(frozen=True)
class Choice:
    """The best option, and the MIG option the pool has for the request (None: none, or MIG was not
    among the modes considered), which a DRA ``auto`` pod given a share may fall back to."""

    best: Option
    mig: Option | None = None


class DecisionMemo:
    """Merged policies and options already worked out against one inventory snapshot.

    Owned by a caller that decides many pods against the same snapshot (the
    webhook, ``webhook.inventory_source.InventoryHolder``, which starts a new
    memo with every new snapshot): most pods of a cluster come from a few
    namespaces and ask for the same few shapes. A memo answers only for its own
    snapshot, and forgets everything when it holds :data:`LIMIT` entries.
    """

    LIMIT: Final = 4096

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self._policies: dict[str, AdmissionPolicy] = {}
        self._options: dict[tuple[object, ...], Choice | AdmissionRefusal] = {}

    def policy_for(self, namespace: str) -> AdmissionPolicy:
        """``inventory.policy_for(namespace)``, remembered."""
        policy = self._policies.get(namespace)
        if policy is None:
            if len(self._policies) >= self.LIMIT:
                self._policies.clear()
            policy = self._policies[namespace] = self.inventory.policy_for(namespace)
        return policy

    def option(self, key: tuple[object, ...]) -> Choice | AdmissionRefusal | None:
        """The answer remembered for ``key``, if any."""
        return self._options.get(key)

    def remember(self, key: tuple[object, ...], answer: Choice | AdmissionRefusal) -> None:
        if len(self._options) >= self.LIMIT:
            self._options.clear()
        self._options[key] = answer


def policy_for(inventory: Inventory, namespace: str, memo: DecisionMemo | None = None) -> AdmissionPolicy:
    """``inventory``'s merged policy for ``namespace``, remembered in ``memo`` when it is ``inventory``'s."""
    own = _own_memo(memo, inventory)
    return inventory.policy_for(namespace) if own is None else own.policy_for(namespace)


def _own_memo(memo: DecisionMemo | None, inventory: Inventory) -> DecisionMemo | None:
    """``memo`` if it was made for ``inventory``: a memo never answers for another snapshot."""
    return memo if memo is not None and memo.inventory is inventory else None


def _choose(
    requested: str,
    asks: tuple[tuple[int, int | None], ...],
    mig_asks: tuple[tuple[int, int | None], ...],
    roles: tuple[Role, ...],
    policy: AdmissionPolicy,
    inventory: Inventory,
    memo: DecisionMemo | None,
    backend: Backend,
) -> Choice:
    """The best option (and the MIG option); remembered in ``memo`` when it belongs to ``inventory`` (a snapshot
    never changes once built, so neither does the answer)."""
    memo = _own_memo(memo, inventory)
    if memo is None:
        return _choose_uncached(requested, list(asks), list(mig_asks), roles, policy, inventory.pool(backend), backend)
    key = (backend, requested, asks, mig_asks, roles, policy)
    cached = memo.option(key)
    if cached is None:
        try:
            cached = _choose_uncached(requested, list(asks), list(mig_asks), roles, policy, inventory.pool(backend),
                                      backend)
        except AdmissionRefusal as refusal:
            cached = refusal
        memo.remember(key, cached)
    if isinstance(cached, AdmissionRefusal):
        raise AdmissionRefusal(cached.reason, cached.message)
    return cached


def _choose_uncached(
    requested: str,
    asks: list[tuple[int, int | None]],
    mig_asks: list[tuple[int, int | None]],
    roles: tuple[Role, ...],
    policy: AdmissionPolicy,
    inventory: Inventory,
    backend: Backend,
) -> Choice:
    """``inventory``: the pool's (``Inventory.pool``). ``asks``: what the shared and whole-GPU options
    count; ``mig_asks``: what a MIG instance must cover (the predicted use of a right-sized container)."""
    allowed = policy.allowed_modes
    dra = backend == "dra"
    where = _where(backend)
    modes: tuple[Mode, ...] = tuple(m for m in MODES if m == requested or (requested == "auto" and m in allowed))
    options: list[Option] = []
    mig: Option | None = None
    failures: list[str] = []
    never_fits: list[str] = []
    whole = dra_wants_whole_gpus(asks, inventory) if dra else wants_whole_gpus(asks, inventory)
    for mode in modes:
        if mode == "mig":
            try:
                mig = mig_option(mig_asks, roles, policy, inventory, dra=dra)
                options.append(mig)
            except NoMigOption as none:
                if requested == "mig":
                    reason = Reason.POD_NEVER_FITS if none.never_fits else Reason.NO_MIG_MODEL
                    raise AdmissionRefusal(reason, f"no GPU in {where} can satisfy the mig request: {none.reason}"
                                           ) from None
                failures.append(f"mig: {none.reason}")
                never_fits += [none.reason] if none.never_fits else []
        elif not whole and dra:
            try:
                options.append(dra_shared_option(mode, asks, inventory))
            except NeverFits as never:
                failures.append(never.reason)
                never_fits.append(never.reason)
        elif not whole:
            try:
                options.append(shared_option(mode, asks, roles, inventory))
            except NeverFits as never:
                failures.append(never.reason)
                never_fits.append(never.reason)
    if whole and any(m != "mig" for m in modes):
        # MPS or time-slicing would need a GPU split into one replica (on the DRA pool: a share
        # of all of it): one whole-GPU option instead.
        try:
            options.append(whole_option(asks, roles, inventory, dra=dra))
        except NeverFits as never:
            failures.append(never.reason)
            never_fits.append(never.reason)
    if not options and never_fits and len(never_fits) == len(failures):
        raise AdmissionRefusal(
            Reason.POD_NEVER_FITS,
            f"no node in {where} could ever hold this pod's GPU devices at once (" + "; ".join(failures) + ")",
        )
    if requested == "auto" and not (dra and not inventory.nodes):
        # Shared modes with no compatible node are only a fallback when asked
        # for explicitly: auto never gates on a kind of node that does not exist.
        options = [o for o in options if o.mode == "mig" or o.waste != math.inf]
        if not options:
            if whole:
                failures.append("more than a GPU split into two replicas holds, and no node hands out whole GPUs")
            else:
                failures += [f"{m}: no node shares GPUs by {m} into replicas that fit" for m in modes if m != "mig"]
            raise AdmissionRefusal(
                Reason.NO_COMPATIBLE_NODES,
                f"no GPU in {where} can host this request in an allowed mode (" + "; ".join(failures) + ")",
            )
    if not options:  # an empty DRA pool, and only MIG allowed: no model to choose a profile from
        raise AdmissionRefusal(
            Reason.NO_COMPATIBLE_NODES,
            f"no GPU in {where} can host this request in an allowed mode (" + "; ".join(failures) + ")",
        )
    return Choice(min(options, key=lambda o: (*option_rank(o), _RANK[o.mode])), mig)


def _resource(mode: AllocationMode, profile: str | None) -> str:
    resource = resource_for(mode, profile)
    assert resource is not None, "a MIG decision always has a profile"
    return resource


def _materialise(
    choice: Choice, request: PodRequest, asks: list[tuple[int, int | None]], policy: AdmissionPolicy,
    engine_places: bool, backend: Backend,
) -> PodDecision:
    best, dra = choice.best, backend == "dra"
    engine_chooses_split = engine_places and not dra and best.mode in ("mps", "time-slicing")
    if engine_chooses_split:
        # The packing engine chooses the node, and with it the split (any replica count the
        # pod fits, on any product its own affinity allows). Terms naming the splits and
        # products that share now would hold the pod to them for good: a gated pod's
        # affinity may be tightened (the controller pins it) but never loosened.
        best = replace(best, terms=((Expression(STRATEGY_LABEL, "In", (best.mode,)),),), replicas=None)
    fallback = _mig_fallback(choice, request.mode, backend)
    containers: list[ContainerDecision] = []
    for i, (c, (milli, mem)) in enumerate(zip(request.containers, asks)):
        profile = best.profiles[i].name if best.mode == "mig" else None
        # On the DRA pool a container is given its request of the pod's claim, and the kubelet
        # plugin sets MPS limits from what the claim consumed.
        resource = request_name(i) if dra else _resource(best.mode, profile)
        env = _mps_env(milli, mem, c.predicted_milli is not None) if best.mode == "mps" and not dra else ()
        containers.append(ContainerDecision(c.kind, c.index, c.name, milli, mem, resource, profile, env,
                                            c.predicted_milli))
    if best.mode == "mig":
        assert best.model is not None
        where = f"{', '.join(sorted({p.name for p in best.profiles}))} on {best.model.product}"
    elif best.mode == "whole" and dra:
        where = "a whole GPU per container (a container asks all of a GPU's compute or more memory than a share holds)"
    elif best.mode == "whole":
        where = "a whole GPU per container (more than a GPU split into two replicas holds)"
    elif dra:
        where = f"{best.mode} shares"
    elif engine_chooses_split:
        where = f"{best.mode} replicas (the packing engine chooses the node and its split)"
    else:
        where = f"{best.mode} replicas" + (f" (1/{best.replicas} GPU)" if best.replicas else "")
    if dra:
        where += " on the DRA node pool"
    if fallback is not None:
        where += f" (or MIG {', '.join(fallback)} if no shared GPU has room when it is placed)"
    if not best.has_capacity:
        gate = f"gated on {CAPACITY_GATE} until capacity exists"
    elif engine_places:
        gate = f"capacity available; gated on {CAPACITY_GATE} until the packing engine chooses its node"
    else:
        gate = "capacity available"
    reason = f"{request.mode} -> {best.mode}: {where}; {gate}"
    # Nodes with a GPU fault the device plugin keeps advertising are off limits to new pods
    # (the kubelet, not gpupack, would pick the device there): node.health labels them.
    healthy = Expression(DEGRADED_LABEL, "DoesNotExist", ())
    return PodDecision(
        mode=best.mode,
        containers=tuple(containers),
        terms=tuple((*term, healthy) for term in best.terms),
        gated=engine_places or not best.has_capacity,
        capacity_exists=best.has_capacity,
        reason=reason,
        policy=policy.name,
        gpu_model=best.model.product if best.model else None,
        replicas=None if dra else best.replicas,
        backend=backend,
        mig_fallback=fallback,
    )


def _mig_fallback(choice: Choice, requested: str, backend: Backend) -> tuple[str, ...] | None:
    """Per container the profile of the pool's MIG option, for an ``auto`` pod given a share on the
    DRA pool (its claim is created when the engine places it, so the engine may still choose MIG);
    None otherwise: an explicit mode is final, and a whole-GPU or MIG pod has nothing to fall back to."""
    if backend != "dra" or requested != "auto" or choice.best.mode not in ("mps", "time-slicing") or choice.mig is None:
        return None
    return tuple(p.name for p in choice.mig.profiles)
