#!/usr/bin/env python3
"""READ-ONLY check of per-pod GPU use attribution on a real GPU (issue 35, item 1).

Starts two CUDA worker processes on GPU 0 that stand for two pods sharing it (time-slicing:
no MIG, no MPS): ``demo/busy`` runs matrix products back to back, ``demo/bursty`` runs them a
quarter of each second and sleeps the rest. Each holds a known amount of GPU memory. While they
run, the agent's own code reads the GPU once a second, exactly as the agent does:
``node.base.snapshot.read_snapshot`` (NVML devices and processes), ``node.usage.sampler``
(``nvmlDeviceGetProcessUtilization`` since the last read) and ``node.usage.attribution``
(samples and memory to pods, given which process is which pod's). It prints, per pod, the
mean SM percent and memory the agent attributed, next to what each worker measured of itself
(the share of wall time its kernels ran, timed with CUDA synchronisation, and the bytes it
allocated), and the raw NVML answers.

With ``--mps`` the workers are clients of an MPS control daemon the script starts (in a private
pipe directory) and stops, and ``demo/bursty`` runs under a pinned device memory limit
(``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) of ``--mps-limit-mib``; a third worker, ``demo/greedy``,
asks for more than its own limit, to show what a memory-limit hit looks like to the pod and to
NVML.

It never changes the GPU's configuration: no MIG-mode change, no instance created or destroyed,
no reset, no compute-mode change. Needs PyTorch (the workers) and nvidia-ml-py.

    python tools/nvml_usage_check.py [--seconds 20] [--mps] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.base.pods import PodUse  # noqa: E402
from node.base.snapshot import read_snapshot  # noqa: E402
from node.nvml.real import RealNvml  # noqa: E402
from node.usage.attribution import Poll, attribute  # noqa: E402
from node.usage.sampler import ProcessSampler  # noqa: E402
from sharing.api.keys import SHARED_RESOURCE  # noqa: E402

WORKER = r"""
import sys, time, torch
duty, mib, seconds = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
hold = torch.empty(mib * 1024 * 1024, dtype=torch.uint8, device="cuda")
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
print("ready", flush=True)
busy, start = 0.0, time.time()
while time.time() - start < seconds:
    t0 = time.time()
    while time.time() - t0 < duty:
        for _ in range(8):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    busy += time.time() - t0
    rest = 1.0 - (time.time() - t0)
    if rest > 0:
        time.sleep(rest)
print(f"busy_fraction {busy / (time.time() - start):.4f}", flush=True)
print(f"allocated_mib {torch.cuda.memory_reserved() // (1024 * 1024)}", flush=True)
"""

PODS = (("demo/busy", 1.0, 6144), ("demo/bursty", 0.25, 12288))

GREEDY = r"""
import torch
try:
    held = [torch.empty(1024 * 1024 * 1024, dtype=torch.uint8, device="cuda") for _ in range(64)]
    print("greedy allocated 64 GiB", flush=True)
except torch.OutOfMemoryError as exc:
    print("greedy OOM", str(exc).splitlines()[0][:300], flush=True)
