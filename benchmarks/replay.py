"""Live replays of openb workloads against the simulator's product model (issue 16 item 4; a script, not a test).

Runs ``gpupack replay --json`` (the real stack on KWOK nodes: docs/replay.md) for each workload on the
seed's sample of ``--max-nodes`` nodes, and tabulates the live allocation at 130 % arrived demand beside
the product model's and the FGD protocol's on the same plan, the pods never placed (and who said so),
creation-to-bound latency, and what each run cost.

    python benchmarks/replay.py                                  # default and gpushare40, 200 nodes, seed 42
    python benchmarks/replay.py --max-nodes 50 --workloads default
    python benchmarks/replay.py --traces ../shared/traces/openb --seed 43

Writes benchmarks/replay.json (``--out``) and benchmarks/replay.md (``--markdown``); one PNG per workload
beside them (``<out's stem>_<workload>.png``). A 200-node run takes 30-40 minutes on a 2-core machine;
``--max-nodes all`` replays the whole cluster (1,213 nodes, about 11,000 pods a workload) and takes hours.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces" / "openb"


def run_one(traces: Path, workload: str, seed: int, max_nodes: int | None, plot: Path,
            timeout_s: float, stop_after_min: float | None = None) -> dict[str, Any]:
    """One ``gpupack replay --json`` run (``max_nodes`` None: the whole cluster); its report plus the wall time."""
    sample = [] if max_nodes is None else ["--max-nodes", str(max_nodes)]
    if stop_after_min is not None:
        sample += ["--stop-after", str(stop_after_min)]
    with tempfile.TemporaryDirectory(prefix="gpupack-replay-bench-") as work:
        began = time.monotonic()
        run = subprocess.run(
            [sys.executable, "-m", "gpupack", "replay", "--nodes", str(traces / "openb_node_list_gpu_node.csv"),
             "--pods", str(traces / f"openb_pod_list_{workload}.csv"), "--seed", str(seed),
             *sample, "--json", "--plot", str(plot), "--workdir", work],
            cwd=ROOT, stdout=subprocess.PIPE, text=True, timeout=timeout_s, check=False,
        )
        wall = time.monotonic() - began
    if not run.stdout.strip():
        raise RuntimeError(f"{workload}: gpupack replay exited {run.returncode} without a report")
    report: dict[str, Any] = json.loads(run.stdout)
    report["exit_code"] = run.returncode
    report["wall_seconds"] = round(wall, 1)
    return report


def _cell(value: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def _draws(report: dict[str, Any]) -> str:
    draws = [v for v in report.get("simulated_draws_at_130", []) if v is not None]
    return f" ({min(draws):.2f}–{max(draws):.2f})" if len(draws) > 1 else ""


def _following(report: dict[str, Any]) -> str:
    following = report.get("model_following_live")
    return "-" if following is None else f"{following['divergences']} of {following['pods']}"


def markdown(reports: list[dict[str, Any]], command: str, machine: str) -> str:
    lines = [
        "# Live replay of openb against the product model",
        "",
        "`gpupack replay` (docs/replay.md) submits the protocol's arrivals one at a time to the real stack: "
        "kube-apiserver, etcd, kube-scheduler (the shipped configuration), kwok playing the kubelet of one KWOK "
        "Node per sampled openb node, `gpupack agent fleet` serving their simulated GPUs with the emulated NVIDIA "
        "device plugin, the webhook over TLS and the controller. The product model and the FGD protocol run on "
        "the same plan (nodes, pods, order); the product model's figure is the mean of its draws of "
        "kube-scheduler's random ties (their range in brackets), as a live run is one draw of them. *Live decisions the model would not make*: the product model run "
        "again with its ties broken the live run's way (`model_following_live`); 0 means every live decision is "
        "one the model's rules make, and what remains between live and model is how kube-scheduler's ties fell.",
        "",
        f"Machine: {machine}.",
        "",
        f"    {command}",
        "",
        "| workload | nodes (GPUs) | pods | live at 130 % | product model | live − model | live decisions the model would not make | FGD protocol | never placed live (by) | never placed, model | bound p50 / p95 s | run |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|---:|",
    ]
    for r in reports:
        at = r["alloc_at_130"] if r.get("complete", True) else r["compared_at"]
        by = ", ".join(f"{k} {v}" for k, v in r["unplaceable_by"].items()) or "none"
        lines.append(
            f"| {r['workload'].removeprefix('openb_pod_list_')} | {r['nodes_used']} ({r['gpus_used']}) | "
            f"{r['pods_submitted']} | {_cell(at['live'])} | {_cell(at['simulated'])}{_draws(r) if r.get('complete', True) else ''} | "
            f"{_cell(at['live_minus_simulated'], '{:+.2f}')} | {_following(r)} | {_cell(at['fgd'])} | "
            f"{r['pods_unplaceable'] + r['pods_timed_out']} ({by}) | {r['simulated_failed_pods']} | "
            f"{_cell(r['bound_seconds_p50'])} / {_cell(r['bound_seconds_p95'])} | {r['wall_seconds'] / 60:.1f} min |")
    for r in reports:
        if not r.get("complete", True):
            lines += ["", f"**{r['workload'].removeprefix('openb_pod_list_')} stopped early** ({r['stopped']}) after "
                          f"{r['pods_submitted']} of {r['pods_planned']} pods: its row compares live and models at "
                          f"{r['compared_at']['level']} % arrived demand, the highest level it completed, not 130 %."]
    lines += ["", "Costs during the submissions (CPU seconds, peak RSS MiB; API requests of every client by verb):", "",
              "| workload | controller | webhook | agent fleet | API requests |", "|---|---|---|---|---|"]
    for r in reports:
        c = r["components"]
        cells = [f"{c[n]['cpu_seconds']:.1f} s, {c[n]['peak_rss_mib']:.0f} MiB" for n in ("controller", "webhook", "agents")]
        verbs = ", ".join(f"{k} {v}" for k, v in r["api_requests"].items())
        lines.append(f"| {r['workload'].removeprefix('openb_pod_list_')} | {' | '.join(cells)} | {verbs} |")
    return "\n".join(lines) + "\n"


def _max_nodes(text: str) -> int | None:
    if text == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of nodes or 'all', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 node, got {value}")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=TRACES, help=f"the openb traces (default {TRACES})")
    parser.add_argument("--workloads", nargs="+", default=["default", "gpushare40"])
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--max-nodes", type=_max_nodes, default=200,
                        help="the seed's sample of this many nodes, or 'all' for the whole cluster (1,213 nodes; "
                             "hours per workload) (default 200)")
    parser.add_argument("--timeout", type=float, default=3 * 3600.0, help="per run, seconds (default 3 h)")
    parser.add_argument("--stop-after", type=float, default=None, metavar="MINUTES",
                        help="each run submits no pod after MINUTES of submissions and reports those it did "
                             "(gpupack replay --stop-after): to fit a deadline without losing the run")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "replay.json")
    parser.add_argument("--markdown", type=Path, default=ROOT / "benchmarks" / "replay.md")
    args = parser.parse_args()
    if not (args.traces / "openb_node_list_gpu_node.csv").is_file():
        parser.error(f"no openb traces in {args.traces} (docs/simulator.md, 'Getting the traces')")
    reports = []
    for workload in args.workloads:
        print(f"{workload}: replaying {args.max_nodes or 'all'} nodes, seed {args.seed} ...", file=sys.stderr, flush=True)
        plot = args.out.with_name(f"{args.out.stem}_{workload}.png")
        reports.append(run_one(args.traces, workload, args.seed, args.max_nodes, plot, args.timeout, args.stop_after))
        at = reports[-1]["alloc_at_130"] if reports[-1]["complete"] else reports[-1]["compared_at"]
        print(f"{workload}: live {at['live']}, product model {at['simulated']}, FGD {at['fgd']} "
              f"({reports[-1]['wall_seconds'] / 60:.1f} min)", file=sys.stderr, flush=True)
    command = "python benchmarks/replay.py " + " ".join(sys.argv[1:])
    machine = f"{os.cpu_count()} CPU(s), Python {platform.python_version()}, {platform.system()}"
    # Per pod only its node (None: never placed), in submission order: enough to follow the run again
    # with a later model (gpupack.replay.figures.follow_live) without replaying it.
    slim = [{**{k: v for k, v in r.items() if k != "pods"}, "pod_nodes": [p["node"] for p in r["pods"]]}
            for r in reports]
    args.out.write_text(json.dumps({"command": command, "machine": machine, "runs": slim}, indent=2) + "\n")
    args.markdown.write_text(markdown(reports, command, machine))
    print(markdown(reports, command, machine))
    return 0 if all(r["exit_code"] == 0 for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
