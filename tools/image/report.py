"""Write report.json for an image tools/image/build.sh just built: sizes, digest, time, inputs."""

from __future__ import annotations

import json
import os
import platform
import sys
import tarfile
from pathlib import Path


def main(out: Path, version: str, inputs: str, seconds: int, rootfs_tar: Path) -> None:
    layout = out / "oci"
    index = json.loads((layout / "index.json").read_text())
    manifest_digest = index["manifests"][0]["digest"]
    manifest = json.loads((layout / "blobs" / "sha256" / manifest_digest.split(":", 1)[1]).read_text())
    layers = manifest["layers"]
    with tarfile.open(rootfs_tar) as tar:
        unpacked = sum(m.size for m in tar.getmembers() if m.isfile())
    report = {
        "version": version,
        "inputs": inputs,
        "manifest_digest": manifest_digest,
        "layer_digests": [layer["digest"] for layer in layers],
        "compressed_bytes": sum(layer["size"] for layer in layers),
        "unpacked_bytes": unpacked,
        "build_seconds": seconds,
        "machine": f"{os.cpu_count()} CPU(s), {platform.system()}, Python {platform.python_version()}",
    }
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"image {version}: {report['compressed_bytes'] / 2**20:.1f} MiB compressed, "
          f"{unpacked / 2**20:.1f} MiB unpacked, {manifest_digest}", file=sys.stderr)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), Path(sys.argv[5]))
