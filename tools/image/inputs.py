"""Print the SHA-256 of everything gpupack's image is built from (tools/image/build.sh).

The Python packages' files, pyproject.toml and tools/image/*: an image built from
the same inputs is the same image, so build.sh skips the build when this matches."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGES = tuple(p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"])
"""The top-level packages the wheel holds (pyproject's ``include`` patterns, ``gpupack*`` -> ``gpupack``)."""


def inputs() -> list[Path]:
    files = [ROOT / "pyproject.toml", ROOT / "README.md"]
    files += sorted(p for p in (ROOT / "tools" / "image").iterdir() if p.is_file())
    for package in PACKAGES:
        files += sorted(p for p in (ROOT / package).rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    return files


def main() -> None:
    digest = hashlib.sha256()
    for path in inputs():
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    print(digest.hexdigest())


if __name__ == "__main__":
    main()
