"""KWOK in the dev cluster: the stages it runs, and the fake Nodes it manages.

kwok (``sigs.k8s.io/kwok``, built by ``tools/k8s/build.sh kwok``) plays the kubelet
for Nodes that carry the annotation :data:`MANAGED_ANNOTATION` ``=`` :data:`MANAGED_VALUE`
and for the pods bound to them, following the Stage files in ``tools/kwok/stages``
(read by :func:`stages`, written for kwok by :func:`write_config`):

* a new Node becomes Ready at once, with the capacity it was created with, and keeps
  a Lease in ``kube-node-lease`` renewed every ``NODE_LEASE_SECONDS / 4`` seconds;
* a pod bound to one goes Running at once;
* a Running pod with the annotation :data:`DURATION_ANNOTATION` ends ``Succeeded``
  that many seconds after it started (gpupack's own stage: kwok's stock one completes
  only Job pods); one without it runs until deleted;
* a deleted pod is removed at once (no kubelet would finish its deletion otherwise).

Nodes without the annotation (the ones tests and benchmarks write by hand) are left
alone. :func:`node_manifest` and :func:`create_nodes` make Nodes kwok manages.
docs/kwok.md has the rest.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from gpupack.devcluster.apply import REPO_ROOT, Manifest, load_manifests
from gpupack.devcluster.errors import StartFailed
from sharing.api.keys import HOSTNAME_LABEL, SIMULATED_GPUS_ANNOTATION

KWOK_DIR = REPO_ROOT / "tools" / "kwok"
STAGES_DIR = KWOK_DIR / "stages"
RBAC_FILE = KWOK_DIR / "rbac.yaml"
USER = "kwok-controller"
"""The user kwok acts as (its client certificate's common name); RBAC_FILE grants it what it needs."""

MANAGED_ANNOTATION = "kwok.x-k8s.io/node"
MANAGED_VALUE = "fake"
"""kwok manages exactly the Nodes annotated ``kwok.x-k8s.io/node=fake`` (kwok's own convention)."""

# DURATION_ANNOTATION (sharing.api.keys): seconds a pod on a KWOK node runs before it ends Succeeded
# (a plain number: "90", "2.5"); read by ``tools/kwok/stages/pod-complete.yaml``, which spells it
# too (a unit test checks the two agree).

NODE_LEASE_SECONDS = 40
"""``--node-lease-duration-seconds``: a kubelet's default; kwok renews each Lease every quarter of it."""

POD_CIDR = "10.128.0.0/12"
"""``--cidr``, where pod IPs come from: a million addresses (kwok's default /24 runs out at 254 pods)."""

NODE_CIDR = "10.64.0.0/12"
"""Node InternalIPs: :func:`create_nodes` gives node number ``n`` (its ``start`` plus its place) address
number ``n + 1`` of this network; kwok gives the node's pods that address as their ``hostIP``."""

STAGE_API_VERSION = "kwok.x-k8s.io/v1alpha1"
_STANDARD_RESOURCES = ("cpu", "memory", "pods")


def stages(directory: Path = STAGES_DIR) -> list[Manifest]:
    """The Stage documents kwok runs; ValueError if a document is not a Stage or two share a name."""
    documents = load_manifests(directory)
    names: set[str] = set()
    for doc in documents:
        name = (doc.get("metadata") or {}).get("name", "")
        if doc["kind"] != "Stage" or doc["apiVersion"] != STAGE_API_VERSION:
            raise ValueError(f"{directory}: {doc['apiVersion']}/{doc['kind']} {name!r} is not a "
                             f"{STAGE_API_VERSION} Stage")
        if not name or name in names:
            raise ValueError(f"{directory}: a Stage without a name, or two named {name!r}")
        names.add(name)
    if not documents:
        raise ValueError(f"{directory}: no Stage documents")
    return documents


def write_config(path: Path, directory: Path = STAGES_DIR) -> Path:
    """Write kwok's ``--config`` file: the stages, one YAML document each."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(stages(directory), sort_keys=False), encoding="utf-8")
    return path


def rbac() -> list[Manifest]:
    """The ClusterRole and binding that let user :data:`USER` do what kwok does."""
    return load_manifests(RBAC_FILE)


Quantity = str | int


def node_manifest(
    name: str,
    *,
    cpu: Quantity = "32",
    memory: Quantity = "256Gi",
    pods: int = 110,
    extended: Mapping[str, Quantity] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    address: str | None = None,
) -> Manifest:
    """A Node kwok manages: capacity and allocatable both ``cpu``, ``memory``, ``pods`` and the
    ``extended`` resources (``{"nvidia.com/gpu": 8}``), the usual kubelet labels plus ``labels``,
    kwok's annotation plus ``annotations`` (:func:`simulated_gpus` makes a node ``gpupack agent
    fleet`` serves), and ``address`` (if given) as its InternalIP.

    ValueError for a bad name, a non-positive ``pods``, or cpu/memory/pods given in ``extended``.
    """
    if not name or len(name) > 253 or name != name.lower() or " " in name:
        raise ValueError(f"{name!r} is not a Node name (lower case DNS subdomain)")
    if pods < 1:
        raise ValueError(f"pods={pods}: a node holds at least one pod")
    extra = dict(extended or {})
    clash = sorted(set(extra) & set(_STANDARD_RESOURCES))
    if clash:
        raise ValueError(f"pass {', '.join(clash)} as their own arguments, not in extended")
    resources = {"cpu": str(cpu), "memory": str(memory), "pods": str(pods),
                 **{key: str(value) for key, value in sorted(extra.items())}}
    status: dict[str, Any] = {"capacity": dict(resources), "allocatable": dict(resources)}
    if address is not None:
        status["addresses"] = [{"type": "InternalIP", "address": str(ipaddress.ip_address(address))},
                               {"type": "Hostname", "address": name}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                HOSTNAME_LABEL: name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                # The same key as a label, so clients can select KWOK nodes.
                MANAGED_ANNOTATION: MANAGED_VALUE,
                **(labels or {}),
            },
            "annotations": {**(annotations or {}), MANAGED_ANNOTATION: MANAGED_VALUE},
        },
        # A kubelet registers its Node with its capacity; the API server keeps status on create.
        "status": status,
    }


def simulated_gpus(model: str, count: int) -> dict[str, str]:
    """The annotation that has ``gpupack agent fleet`` serve a node with ``count`` simulated GPUs of
    ``model`` (as ``agent run --simulate MODEL:COUNT`` takes them): pass it as ``annotations``."""
    if not model or ":" in model or not 1 <= count <= 16:
        raise ValueError(f"simulated GPUs {model!r}:{count}: a model name and 1..16 GPUs")
    return {SIMULATED_GPUS_ANNOTATION: f"{model}:{count}"}


def node_address(number: int) -> str:
    """The InternalIP of node number ``number`` (0, 1, ...) in :data:`NODE_CIDR`."""
    network = ipaddress.ip_network(NODE_CIDR)
    if not 0 <= number < network.num_addresses - 2:
        raise ValueError(f"node number {number} is outside {NODE_CIDR}")
    return str(network[number + 1])


def node_names(count: int, prefix: str = "kwok-node-", start: int = 0) -> list[str]:
    """``prefix`` followed by ``start`` .. ``start + count - 1``, zero-padded to sort in order."""
    if count < 0:
        raise ValueError(f"count={count}: cannot make a negative number of nodes")
    width = max(4, len(str(start + count - 1)))
    return [f"{prefix}{i:0{width}d}" for i in range(start, start + count)]


def create_nodes(api_client: Any, count: int, *, prefix: str = "kwok-node-", start: int = 0,
                 **node: Any) -> list[str]:
    """Create ``count`` Nodes kwok manages (:func:`node_names`; ``node`` as :func:`node_manifest`
    takes it, each with its :func:`node_address`); their names. An existing Node of the same name is
    an error (the API's 409)."""
    core = client.CoreV1Api(api_client)
    names = node_names(count, prefix, start)
    # Every argument checked before anything is created.
    manifests = [node_manifest(name, address=node_address(start + i), **node) for i, name in enumerate(names)]
    for manifest in manifests:
        core.create_node(body=manifest)  # type: ignore[arg-type]  # the client sends a dict body as it is
    return names


def ready(node: Mapping[str, Any]) -> bool:
    """Whether a Node (as a dict) reports condition Ready=True."""
    conditions: Iterable[Mapping[str, Any]] = (node.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def wait_ready(api_client: Any, names: Iterable[str], timeout_s: float = 60.0,
               clock: Callable[[], float] = time.monotonic) -> None:
    """Wait until every Node of ``names`` is Ready (kwok runs, and manages them); StartFailed naming
    the ones that are not after ``timeout_s``."""
    wanted = set(names)
    deadline = clock() + timeout_s
    while True:
        nodes = [api_client.sanitize_for_serialization(n) for n in client.CoreV1Api(api_client).list_node().items]
        waiting = wanted - {n["metadata"]["name"] for n in nodes if ready(n)}
        if not waiting:
            return
        if clock() >= deadline:
            shown = ", ".join(sorted(waiting)[:5]) + (" ..." if len(waiting) > 5 else "")
            raise StartFailed(f"{len(waiting)} KWOK node(s) not Ready after {timeout_s:.0f}s: {shown}",
                              "check that the control plane runs kwok (ControlPlaneConfig(kwok=True)) and "
                              "read its log (logs/kwok.log in the work dir)")
        time.sleep(0.5)
