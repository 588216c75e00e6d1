"""``gpupack mig ...``: the MIG geometry engine from the command line.

Exit codes: 0 = yes/success, 1 = no (does not fit, nothing covers, unreachable),
2 = bad input (unknown model or profile, bad quantity, malformed config).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpupack.cli import EXIT_BAD_INPUT, EXIT_NO, EXIT_OK, UsageError
from kube.inputfile import InputFileError, read_text
from mig.catalog import all_models, get_model
from mig.errors import MigError
from mig.fit import coverings_across, smallest_covering_profile
from mig.geometry import fits, maximal_layouts, validate_layout
from mig.migparted import builtin_configs, check_against_catalog, dump_config, parse_config
from mig.model import GpuModel, PlacedInstance, Placement, Profile
from mig.reach import plan_reconfiguration
from mig.units import format_mib, parse_memory

_MODEL_HELP = "GPU model: a GPU feature discovery product name (NVIDIA-H100-80GB-HBM3) or an alias (A30, A100-40GB, A100-80GB, H100, H100-NVL, H200, GH200, B200); see `gpupack mig models`"


def _model(name: str) -> GpuModel:
    try:
        return get_model(name)
    except MigError as exc:
        raise UsageError(str(exc)) from None


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    cells = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _profile_json(profile: Profile) -> dict[str, Any]:
    return {
        "name": profile.name,
        "resource": profile.resource_name,
        "profile_id": profile.profile_id,
        "nvml_index": profile.nvml_index,
        "compute_slices": profile.compute_slices,
        "memory_slices": profile.memory_slices,
        "memory_mib": profile.memory_mib,
        "max_count": profile.max_count,
        "media_extensions": profile.media_extensions,
        "placements": [{"start": p.start, "size": p.size} for p in profile.placements],
    }


def _instances_json(instances: Sequence[PlacedInstance]) -> list[dict[str, Any]]:
    return [{"profile": i.profile, "start": i.placement.start, "size": i.placement.size} for i in instances]


def cmd_models(args: argparse.Namespace) -> int:
    models = all_models()
    if args.json:
        _print_json([{"product": m.product, "name": m.display_name, "aliases": list(m.aliases),
                      "pci_device_ids": list(m.pci_device_ids), "memory_mib": m.memory_mib,
                      "compute_slices": m.compute_slices, "memory_slices": m.memory_slices} for m in models])
        return EXIT_OK
    rows = [(m.product, ", ".join(m.aliases), " ".join(m.pci_device_ids), format_mib(m.memory_mib), len(m.profiles)) for m in models]
    print(_table(rows, ("PRODUCT (nvidia.com/gpu.product)", "ALIASES", "PCI DEVICE IDS", "MEMORY", "PROFILES")))
    return EXIT_OK


def cmd_profiles(args: argparse.Namespace) -> int:
    model = _model(args.gpu)
    if args.json:
        _print_json({"product": model.product, "source": model.source, "profiles": [_profile_json(p) for p in model.profiles]})
        return EXIT_OK
    rows = [(p.name, p.profile_id, f"{p.compute_slices}/{model.compute_slices}", f"{p.memory_slices}/{model.memory_slices}",
             format_mib(p.memory_mib), p.max_count, " ".join(str(pl) for pl in p.placements)) for p in model.profiles]
    print(f"{model.product} ({model.display_name}), {format_mib(model.memory_mib)}")
    print(_table(rows, ("PROFILE", "ID", "COMPUTE", "MEMORY SLICES", "MEMORY", "MAX", "PLACEMENTS (start:size)")))
    print(f"\nsource: {model.source}")
    return EXIT_OK


def _known_profiles(model: GpuModel, names: Sequence[str]) -> None:
    for name in names:
        if not model.has_profile(name):
            raise UsageError(f"unknown MIG profile {name!r} for {model.product}; valid profiles: {', '.join(model.profile_names)}")


def cmd_check(args: argparse.Namespace) -> int:
    model = _model(args.gpu)
    _known_profiles(model, args.profiles)
    placed = fits(model, args.profiles)
    if args.json:
        _print_json({"product": model.product, "fits": placed is not None,
                     "instances": _instances_json(placed) if placed else []})
    elif placed is None:
        print(f"does not fit on {model.product}: {' + '.join(args.profiles)}")
    else:
        print(f"fits on {model.product}:")
        for instance in placed:
            print(f"  {instance.profile:<12} start {instance.placement.start}  size {instance.placement.size}")
    return EXIT_OK if placed is not None else EXIT_NO


def cmd_layouts(args: argparse.Namespace) -> int:
    model = _model(args.gpu)
    layouts = maximal_layouts(model)
    if args.json:
        _print_json({"product": model.product, "maximal_layouts": [list(layout) for layout in layouts]})
        return EXIT_OK
    print(f"{len(layouts)} maximal layouts of {model.product} (no further instance fits in any of them):")
    for layout in layouts:
        counts: dict[str, int] = {}
        for name in layout:
            counts[name] = counts.get(name, 0) + 1
        print("  " + " + ".join(f"{c}x {n}" for n, c in counts.items()))
    return EXIT_OK


def _memory_bytes(text: str) -> int:
    try:
        return parse_memory(text)
    except MigError as exc:
        raise UsageError(str(exc)) from None


def cmd_fit(args: argparse.Namespace) -> int:
    if not 1 <= args.milli <= 1000:
        raise UsageError(f"--milli must be in 1..1000 (1000 = a whole GPU), got {args.milli}")
    memory = _memory_bytes(args.memory)
    models = [_model(name) for name in args.gpu] if args.gpu else list(all_models())
    if len(models) == 1:
        profile = smallest_covering_profile(models[0], args.milli, memory)
        found = [(models[0], profile)] if profile else []
    else:
        found = [(c.model, c.profile) for c in coverings_across(models, args.milli, memory)]
    if args.json:
        _print_json({"milli": args.milli, "memory_bytes": memory,
                     "fits": bool(found),
                     "best": {"product": found[0][0].product, **_profile_json(found[0][1])} if found else None,
                     "candidates": [{"product": m.product, "profile": p.name} for m, p in found]})
    elif not found:
        largest = max((p.memory_mib, p.name, m.product) for m in models for p in m.profiles)
        print(f"no MIG profile covers {args.milli} milli and {args.memory}; "
              f"the largest is {largest[1]} on {largest[2]} with {format_mib(largest[0])}")
    else:
        model, profile = found[0]
        print(f"{profile.name} on {model.product}  (resource {profile.resource_name}, "
              f"{profile.compute_slices}/{model.compute_slices} compute, {format_mib(profile.memory_mib)})")
        for other_model, other in found[1:]:
            print(f"  also: {other.name} on {other_model.product}")
    return EXIT_OK if found else EXIT_NO


def _parse_instance(text: str, model: GpuModel) -> PlacedInstance:
    """``PROFILE@START`` (size from the profile) or ``PROFILE@START:SIZE``."""
    try:
        name, where = text.split("@", 1)
        start_text, _, size_text = where.partition(":")
        start = int(start_text)
    except ValueError:
        raise UsageError(f"instance {text!r} must look like PROFILE@START, e.g. 3g.40gb@4") from None
    _known_profiles(model, [name])
    size = int(size_text) if size_text else model.profile(name).memory_slices
    return PlacedInstance(name, Placement(start, size))


def cmd_plan(args: argparse.Namespace) -> int:
    model = _model(args.gpu)
    current = [_parse_instance(t, model) for t in args.current]
    in_use = [_parse_instance(t, model) for t in args.in_use]
    _known_profiles(model, args.target)
    problem = validate_layout(model, current)
    if problem is not None:
        raise UsageError(f"--current is not a valid layout: {problem}")
    try:
        plan = plan_reconfiguration(model, current, in_use, args.target)
    except MigError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        _print_json({"product": model.product, "reachable": plan is not None,
                     "keep": _instances_json(plan.keep) if plan else [],
                     "destroy": _instances_json(plan.destroy) if plan else [],
                     "create": _instances_json(plan.create) if plan else []})
    elif plan is None:
        print(f"unreachable: {' + '.join(args.target)} cannot be placed on {model.product} without touching an in-use instance")
    else:
        print(f"{plan.steps} step(s) on {model.product}:")
        for instance in plan.destroy:
            print(f"  destroy {instance}")
        for instance in plan.create:
            print(f"  create  {instance}")
        for instance in plan.keep:
            print(f"  keep    {instance}" + ("  (in use)" if instance in in_use else ""))
    return EXIT_OK if plan is not None else EXIT_NO


def cmd_config(args: argparse.Namespace) -> int:
    if args.file is None:
        sys.stdout.write(dump_config(builtin_configs()))
        return EXIT_OK
    path = Path(args.file)
    try:
        text = read_text(path, syntax="yaml")  # bounded in size, type and depth (kube.inputfile)
    except InputFileError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    try:
        config = parse_config(text)
    except MigError as exc:
        raise UsageError(f"{path}: {exc}") from None
    problems = check_against_catalog(config)
    if args.json:
        _print_json({"file": str(path), "configs": list(config.mig_configs), "problems": problems})
    else:
        for problem in problems:
            print(f"{path}: {problem}")
        if not problems:
            print(f"{path}: valid; configs: {', '.join(config.mig_configs)}")
    return EXIT_OK if not problems else EXIT_NO


def cmd_showcase(args: argparse.Namespace) -> int:
    """A short tour of the engine on an H100 (the README's first command)."""
    model = get_model("H100")
    steps: list[tuple[str, list[str]]] = [
        ("Profiles of an H100 80GB", ["profiles", "--gpu", "H100"]),
        ("Do 4g + 2g + 1g fit together? (yes: exit 0)", ["check", "--gpu", "H100", "4g.40gb", "2g.20gb", "1g.10gb"]),
        ("Do 4g + 4g fit? (no: exit 1)", ["check", "--gpu", "H100", "4g.40gb", "4g.40gb"]),
        ("Smallest profile for a quarter GPU with 12Gi", ["fit", "--gpu", "H100", "--milli", "250", "--memory", "12Gi"]),
        ("Best GPU model anywhere for 100 milli and 8Gi", ["fit", "--milli", "100", "--memory", "8Gi"]),
        ("Reshape all-balanced to 3g+3g while the 3g at slice 4 is in use",
         ["plan", "--gpu", "H100", "--current", "1g.10gb@0", "1g.10gb@1", "2g.20gb@2", "3g.40gb@4",
          "--in-use", "3g.40gb@4", "--target", "3g.40gb", "3g.40gb"]),
    ]
    parser = build_mig_parser()
    for title, argv in steps:
        print(f"\n$ gpupack mig {' '.join(argv)}    # {title}")
        sub = parser.parse_args(argv)
        code = sub.handler(sub)
        print(f"(exit {code})")
    print(f"\n{len(maximal_layouts(model))} maximal layouts exist on {model.product}: `gpupack mig layouts --gpu H100`.")
    return EXIT_OK


def _add_commands(sub: Any) -> None:
    def add(name: str, handler: Any, help_text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.set_defaults(handler=handler)
        return parser

    add("models", cmd_models, "list the GPU models in the catalog")
    p = add("profiles", cmd_profiles, "table of a model's MIG profiles")
    p.add_argument("--gpu", required=True, metavar="MODEL", help=_MODEL_HELP)
    p = add("check", cmd_check, "do these profiles fit together on one GPU? (exit 0 yes, 1 no)")
    p.add_argument("--gpu", required=True, metavar="MODEL", help=_MODEL_HELP)
    p.add_argument("profiles", nargs="+", metavar="PROFILE", help="profile names, repeated for several instances (e.g. 1g.10gb 1g.10gb 3g.40gb)")
    p = add("layouts", cmd_layouts, "every maximal layout (no further instance fits)")
    p.add_argument("--gpu", required=True, metavar="MODEL", help=_MODEL_HELP)
    p = add("fit", cmd_fit, "smallest MIG profile covering a compute + memory request (exit 1 if none)")
    p.add_argument("--gpu", action="append", metavar="MODEL", help=_MODEL_HELP + "; repeat to compare models; default: every model")
    p.add_argument("--milli", type=int, required=True, help="compute share in thousandths of a GPU, 1..1000")
    p.add_argument("--memory", default="0", metavar="QTY", help="GPU memory as a Kubernetes quantity (20Gi, 512Mi, 10G); default 0")
    p = add("plan", cmd_plan, "minimal destroy/create steps to a target layout without touching in-use instances (exit 1 if unreachable)")
    p.add_argument("--gpu", required=True, metavar="MODEL", help=_MODEL_HELP)
    p.add_argument("--current", nargs="*", default=[], metavar="PROFILE@START", help="current instances, e.g. 3g.40gb@4")
    p.add_argument("--in-use", nargs="*", default=[], metavar="PROFILE@START", help="current instances that are in use")
    p.add_argument("--target", nargs="+", required=True, metavar="PROFILE", help="target layout as profile names")
    p = add("config", cmd_config, "validate a mig-parted config file against the catalog, or print the built-in configs")
    p.add_argument("file", nargs="?", help="mig-parted YAML to validate (exit 1 if a layout does not fit; at most 16 MiB, GPUPACK_MAX_INPUT_BYTES); omit to print NVIDIA's default configs as generated from the catalog")
    add("showcase", cmd_showcase, "a short tour of the engine")


def build_mig_parser() -> argparse.ArgumentParser:
    from gpupack.cli import _Parser

    parser = _Parser(prog="gpupack mig")
    _add_commands(parser.add_subparsers(dest="mig_command", metavar="COMMAND", parser_class=_Parser))
    return parser


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "mig", help="MIG geometry: profiles, fit checks, layouts, reshaping plans, mig-parted configs",
        description="Exact MIG geometry for A30, A100, H100, H200, GH200 and B200. Exit codes: 0 yes, 1 no, 2 bad input.",
    )
    parser.set_defaults(handler=lambda _args: (parser.print_help(), EXIT_BAD_INPUT)[1])
    from gpupack.cli import _Parser

    _add_commands(parser.add_subparsers(dest="mig_command", metavar="COMMAND", parser_class=_Parser))
