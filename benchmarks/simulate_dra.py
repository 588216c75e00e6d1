"""The DRA backend's product model on the openb traces, next to the FGD protocol.

    python benchmarks/simulate_dra.py                          # 13 workloads x 10 seeds, both rules (2-4 h on 2 cores)
    python benchmarks/simulate_dra.py --typical workload       # the FGD protocol's typical pods only (~23 min)
    python benchmarks/simulate_dra.py --workloads default --seeds 1 --jobs 1 --out /tmp/dra.json
    python benchmarks/simulate_dra.py --typical present --seeds 3 --keep   # add the present rule's runs to the JSON

For each workload of the README's table, with the published seeds at 130 %
arrived demand, it runs:

- ``protocol``: gpupack under the FGD paper's protocol (``gpupack simulate
  --model fgd``), the figure the DRA model is measured against;
- ``dra``: BestFit, FGD and gpupack under ``gpupack simulate --model product
  --backend dra`` (``sharing.simulator.dra``, shares in ``--share-unit`` steps,
  CPU-only pods placed by kube-scheduler as they are live): the headline;
- ``dra-cpu-engine``: the same with CPU-only pods placed by the engine's
  policy too (``cpu_pods="engine"``), the assumption of the issue's measurement
  of per-pod shares: it says how much of the gap to the protocol is the
  rounding and how much is kube-scheduler's placement of CPU-only pods.

FGD and gpupack run under both typical-pods rules of the DRA model
(``--typical``): ``present``, the live controller's (the GPU pods that exist,
rebuilt at most every ``--typical-every`` arrivals: the pods one planning
cycle sees), the headline; and ``workload``, the FGD protocol's (every pod of
the run), for reference. BestFit reads no typical pods: one run serves both.
``present`` rebuilds gpupack's policy (its LP of packing prices) each time the
table changes, nearly every GPU pod at ``--typical-every 1``: some 20 minutes
a run on the project's 2-core VM, against 5 s under ``workload``; at
``--typical-every 50`` about 20-150 s a run, 8.5 to 21 minutes a seed of all
13 workloads with 2 workers (docs/simulator.md, "The DRA backend", says why 50
and what it changes).

It writes ``benchmarks/dra_results.json`` and the "DRA backend" section of
``benchmarks/RESULTS.md`` (between its own markers, after the product model's
section; ``simulate_openb.py`` and ``simulate_product.py`` keep it), with the
device-plugin product model's gpupack figure from
``benchmarks/product_results.json`` beside it. The issue's targets, checked per
workload: DRA gpupack within 1 point of the protocol's gpupack, and at least
0.5 points above FGD under the DRA model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from collections.abc import Set
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_sections import marked_section, with_marked_section  # noqa: E402
from simulate_product import _trace, replay_arguments  # noqa: E402
from sharing.simulator.dra import (  # noqa: E402
    DEFAULT_SHARE_UNIT,
    DEFAULT_TYPICAL_EVERY,
    TYPICAL_POLICIES,
    TYPICAL_RULES,
    check_share_unit,
    run_dra,
)
from sharing.simulator.replay import run_once  # noqa: E402
from sharing.simulator.scheduler_config import load_weights  # noqa: E402
from sharing.simulator.workload import published_seeds  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "dra_results.json"
WORKLOADS = ("default", "cpu050", "cpu100", "cpu200", "gpushare40", "gpushare60", "gpushare80",
             "gpuspec10", "gpuspec20", "gpuspec25", "multigpu20", "multigpu30", "multigpu40")
UNGUIDED = "kube-scheduler"
"""The ``dra-unguided`` configuration's "policy": kube-scheduler places every pod, its DRA allocator
taking the first devices that fit (``run_dra(gpu_pods="scheduler")``): the same slices without pins."""
CONFIGS = (
    ("protocol", "gpupack"),
    ("dra", "BestFit"), ("dra", "FGD"), ("dra", "gpupack"),
    ("dra-cpu-engine", "BestFit"), ("dra-cpu-engine", "FGD"), ("dra-cpu-engine", "gpupack"),
    ("dra-unguided", UNGUIDED),
)
WITHIN_POINTS = 1.0
"""Target: DRA gpupack at most this far below the FGD protocol's gpupack."""
ABOVE_FGD_POINTS = 0.5
"""Target: DRA gpupack at least this far above FGD under the DRA model."""

BEGIN = "<!-- dra-model:begin (benchmarks/simulate_dra.py) -->"
END = "<!-- dra-model:end -->"
PRODUCT_END = "<!-- product-model:end -->"