print("greedy reserved_mib", torch.cuda.memory_reserved() // (1024 * 1024), flush=True)
"""


def start_mps(root: Path) -> dict[str, str]:
    """An MPS control daemon of our own (its pipes and logs under ``root``); the env its clients need."""
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(root / "log")}
    (root / "pipe").mkdir()
    (root / "log").mkdir()
    done = subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, capture_output=True, text=True, timeout=30)
    print(f"mps-control -d: rc={done.returncode} {done.stdout.strip()} {done.stderr.strip()}", flush=True)
    return env


def stop_mps(env: dict[str, str]) -> None:
    done = subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=env, capture_output=True, text=True,
                          timeout=30)
    print(f"mps-control quit: rc={done.returncode} {done.stdout.strip()} {done.stderr.strip()}", flush=True)
    log = Path(env["CUDA_MPS_LOG_DIRECTORY"])
    for name in ("control.log", "server.log"):
        if (log / name).exists():
            print(f"--- {name} (last lines)\n" + "\n".join((log / name).read_text().splitlines()[-15:]), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the workers run (default 20)")
    parser.add_argument("--out", type=Path, help="also write the JSON report here")
    parser.add_argument("--mps", action="store_true", help="run the workers as clients of an MPS daemon")
    parser.add_argument("--mps-limit-mib", type=int, default=16384,
                        help="with --mps: demo/bursty's and demo/greedy's pinned device memory limit (default 16384)")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.mps:
        env = start_mps(Path(tempfile.mkdtemp(prefix="gpupack-mps-")))
    try:
        return _run(args, env)
    finally:
        if args.mps:
            stop_mps(env)


def _run(args: argparse.Namespace, env: dict[str, str]) -> int:
    limited = {**env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={args.mps_limit_mib}M"} if args.mps else env
    greedy_out = ""
    if args.mps:
        greedy = subprocess.run([sys.executable, "-c", GREEDY], env=limited, capture_output=True, text=True,
                                timeout=120)
        greedy_out = (greedy.stdout + greedy.stderr[-600:]).strip()
        print(greedy_out, flush=True)
    workers = {}
    for pod, duty, mib in PODS:
        proc = subprocess.Popen([sys.executable, "-c", WORKER, str(duty), str(mib), str(args.seconds)],
                                stdout=subprocess.PIPE, text=True, env=limited if pod == "demo/bursty" else env)
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "ready":
            print(f"worker {pod} did not start: {line!r}", file=sys.stderr)
            return 2
        workers[pod] = proc
    nvml = RealNvml.open()
    sampler = ProcessSampler()
    uses = [PodUse(pod, f"uid-{pod}", SHARED_RESOURCE, 1, ("main",)) for pod, _, _ in PODS]
    by_pid = {proc.pid: pod for pod, proc in workers.items()}
    polls: list[dict[str, Any]] = []
    deadline = time.time() + args.seconds - 2
    time.sleep(2)
    while time.time() < deadline:
        snapshot = read_snapshot(nvml, "nvml")
        gpu = snapshot.gpus[0]
        samples = sampler.read(nvml, snapshot)
        gpu0 = samples.get(0, ())
        poll = Poll(snapshot, uses, {gpu.info.uuid: [p for p, _, _ in PODS]}, by_pid, samples)
        found = attribute(poll)
        polls.append({
            "nvml_processes": [(p.pid, p.used_memory_mib) for p in gpu.processes],
            "nvml_samples": [] if isinstance(gpu0, str) else [(s.pid, s.sm_percent) for s in gpu0],
            "sample_error": gpu0 if isinstance(gpu0, str) else None,
            "gpu_percent": None if gpu.utilization is None else gpu.utilization.gpu_percent,
            "pods": {u.pod: {"sm": u.sm_percent, "mib": u.memory_used_mib, "unattributed": u.unattributed}
                     for u in found},
        })
        time.sleep(1)
    measured = {}
    for pod, proc in workers.items():
        out, _ = proc.communicate(timeout=60)
        values = dict(line.split() for line in out.splitlines() if " " in line)
        measured[pod] = {"busy_fraction": float(values.get("busy_fraction", "nan")),
                         "allocated_mib": int(values.get("allocated_mib", "-1"))}
    summary = {}
    for pod, _, _ in PODS:
        seen = [p["pods"].get(pod, {}) for p in polls]
        sms = [s["sm"] for s in seen if s.get("sm") is not None]
        mibs = [s["mib"] for s in seen if s.get("mib") is not None]
        summary[pod] = {"agent_mean_sm_percent": sum(sms) / len(sms) if sms else None,
                        "agent_max_memory_mib": max(mibs) if mibs else None,
                        "attributed_polls": sum(1 for s in seen if s and not s.get("unattributed")),
                        "unattributed_reasons": sorted({s.get("unattributed", "") for s in seen} - {""}),
                        "worker": measured[pod]}
    report = {"gpu": nvml.device_info(0).name, "mps": args.mps, "greedy": greedy_out,
              "worker_pids": by_pid, "polls": len(polls), "summary": summary, "first_polls": polls[:3],
              "last_poll": polls[-1] if polls else None}
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
