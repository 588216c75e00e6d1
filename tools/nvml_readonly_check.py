#!/usr/bin/env python3
"""READ-ONLY check of the real NVML backend against gpupack's MIG catalog.

For a session on a machine with a GPU: prints each GPU's NVML inventory (name,
PCI device id, memory, MIG mode current/pending), the GPU-instance profiles and
their possible placements as NVML reports them, the existing GPU instances, and
every difference from the ``mig/`` catalog entry of that model.

It never changes anything: no MIG-mode change, no instance created or destroyed,
no reset. The backend is wrapped so that any write method raises.

    python tools/nvml_readonly_check.py [--json]

Exit codes: 0 = matches the catalog, 1 = differences found, 2 = NVML unavailable.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.nvml.catalog_check import check_gpu  # noqa: E402
from node.nvml.errors import NvmlError  # noqa: E402
from node.nvml.real import RealNvml  # noqa: E402

READ_METHODS = {"device_count", "device_info", "instance_profiles", "gpu_instances", "processes", "utilization"}


class ReadOnly:
    """Exposes only the inventory methods of a backend."""

    def __init__(self, backend: RealNvml) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        if name not in READ_METHODS:
            raise PermissionError(f"nvml_readonly_check never calls {name}")
        return getattr(self._backend, name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args()
    try:
        real = RealNvml.open()
    except NvmlError as exc:
        print(f"NVML unavailable: {exc}", file=sys.stderr)
        return 2
    nvml = ReadOnly(real)
    reports = []
    try:
        for index in range(nvml.device_count()):
            report = check_gpu(nvml, index)
            try:
                instances = nvml.gpu_instances(index) if report.info.mig_enabled else ()
            except NvmlError as exc:
                instances = ()
                report = type(report)(report.info, report.model, report.profiles, report.mismatches,
                                      report.notes + (f"instances unreadable: {exc}",))
            reports.append((report, instances, nvml.utilization(index)))
    finally:
        real.close()
    if args.json:
        out = [{"device": asdict(r.info), "catalog_model": r.model.product if r.model else None,
                "profiles": [{**asdict(p), "placements": [str(x) for x in p.placements]} for p in r.profiles],
                "instances": [{"gi_id": i.gi_id, "profile": i.profile, "placement": str(i.placement), "uuid": i.uuid}
                              for i in inst],
                "utilization": asdict(util), "mismatches": list(r.mismatches), "notes": list(r.notes)}
               for r, inst, util in reports]
        print(json.dumps(out, indent=2))
    else:
        for r, inst, util in reports:
            i = r.info
            print(f"GPU {i.index}: {i.name}  {i.pci_device_id}  {i.memory_total_mib} MiB  uuid {i.uuid}")
            print(f"  MIG mode current={'on' if i.mig_enabled else 'off'} pending={'on' if i.mig_pending else 'off'}"
                  f"  catalog model: {r.model.product if r.model else 'none'}")
            for p in r.profiles:
                print(f"  profile {p.name:<14} id={p.profile_id:<3} idx={p.nvml_index:<2} slices={p.slice_count} "
                      f"mem={p.memory_mib} MiB max={p.max_count} placements={' '.join(map(str, p.placements))}")
            for g in inst:
                print(f"  instance gi={g.gi_id} {g.profile}@{g.placement} {g.uuid}")
            print(f"  utilisation: {util.gpu_percent if util.gpu_percent is not None else 'n/a'} % "
                  f"({util.source}), {util.memory_used_mib}/{util.memory_total_mib} MiB, {util.processes} process(es)")
            for note in r.notes:
                print(f"  note: {note}")
            for m in r.mismatches:
                print(f"  MISMATCH: {m}")
    return 1 if any(r.mismatches for r, _i, _u in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