Job = tuple[str, str, str, int, str, int, str, int]
"""workload, config, policy, seed, traces folder, share unit, typical-pods rule, arrivals per rebuild."""


def run_key(workload: str, config: str, policy: str, seed: int, typical: str) -> tuple[str, str, str, int, str]:
    """What identifies a run: the typical-pods rule only where it matters (FGD and gpupack under the
    DRA model; the protocol has its own, BestFit reads none)."""
    matters = config != "protocol" and policy in TYPICAL_POLICIES
    return workload, config, policy, seed, typical if matters else "-"


def _key_of(run: dict[str, Any]) -> tuple[str, str, str, int, str]:
    # Runs written before the rule existed are the FGD protocol's rule.
    return run_key(run["workload"], run["config"], run["policy"], run["seed"], run.get("typical", "workload"))


def jobs_for(workloads: list[str], seeds: tuple[int, ...], rules: list[str], traces: str, unit: int,
             every: int, done: Set[tuple[str, str, str, int, str]] = frozenset()) -> list[Job]:
    """The runs of ``rules`` not in ``done``: FGD and gpupack once per rule, the protocol (its own
    rule, ``workload``) and BestFit (no typical pods) once."""
    out: list[Job] = []
    # Seeds outermost: the first seeds of every workload finish first, so a cut-short run still reports.
    for seed in seeds:
        for w in workloads:
            for config, policy in CONFIGS:
                own = ["workload"] if config == "protocol" else rules if policy in TYPICAL_POLICIES else rules[:1]
                out += [(w, config, policy, seed, traces, unit, rule, every) for rule in own
                        if run_key(w, config, policy, seed, rule) not in done]
    return out


def _one(job: Job) -> dict[str, Any]:
    workload, config, policy, seed, traces, unit, typical, every = job
    nodes, pods = _trace(traces, workload)
    start = time.perf_counter()
    out: dict[str, Any] = {"workload": workload, "config": config, "policy": policy, "seed": seed, "typical": typical}
    if config == "protocol":
        proto = run_once(nodes, pods, policy, seed)
        out.update(alloc_130=proto.alloc_at[130], failed_pods=proto.failed_pods)
    else:
        cpu_pods = "engine" if config == "dra-cpu-engine" else "scheduler"
        unguided = config == "dra-unguided"
        run = run_dra(nodes, pods, "BestFit" if unguided else policy, seed, load_weights(), unit,
                      cpu_pods,  # type: ignore[arg-type]
                      typical=typical, typical_every=every,  # type: ignore[arg-type]
                      gpu_pods="scheduler" if unguided else "engine")
        out.update(
            alloc_130=run.alloc_at[130], occupied_130=run.occupied_at[130], failed_pods=run.failed_pods,
            split=dataclasses.asdict(run.split), gpu_modes=run.gpu_modes, decision_us_median=run.decision_us_median,
            policy_builds=run.policy_builds,
        )
        if typical == "present" and policy in TYPICAL_POLICIES:
            out["typical_every"] = every
    out["wall_s"] = round(time.perf_counter() - start, 2)
    return out


def dra_section(results: Path) -> str:
    """The marked DRA section of ``results`` (RESULTS.md), or "" when it has none."""
    return marked_section(results, BEGIN, END)


def with_dra_section(text: str, section: str) -> str:
    """``text`` with ``section`` replacing its marked DRA section, or inserted after the product
    model's section (after the title when there is none)."""
    return with_marked_section(text, section, BEGIN, END, after=PRODUCT_END)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _device_plugin_figures() -> dict[str, float]:
    """gpupack under the device-plugin product model (engine live path), from product_results.json."""
    path = HERE / "product_results.json"
    if not path.exists():
        return {}
    runs = [r for r in json.loads(path.read_text())["runs"] if (r["live_path"], r["policy"]) == ("engine", "gpupack")]
    return {w: _mean([r["alloc_130"] for r in runs if r["workload"] == w]) for w in {r["workload"] for r in runs}}


def _cells(data: dict[str, Any]) -> dict[tuple[str, str, str, int, str], dict[str, Any]]:
    """The runs of ``data``'s seeds (the JSON may keep others), by ``run_key``."""
    seeds = set(data["seeds"])
    return {_key_of(r): r for r in data["runs"] if r["seed"] in seeds}


