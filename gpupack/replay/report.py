"""The replay's output: one JSON object, a summary table, and a plot of allocation against arrived demand."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from gpupack.replay.figures import Following, Levels, ModelFigures, final_alloc_percent, level_at, percentile
from gpupack.replay.runner import LiveRun, live_levels, pods_of, withdrawn_milli

TABLE_LEVELS = (10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130)
"""Arrived-demand levels the text summary shows (every level is in the JSON)."""


def _levels_json(levels: Levels) -> dict[str, float | None]:
    return {str(k): v for k, v in levels.items()}


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


FIRST_DIVERGENCES = 10
"""Divergences listed one by one in the report (all are counted)."""


def as_json(live: LiveRun, models: ModelFigures, *, workload: str, policy: str, inflate: float,
            seconds: float, following: Following | None = None) -> dict[str, Any]:
    """The documented JSON object (docs/replay.md lists every key)."""
    plan = live.plan
    levels = live_levels(live)
    bound_seconds = [r.bound_seconds for r in live.results if r.bound_seconds is not None]
    never = [r for r in live.results if r.result != "bound"]
    top = max((k for k, v in levels.items() if v is not None), default=0)
    live_top, model_top = level_at(levels, 130), level_at(models.product_alloc_at, 130)
    if not live.complete:
        live_top = None  # a run stopped early did not reach the end of the plan
    compared = compared_level(levels, live.complete)
    return {
        "workload": workload,
        "policy": policy,
        "backend": "device-plugin",
        "seed": plan.seed,
        "inflate": inflate,
        "max_nodes": plan.max_nodes,
        "cluster_nodes": plan.cluster_nodes,
        "nodes_used": len(plan.nodes),
        "gpus_used": plan.gpus,
        "agents": live.agents,
        "alloc_at": _levels_json(levels),
        "simulated_alloc_at": _levels_json(models.product_alloc_at),
        "fgd_alloc_at": _levels_json(models.fgd_alloc_at),
        "highest_level": top,
        "alloc_at_130": {"live": live_top, "simulated": model_top, "fgd": level_at(models.fgd_alloc_at, 130),
                         "live_minus_simulated": None if live_top is None or model_top is None
                         else round(live_top - model_top, 2)},
        "complete": live.complete,
        "stopped": live.stopped,
        "compared_at": _compared(compared, levels, models),
        "final_alloc_percent": round(final_alloc_percent([r.pod for r in live.results], live.bound, plan.gpus,
                                                         sum(withdrawn_milli(live))), 2),
        "pods_submitted": len(live.results),
        "pods_planned": len(plan.workload.pods),
        "pods_bound": pods_of(live.results, "bound"),
        "pods_unplaceable": pods_of(live.results, "unplaceable"),
        "pods_timed_out": pods_of(live.results, "timeout"),
        "unplaceable_by": dict(sorted(Counter(str(r.decider) for r in never).items())),
        "simulated_failed_pods": models.product_failed_pods,
        "simulated_draws_at_130": list(models.product_draws_at_130),
        **({"model_following_live": {
            "pods": len(live.results),
            "divergences": len(following.divergences),
            "alloc_at_130": level_at(following.alloc_at, 130) if live.complete else None,
            "alloc_at_compared": None if compared is None else following.alloc_at.get(compared),
            "first_divergences": [{"index": d.index, "pod": d.pod, "live": d.live, "model": d.model}
                                  for d in following.divergences[:FIRST_DIVERGENCES]],
        }} if following is not None else {}),
        "fgd_failed_pods": models.fgd_failed_pods,
        "bound_seconds_p50": _round(percentile(bound_seconds, 50)),
        "bound_seconds_p95": _round(percentile(bound_seconds, 95)),
        "bound_seconds_max": _round(max(bound_seconds, default=None) if bound_seconds else None),
        "never_placed_seconds_p50": _round(percentile([r.decided_seconds for r in never], 50)),
        "api_requests": live.api_requests,
        "api_requests_by_replay": live.replay_requests,
        "components": {name: cost.as_json() for name, cost in live.components.items()},
        "seconds": {"setup": round(live.setup_seconds, 1), "submit": round(live.submit_seconds, 1),
                    "total": round(seconds, 1)},
        "pods": [{"name": r.name, "result": r.result, "node": r.node, "decider": r.decider,
                  "bound_seconds": _round(r.bound_seconds), "decided_seconds": _round(r.decided_seconds),
                  **({"message": r.message} if r.message else {})}
                 for r in live.results],
    }


def compared_level(levels: Levels, complete: bool) -> int | None:
    """The arrived-demand level at which live and models are compared: 130 for a run that went to
    the end; for one stopped early the level below the highest it reached, the highest whose
    attempts it made all of (a level's figure is the mean over the attempts that arrive at it, so
    the top one is cut short); None when it reached none."""
    if complete:
        return 130
    reached = [k for k, v in levels.items() if v is not None]
    return max(reached) - 1 if reached and max(reached) >= 1 else None


def _compared(level: int | None, levels: Levels, models: ModelFigures) -> dict[str, Any]:
    if level is None:
        return {"level": None, "live": None, "simulated": None, "fgd": None, "live_minus_simulated": None}
    live, model = level_at(levels, level), level_at(models.product_alloc_at, level)
    return {"level": level, "live": live, "simulated": model, "fgd": level_at(models.fgd_alloc_at, level),
            "live_minus_simulated": None if live is None or model is None else round(live - model, 2)}


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def as_text(report: dict[str, Any]) -> str:
    """The summary table printed without ``--json``."""
    sample = (f"a seeded sample of {report['nodes_used']} of {report['cluster_nodes']} nodes"
              if report["nodes_used"] < report["cluster_nodes"] else f"all {report['cluster_nodes']} nodes")
    lines = [
        f"workload {report['workload']}, seed {report['seed']}, policy {report['policy']}, "
        f"{report['backend']} backend, {sample} ({report['gpus_used']} GPUs), arrivals to {report['inflate'] * 100:.0f} %",
        "",
        f"{'arrived %':>9}  {'live':>7}  {'product':>7}  {'fgd':>7}",
    ]
    for level in TABLE_LEVELS:
        key = str(level)
        if report["alloc_at"].get(key) is None and report["simulated_alloc_at"].get(key) is None:
            continue
        lines.append(f"{level:>9}  {_cell(report['alloc_at'].get(key)):>7}  "
                     f"{_cell(report['simulated_alloc_at'].get(key)):>7}  {_cell(report['fgd_alloc_at'].get(key)):>7}")
    at = report["alloc_at_130"]
    diff = at["live_minus_simulated"]
    stopped = [] if report["complete"] else [_stopped_line(report)]
    lines += [
        "",
        *stopped,
        f"at 130 % (or the highest level reached): live {_cell(at['live'])}, product model {_cell(at['simulated'])} "
        f"(mean of {len(report['simulated_draws_at_130'])} draws of kube-scheduler's ties: "
        f"{', '.join(_cell(v) for v in report['simulated_draws_at_130'])}) "
        f"(live - model {'-' if diff is None else f'{diff:+.2f}'}), FGD protocol {_cell(at['fgd'])}",
        f"pods: {report['pods_submitted']} submitted, {report['pods_bound']} bound, {report['pods_unplaceable']} "
        f"never placed ({', '.join(f'{k} {v}' for k, v in report['unplaceable_by'].items()) or 'none'})"
        + (f", {report['pods_timed_out']} timed out" if report["pods_timed_out"] else "")
        + f"; the product model never placed {report['simulated_failed_pods']}",
        *([_following_line(report["model_following_live"])] if "model_following_live" in report else []),
        f"creation to bound: p50 {_cell(report['bound_seconds_p50'])} s, p95 {_cell(report['bound_seconds_p95'])} s",
        "",
        f"{'component':<11} {'CPU s':>8} {'peak RSS MiB':>13} {'processes':>10}",
    ]
    for name, cost in report["components"].items():
        lines.append(f"{name:<11} {cost['cpu_seconds']:>8.1f} {cost['peak_rss_mib']:>13.1f} {cost['processes']:>10}")
    verbs = ", ".join(f"{k} {v}" for k, v in report["api_requests"].items())
    mine = ", ".join(f"{k} {v}" for k, v in report["api_requests_by_replay"].items())
    seconds = report["seconds"]
    lines += [
        "",
        f"API requests during the submissions (every client): {verbs or 'none'}; the replay's own: {mine or 'none'}",
        f"agents: {report['agents']}; time: setup {seconds['setup']:.0f} s, submissions {seconds['submit']:.0f} s, "
        f"total {seconds['total']:.0f} s",
    ]
    return "\n".join(lines)


def _stopped_line(report: dict[str, Any]) -> str:
    why = {"budget": "--stop-after ran out", "interrupted": "interrupted"}.get(str(report["stopped"]), str(report["stopped"]))
    at = report["compared_at"]
    head = f"STOPPED EARLY ({why}) after {report['pods_submitted']} of {report['pods_planned']} pods"
    if at["level"] is None:
        return head + ": no arrived-demand level completed, nothing to compare"
    diff = at["live_minus_simulated"]
    return (head + f"; at {at['level']} % arrived, the highest level completed: live {_cell(at['live'])}, product "
            f"model {_cell(at['simulated'])} (live - model {'-' if diff is None else f'{diff:+.2f}'}), "
            f"FGD protocol {_cell(at['fgd'])}")


def _following_line(following: dict[str, Any]) -> str:
    n = following["divergences"]
    head = (f"the product model with its ties broken the live run's way places {n} of {following['pods']} pods "
            f"otherwise")
    if n == 0:
        value = following["alloc_at_130"] if following["alloc_at_130"] is not None else following.get("alloc_at_compared")
        return head + " (every live decision is one the model's rules make; it then allocates " \
            f"{_cell(value)} as live does)"
    first = following["first_divergences"][0]
    return head + f" (first: #{first['index']} {first['pod']}, live {first['live']}, model {first['model']})"


def plot(report: dict[str, Any], path: Path) -> None:
    """Allocation % against arrived demand %: live, product model, FGD protocol. ImportError without
    matplotlib (``pip install -e '.[test]'``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label, style in (("fgd_alloc_at", "FGD protocol (simulator)", ":"),
                              ("simulated_alloc_at", "product model (simulator)", "--"),
                              ("alloc_at", "live replay", "-")):
        points = sorted((int(k), v) for k, v in report[key].items() if v is not None)
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], style, label=label)
    ax.set_xlabel("arrived GPU demand, % of GPU capacity")
    ax.set_ylabel("GPU allocation, %")
    stopped = "" if report["complete"] else f", stopped after {report['pods_submitted']} of {report['pods_planned']} pods"
    ax.set_title(f"{report['workload']}, seed {report['seed']}, {report['nodes_used']} nodes ({report['gpus_used']} GPUs)"
                 + stopped)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
