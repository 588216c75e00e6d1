"""The demo's stream of fractional pods: seeded, mixed, with some pods finishing.

Shapes (compute milli, GPU memory, sharing annotation) are drawn from a small
table that mixes what inference and notebook teams typically ask for: small
MIG slices, half GPUs, and MPS shares; a few impossible requests show the
webhook's refusals. Each pod lives a random number of seconds once scheduled;
then the demo deletes it, as if it had finished, and its capacity is reused.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from sharing.api.keys import BACKEND_LABEL, MEMORY_RESOURCE, MILLI_RESOURCE, SHARING_ANNOTATION

SHAPES: tuple[tuple[int, str | None, str | None, int], ...] = (
    # (milli, gpu-memory, gpupack.io/sharing, weight)
    (100, "8Gi", None, 6),
    (150, "10Gi", None, 4),
    (250, "20Gi", None, 4),
    (300, "30Gi", None, 3),
    (450, "40Gi", None, 2),
    (1000, "75Gi", "mig", 1),
    (200, "10Gi", "mps", 4),
    (250, None, "mps", 2),
    (500, "500Gi", None, 1),  # impossible: no GPU has 500 GiB; the webhook refuses it
)


@dataclass(frozen=True)
class DemoPod:
    name: str
    milli: int
    memory: str | None
    mode: str | None
    start_after: float
    """Seconds after the stream starts at which the pod is created."""
    lifetime: float | None
    """Seconds it runs once scheduled before it finishes (None: runs to the end)."""
    cpu_milli: int = 0
    """CPU the pod requests (0: none). A pod with ``milli`` 0 asks for no GPU: it is labelled
    ``gpupack.io/backend=dra``, so the packing engine places it on the DRA pool."""

    def manifest(self, namespace: str) -> dict[str, object]:
        resources: dict[str, dict[str, str]] = {}
        labels = {"app": "gpupack-demo"}
        if self.milli:
            resources["limits"] = {MILLI_RESOURCE: str(self.milli)}
            if self.memory is not None:
                resources["limits"][MEMORY_RESOURCE] = self.memory
        else:
            labels[BACKEND_LABEL] = "dra"
        if self.cpu_milli:
            resources["requests"] = {"cpu": f"{self.cpu_milli}m"}
        metadata: dict[str, object] = {"name": self.name, "namespace": namespace, "labels": labels}
        if self.mode:
            metadata["annotations"] = {SHARING_ANNOTATION: self.mode}
        return {
            "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": [{"name": "main", "image": "registry.example/inference:1",
                                     "resources": resources}]},
        }


def stream(count: int, seconds: float, seed: int = 7, finishing: float = 0.35) -> tuple[DemoPod, ...]:
    """``count`` pods spread over ``seconds``; about ``finishing`` of them finish during the demo."""
    rng = random.Random(seed)
    weights = [s[3] for s in SHAPES]
    pods = []
    for i in range(count):
        milli, memory, mode, _ = rng.choices(SHAPES, weights)[0]
        lifetime = rng.uniform(3.0, 10.0) if rng.random() < finishing else None
        pods.append(DemoPod(f"job-{i:03d}", milli, memory, mode, round(i * seconds / max(1, count), 2), lifetime))
    return tuple(pods)