def targets(data: dict[str, Any], config: str, typical: str = "workload") -> dict[str, dict[str, float | bool]]:
    """Per workload: the figures of ``config`` under the ``typical`` rule (means over ``data``'s
    seeds) and whether each of the issue's targets is met; workloads missing a run are left out."""
    runs = _cells(data)

    def cell(w: str, c: str, policy: str) -> float | None:
        rule = "workload" if c == "protocol" else typical
        got = [runs.get(run_key(w, c, policy, seed, rule)) for seed in data["seeds"]]
        return None if any(r is None for r in got) else _mean([r["alloc_130"] for r in got if r is not None])

    out: dict[str, dict[str, float | bool]] = {}
    for w in WORKLOADS:
        figures = cell(w, "protocol", "gpupack"), cell(w, config, "BestFit"), cell(w, config, "FGD"), cell(w, config, "gpupack")
        if any(f is None for f in figures):
            continue
        proto, bf, fgd, gp = (float(f or 0.0) for f in figures)
        out[w] = {
            "protocol_gpupack": proto, "BestFit": bf, "FGD": fgd, "gpupack": gp,
            "gap_to_protocol": gp - proto, "above_FGD": gp - fgd, "above_BestFit": gp - bf,
            "within_1_point": proto - gp <= WITHIN_POINTS, "above_FGD_by_half": gp - fgd >= ABOVE_FGD_POINTS,
        }
        unguided = cell(w, "dra-unguided", UNGUIDED)
        if unguided is not None:
            out[w].update(unguided=unguided, above_unguided=gp - unguided, beats_unguided=gp > unguided)
    return out


def _yes(ok: float | bool) -> str:
    return "yes" if ok else "**no**"


def rules_of(data: dict[str, Any]) -> tuple[str, str | None]:
    """The typical-pods rule the tables lead with (``present`` when it ran, the live rule) and the
    other rule shown beside it for reference (None when it did not run)."""
    ran = {_key_of(r)[4] for r in data["runs"]} & set(TYPICAL_RULES)
    lead = "present" if "present" in ran else "workload"
    other = next((rule for rule in TYPICAL_RULES if rule != lead and rule in ran), None)
    return lead, other


def _table(data: dict[str, Any], config: str, device_plugin: dict[str, float] | None) -> list[str]:
    lead, other = rules_of(data)
    main = targets(data, config, lead)
    ref = {w: t for w, t in targets(data, config, other).items() if w in main} if other else {}
    head = "| workload | FGD protocol, gpupack | " + ("device-plugin product, gpupack | " if device_plugin is not None else "")
    head += ("DRA: BestFit | DRA: FGD | **DRA: gpupack** | gpupack − protocol | within 1 point | gpupack − FGD | "
             "≥ +0.5 over FGD | gpupack − BestFit |")
    unguided = any("unguided" in t for t in main.values())
    if unguided:
        head += " DRA: kube-scheduler unguided | gpupack − unguided |"
    if other:
        head += f" {other} rule: FGD | {other} rule: gpupack | {other} rule: gpupack − FGD |"
    lines = [head, "|" + "---|" * (head.count(" | ") + 1)]
    for w, t in main.items():
        row = f"| {w} | {t['protocol_gpupack']:.2f} | "
        if device_plugin is not None:
            dp = device_plugin.get(w)
            row += f"{'-' if dp is None else f'{dp:.2f}'} | "
        row += (f"{t['BestFit']:.2f} | {t['FGD']:.2f} | **{t['gpupack']:.2f}** | {t['gap_to_protocol']:+.2f} | "
                f"{_yes(t['within_1_point'])} | {t['above_FGD']:+.2f} | {_yes(t['above_FGD_by_half'])} | "
                f"{t['above_BestFit']:+.2f} |")
        if unguided:
            row += (" - | - |" if "unguided" not in t else
                    f" {t['unguided']:.2f} | {t['above_unguided']:+.2f}{'' if t['beats_unguided'] else ' **no**'} |")
        if other:
            r = ref.get(w)
            row += " - | - | - |" if r is None else f" {r['FGD']:.2f} | {r['gpupack']:.2f} | {r['above_FGD']:+.2f} |"
        lines.append(row)
    met = [sum(bool(t[k]) for t in main.values()) for k in ("within_1_point", "above_FGD_by_half")]
    lines += ["", f"Targets met under the {lead} rule: within 1 point of the protocol on {met[0]} of {len(main)} "
                  f"workloads, ≥ +0.5 over FGD on {met[1]} of {len(main)}."]
    if unguided:
        beats = [t for t in main.values() if "unguided" in t]
        lines[-1] += (f" Above kube-scheduler's unguided allocation on {sum(bool(t['beats_unguided']) for t in beats)} "
                      f"of {len(beats)} (by {min(float(t['above_unguided']) for t in beats):+.2f} to "
                      f"{max(float(t['above_unguided']) for t in beats):+.2f}).")
    if ref:
        met = [sum(bool(t[k]) for t in ref.values()) for k in ("within_1_point", "above_FGD_by_half")]
        lines[-1] += (f" Under the {other} rule: within 1 point on {met[0]} of {len(ref)}, ≥ +0.5 over FGD on "
                      f"{met[1]} of {len(ref)}.")
    return lines


