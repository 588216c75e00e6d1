"""The figures docs/architecture.md gives about the code itself: size per folder and repeated code.

Usage: ``python3 tools/architecture_figures.py [--json]`` from the repository root.

* files and lines of Python per top-level product folder, and per room (a folder's
  own files; each sub-folder is a room of its own);
* pairs of places in product code that share six or more lines, as the
  ``duplicates`` command of the development machine counts them (generated gRPC
  stubs left out, since nobody edits them). Where that command is not installed
  the figure is reported as missing, not guessed.

Product code is what ships: ``mig``, ``sharing``, ``webhook``, ``node``,
``controller``, ``kube`` and ``gpupack``; tests, benchmarks and tools are not.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("mig", "sharing", "webhook", "node", "controller", "kube", "gpupack")
GENERATED = re.compile(r"_pb2(_grpc)?\.py$")


def product_files() -> list[Path]:
    return [path for folder in PRODUCT for path in sorted((ROOT / folder).rglob("*.py"))
            if "__pycache__" not in path.parts and not GENERATED.search(path.name)]


def sizes(files: list[Path]) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """(per top-level folder, per room): files and lines."""
    folders: dict[str, dict[str, int]] = {}
    rooms: dict[str, dict[str, int]] = {}
    for path in files:
        relative = path.relative_to(ROOT)
        lines = len(path.read_text(encoding="utf-8").splitlines())
        for key, table in ((relative.parts[0], folders), (str(relative.parent), rooms)):
            entry = table.setdefault(key, {"files": 0, "lines": 0})
            entry["files"] += 1
            entry["lines"] += lines
    return folders, rooms


def duplicate_pairs(files: list[Path]) -> dict[str, int] | None:
    """Pairs sharing six or more lines (and how many of them the tool marks as boilerplate), or None."""
    tool = shutil.which("duplicates")
    if tool is None:
        return None
    with tempfile.TemporaryDirectory() as scratch:
        for path in files:
            target = Path(scratch) / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        out = subprocess.run([tool, "--repo", scratch, "--most", "200", "--seconds", "300"],
                             capture_output=True, text=True, check=False).stdout
    rows = [line for line in out.splitlines() if re.match(r"D\d+ ", line)]
    more = re.search(r"\(\+(\d+) more pairs\)", out)
    return {"pairs": len(rows) + (int(more.group(1)) if more else 0),
            "boilerplate": sum("boilerplate" in row for row in rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = parser.parse_args(argv)
    files = product_files()
    folders, rooms = sizes(files)
    duplicates = duplicate_pairs(files)
    if args.json:
        print(json.dumps({"folders": folders, "rooms": rooms, "duplicates": duplicates}, indent=2, sort_keys=True))
        return 0
    print("| folder | files | lines |\n| --- | --- | --- |")
    for name, entry in folders.items():
        print(f"| `{name}/` | {entry['files']} | {entry['lines']:,} |")
    print("\n| room | files | lines |\n| --- | --- | --- |")
    for name, entry in sorted(rooms.items()):
        print(f"| `{name}/` | {entry['files']} | {entry['lines']:,} |")
    if duplicates is None:
        print("\nrepeated code: not measured (the `duplicates` command is not installed here)", file=sys.stderr)
    else:
        print(f"\npairs of places sharing 6+ lines: {duplicates['pairs']} "
              f"({duplicates['boilerplate']} of them marked boilerplate)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
