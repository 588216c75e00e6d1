"""An openb-like node list and pod list small enough for CI, for the replay's end-to-end tests."""

from __future__ import annotations

import random
from pathlib import Path

NODE_SHAPES = (  # (type, GPUs, CPU milli, memory MiB, weight): openb's node kinds, fewer of the large ones
    ("T4", 2, 64_000, 262_144, 10), ("P100", 2, 64_000, 262_144, 4), ("A10", 1, 32_000, 131_072, 3),
    ("V100M16", 4, 64_000, 262_144, 2), ("G2", 8, 96_000, 786_432, 1), ("G3", 4, 96_000, 786_432, 1),
    ("V100M32", 4, 96_000, 786_432, 1),
)


def synthetic_trace(tmp_path: Path, nodes: int = 60, pods: int = 250, seed: int = 5,
                    qos: bool = False) -> tuple[Path, Path]:
    """An openb-like node list and pod list (no gpu_spec: see docs/replay.md, "Known differences"); with
    ``qos`` a ``qos`` column too (LS, BE, Burstable about as openb's default mixes them), drawn from a
    stream of its own so the other columns are the same as without it."""
    rng = random.Random(seed)
    classes = random.Random(seed + 1)
    node_rows = ["sn,cpu_milli,memory_mib,gpu,model"]
    for i in range(nodes):
        kind, gpus, cpu, mem, _ = rng.choices(NODE_SHAPES, [s[4] for s in NODE_SHAPES])[0]
        node_rows.append(f"openb-node-{i:04d},{cpu},{mem},{gpus},{kind}")
    pod_rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec" + (",qos" if qos else "")]
    for i in range(pods):
        draw = rng.random()
        if draw < 0.12:
            gpus, milli = 0, 0
        elif draw < 0.6:
            gpus, milli = 1, rng.choice([50, 100, 200, 250, 300, 400, 500])
        elif draw < 0.7:
            gpus, milli = 1, rng.choice([600, 750, 900])
        elif draw < 0.94:
            gpus, milli = 1, 1000
        else:
            gpus, milli = rng.choice([2, 4]), 1000
        cpu = rng.choice([1000, 2000, 4000, 6000, 8000, 16000])
        cls = "," + classes.choices(("LS", "BE", "Burstable"), (0.55, 0.4, 0.05))[0] if qos else ""
        pod_rows.append(f"openb-pod-{i:04d},{cpu},{rng.choice([2048, 4096, 8192, 16384, 32768])},{gpus},{milli},{cls}")
    node_file, pod_file = tmp_path / "openb_node_list_gpu_node.csv", tmp_path / "openb_pod_list_synthetic.csv"
    node_file.write_text("\n".join(node_rows) + "\n")
    pod_file.write_text("\n".join(pod_rows) + "\n")
    return node_file, pod_file