def render(data: dict[str, Any]) -> str:
    lead, _ = rules_of(data)
    lines = [
        "CPU-only pods left to kube-scheduler (live: pods that ask for no GPU and are not labelled "
        "`gpupack.io/backend=dra`):",
        "",
        *_table(data, "dra", _device_plugin_figures()),
        "",
        "The same with CPU-only pods placed by the engine's policy too (`cpu_pods=\"engine\"`; live: pods that ask "
        "for no GPU labelled `gpupack.io/backend=dra`, which the webhook gates and the controller places, "
        "docs/dra-pods.md; the issue's measurement of per-pod shares assumed it):",
        "",
        *_table(data, "dra-cpu-engine", None),
        "",
        f"Where the capacity goes at the end of the run (DRA model, gpupack, {lead} rule, % of GPU milli; "
        "kube-scheduler / engine placing CPU-only pods):",
        "",
        "| workload | requested | share rounding | free on GPUs holding shares | free GPUs | occupied |",
        "|---|---|---|---|---|---|",
    ]
    runs = _cells(data)
    for w in targets(data, "dra", lead):
        cols = []
        for key in ("requested", "share_rounding", "free_on_shared_gpus", "free_gpus", "occupied"):
            pair = []
            for config in ("dra", "dra-cpu-engine"):
                sel = [runs.get(run_key(w, config, "gpupack", seed, lead)) for seed in data["seeds"]]
                got = [r for r in sel if r is not None]
                pair.append(_mean([r["occupied_130"] if key == "occupied" else r["split"][key] for r in got])
                            if len(got) == len(sel) else None)
            cols.append(" / ".join("-" if v is None else f"{v:.2f}" for v in pair))
        lines.append(f"| {w} | " + " | ".join(cols) + " |")
    return "\n".join(lines)


MIG_OUT = HERE / "dra_mig_results.json"
"""``simulate_dra_mig.py``'s runs: the DRA model on MIG GPUs, shown in this section when present."""


def render_mig(path: Path = MIG_OUT) -> list[str]:
    """The "MIG GPUs" part of the section, from ``simulate_dra_mig.py``'s JSON ([] without it)."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in data["runs"]:
        by.setdefault((run["workload"], run["placer"]), []).append(run)
    lines = [
        "",
        f"### MIG GPUs: {data['model']} in dynamic mode (partitionable devices)",
        "",
        f"`{data['command']}` ({data['machine']}; {data['date']} UTC, {data['wall_s'] / 60:.1f} min; "
        f"seeds {data['seeds'][0]}..{data['seeds'][-1]}): every openb node with its GPUs made {data['model']} GPUs, "
        "the protocol's arrivals at 130 %, each GPU pod a claim for the smallest profile covering its compute and "
        "memory share (`sharing.simulator.dra_mig`, docs/simulator.md). *gpupack*: the controller's choice pinned "
        "(`sharing.dra.mig_choice.place_pod`: the node with the best MostAllocated score over CPU, memory and MIG "
        "compute slices held, then the GPU and placement); *unguided*: kube-scheduler's node (MostAllocated on CPU and memory) and its "
        "allocator's first fit. *occupied*: compute slices the instances hold. The GPU type a pod asks for "
        "(`gpu_spec`) is dropped, as every GPU is one model: gpuspec10/20/25 are default's pods with types asked, so "
        "they replay as default does.",
        "",
        "| workload | gpupack | unguided | gpupack − unguided | occupied, gpupack / unguided | never placed, gpupack / unguided |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    diffs = []
    for w in WORKLOADS:
        engine, unguided = by.get((w, "engine")), by.get((w, "scheduler"))
        if not engine or not unguided or len(engine) != len(unguided):
            continue
        e, u = _mean([r["alloc_130"] for r in engine]), _mean([r["alloc_130"] for r in unguided])
        diffs.append(e - u)
        lines.append(f"| {w} | {e:.2f} | {u:.2f} | {e - u:+.2f} | {_mean([r['occupied_130'] for r in engine]):.2f} / "
                     f"{_mean([r['occupied_130'] for r in unguided]):.2f} | "
                     f"{_mean([r['failed_pods'] for r in engine]):.0f} / {_mean([r['failed_pods'] for r in unguided]):.0f} |")
    if diffs:
        lines += ["", f"gpupack above unguided on {sum(d > 0 for d in diffs)} of {len(diffs)} workloads "
                      f"({min(diffs):+.2f} to {max(diffs):+.2f}, mean {_mean(diffs):+.2f})."]
    return lines


def write_section(data: dict[str, Any], results: Path | None) -> None:
    """Print the section; also put it into ``results`` (RESULTS.md) when given."""
    section = "\n".join([
        BEGIN,
        "## The DRA backend's product model (consumable capacity)",
        "",
        f"Generated by `python benchmarks/simulate_dra.py`: `gpupack simulate --model product --backend dra "
        f"--share-unit {data['share_unit']}` (docs/simulator.md, \"The DRA backend\"), seeds "
        f"{data['seeds'][0]}..{data['seeds'][-1]}, allocation % (milli the pods asked for) at 130 % arrived demand, "
        "mean of the seeds.",
        "",
        *[f"- {_invocation(h)}" for h in (data["history"] if "history" in data else [_legacy_invocation(data)])],
        "",
        "FGD and gpupack measure fragmentation against typical pods. The **present** rule is the live "
        "controller's: the pods that exist (placed and pending, as claimed; CPU-only pods only where the engine "
        "places them), the policy "
        f"rebuilt when that table changes, at most once per {data.get('typical_every', DEFAULT_TYPICAL_EVERY)} "
        "arrivals (the pods one planning cycle plans with one policy: docs/simulator.md, \"The DRA backend\"). "
        "The **workload** rule is the FGD protocol's: every pod of the run, known in advance; its figures are "
        "shown for reference. The tables lead with the present rule where it ran.",
        "",
        f"A fractional pod claims its share rounded up to {data['share_unit']} milli on any GPU with room; "
        "whole-GPU pods take GPUs with no share on them; the engine (with the policy named) places every GPU pod, "
        "and CPU-only pods are placed by kube-scheduler (the weights `manifests/` ships) in the first table, by the "
        "engine in the second. The FGD-protocol column is gpupack "
        "under the paper's protocol, run again here with the same seeds; the device-plugin column is gpupack under "
        "the device-plugin backend's product model (the section above). *kube-scheduler unguided*: the same slices "
        "without gpupack's pins: kube-scheduler places every pod (MostAllocated on CPU and memory) and its DRA "
        "allocator takes the first devices that fit on that node, GPU 0 first (`run_dra(gpu_pods=\"scheduler\")`, "
        "the baseline of the issue's item 2). The issue's targets: DRA gpupack within "
        "1 point of the FGD-protocol figure, and at least 0.5 points above FGD under the same model. Where the gap "
        "goes, and what would close it: docs/simulator.md, \"DRA model results\".",
        "",
        render(data),
        *render_mig(),
        END,
    ])
    if results is not None:
        text = results.read_text() if results.exists() else "# Packing results on the Alibaba openb traces\n"
        results.write_text(with_dra_section(text, section))
    print(section)


def _invocation(h: dict[str, Any]) -> str:
    rules = ", ".join(h.get("typical", ["workload"]))
    every = f", rebuilt at most every {h['typical_every']} arrivals" if "present" in h.get("typical", []) else ""
    return (f"`{h.get('command', 'python benchmarks/simulate_dra.py')}`: {h['runs']} runs, typical-pods rule(s) "
            f"{rules}{every}, seeds {h['seeds'][0]}..{h['seeds'][-1]}; machine {h['machine']}; run at {h['date']} "
            f"UTC, {h['wall_s'] / 60:.1f} min with {h['jobs']} worker process(es), on a machine shared with other "
            "builds.")


def _legacy_invocation(data: dict[str, Any]) -> dict[str, Any]:
    """The one invocation of a JSON written before runs could be added to it."""
    keys = ("machine", "date", "wall_s", "jobs", "seeds")
    return {**{k: data[k] for k in keys}, "typical": ["workload"], "runs": len(data["runs"])}


def main() -> None:
    ap = replay_arguments(__doc__, seeds=10)
    ap.add_argument("--share-unit", type=int, default=DEFAULT_SHARE_UNIT, metavar="MILLI",
                    help=f"the request policy's step (default {DEFAULT_SHARE_UNIT})")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help="raw results; RESULTS.md is rewritten only when this is the default file")
    ap.add_argument("--typical", default=",".join(TYPICAL_RULES), metavar="RULES",
                    help=f"typical-pods rules for FGD and gpupack, comma-separated (default {','.join(TYPICAL_RULES)})")
    ap.add_argument("--typical-every", type=int, default=DEFAULT_TYPICAL_EVERY, metavar="K",
                    help=f"under present, rebuild the typical pods at most every K arrivals (default "
                    f"{DEFAULT_TYPICAL_EVERY}; 1: before every pod that changes them, some 10 min a gpupack run)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the runs already in --out and run only those missing (to add a rule or seeds)")
    ap.add_argument("--from-json", action="store_true",
                    help="run nothing: re-render the tables from --out (and RESULTS.md when --out is the default)")
    args = ap.parse_args()
    results = HERE / "RESULTS.md" if args.out == DEFAULT_OUT else None
    if args.from_json:
        write_section(json.loads(args.out.read_text()), results)
        return
    try:
        check_share_unit(args.share_unit, "--share-unit")
    except ValueError as exc:
        sys.exit(str(exc))
    if not (args.traces / "openb_node_list_gpu_node.csv").exists():
        sys.exit(f"no openb traces in {args.traces} (see README: they live beside the checkout)")
    rules = args.typical.split(",")
    if not rules or any(rule not in TYPICAL_RULES for rule in rules):
        sys.exit(f"--typical: choose among {', '.join(TYPICAL_RULES)}, got {args.typical!r}")
    if args.typical_every < 1:
        sys.exit(f"--typical-every must be at least 1, got {args.typical_every}")
    old: dict[str, Any] = json.loads(args.out.read_text()) if args.keep and args.out.exists() else {}
    if old and old["share_unit"] != args.share_unit:
        sys.exit(f"--keep: {args.out} was run with --share-unit {old['share_unit']}, not {args.share_unit}")
    if old and "present" in rules and old.get("typical_every", args.typical_every) != args.typical_every:
        sys.exit(f"--keep: {args.out}'s present runs rebuilt every {old['typical_every']} arrivals, not "
                 f"{args.typical_every}")
    kept = old.get("runs", [])
    workloads = args.workloads.split(",")
    seeds = published_seeds(args.seeds)
    jobs = jobs_for(workloads, seeds, rules, str(args.traces), args.share_unit, args.typical_every,
                    {_key_of(r) for r in kept})
    start = time.perf_counter()
    runs = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for i, result in enumerate(pool.map(_one, jobs), 1):
            runs.append(result)
            elapsed = time.perf_counter() - start
            print(f"[{i}/{len(jobs)} {elapsed / 60:.1f} min, about {elapsed / i * (len(jobs) - i) / 60:.1f} left] "
                  f"{result['workload']} {result['config']} {result['policy']} seed {result['seed']}: "
                  f"{result['alloc_130']:.2f} ({result['wall_s']:.1f} s)", file=sys.stderr, flush=True)
    cpu = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "unknown CPU")
    invocation = {
        "command": "python benchmarks/simulate_dra.py " + " ".join(sys.argv[1:]),
        "machine": f"{os.cpu_count()} CPU(s) ({cpu}), Python {platform.python_version()}, {platform.system()}",
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "wall_s": time.perf_counter() - start,
        "jobs": args.jobs,
        "seeds": list(seeds),
        "typical": rules,
        "typical_every": args.typical_every,
        "runs": len(runs),
    }
    history = (old.get("history") or [_legacy_invocation(old)]) if old else []
    data: dict[str, Any] = {
        "share_unit": args.share_unit,
        "seeds": list(seeds),
        "typical_every": args.typical_every if "present" in rules else old.get("typical_every", args.typical_every),
        "history": [*history, invocation],
        "runs": [*kept, *runs],
    }
    data["targets"] = {f"{config}/{rule}": targets(data, config, rule)
                       for config in ("dra", "dra-cpu-engine") for rule in TYPICAL_RULES}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    # A trial run (--out elsewhere, fewer workloads or seeds) must not replace the published tables.
    write_section(data, results)


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


if __name__ == "__main__":
    main()
