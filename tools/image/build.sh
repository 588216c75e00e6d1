#!/usr/bin/env bash
# Build gpupack's container image without a container daemon, from Debian packages
# and PyPI wheels only (no registry base image is pulled):
#
#   1. gpupack's wheel (and sdist) from this checkout;
#   2. its runtime dependencies, exactly as pinned in requirements.lock, as
#      manylinux wheels for CPython 3.11, installed into /opt/gpupack/lib;
#   3. a Debian bookworm root filesystem: the essential set plus packages.txt
#      (mmdebstrap), finished by finish-rootfs.sh (user 65532, /usr/local/bin/gpupack,
#      no dpkg, apt, pip or compilers, no docs);
#   4. an OCI image of that one layer (umoci): entrypoint gpupack, user 65532.
#
# One image for every component (webhook, controller, node agent): they share the
# package and 95 % of the bytes, and one tag keeps the chart's versions in step.
#
# Output in ${GPUPACK_IMAGE_DIR:-out/image}: oci/ (an OCI layout, tag = the package
# version), gpupack-<version>.oci.tar (the same as an archive, for `skopeo copy
# oci-archive:...` or `podman load`), dist/ (the wheel) and report.json (sizes,
# time, input hash). An image whose inputs have not changed is not rebuilt.
# Timestamps come from SOURCE_DATE_EPOCH (default: the last commit's time).
#
# Needs root (mmdebstrap's root mode), mmdebstrap and umoci (and runc for the smoke
# test); when they are missing and apt-get is there, they are installed (Debian packages).
#
# Usage: tools/image/build.sh [--force]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
out="${GPUPACK_IMAGE_DIR:-${root}/out/image}"
log() { echo "[gpupack image $(date -u +%H:%M:%S)] $*" >&2; }
fail() { log "ERROR: $1"; log "Fix: $2"; exit "${3:-1}"; }

cd "${root}"
version="$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"

# What the image is made of: if none of it changed, the image already built is it.
inputs="$(python3 "${here}/inputs.py")"
if [[ "${1:-}" != "--force" && -f "${out}/report.json" ]] && \
        python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["inputs"] != sys.argv[2])' \
        "${out}/report.json" "${inputs}"; then
    log "up to date: ${out}/oci:${version} (inputs ${inputs:0:12})"
    echo "${out}"
    exit 0
fi

[[ "$(id -u)" == 0 ]] || fail "building the root filesystem needs root (mmdebstrap's root mode)" \
    "run as root (CI does), or build with the Containerfile and a container engine" 3
missing=()
# runc is not needed to build, but the image's smoke test (tests/integration/test_image.py) runs it.
for tool in mmdebstrap umoci runc; do command -v "${tool}" >/dev/null || missing+=("${tool}"); done
if (( ${#missing[@]} )); then
    command -v apt-get >/dev/null || fail "missing ${missing[*]}" "install the Debian packages ${missing[*]}" 3
    log "installing ${missing[*]} (Debian packages)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2 || {
        apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2; } || \
        fail "could not install ${missing[*]}" "install them by hand (apt-get install ${missing[*]})" 3
fi

start=$(date +%s)
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

log "[1/4] gpupack ${version}: wheel"
python3 -m pip wheel -q --no-deps -w "${work}/dist" . >&2
wheel="$(ls "${work}/dist/"gpupack-*.whl)"

log "[2/4] dependencies from requirements.lock (manylinux wheels, CPython 3.11)"
python3 -m pip install -q --no-deps --only-binary=:all: --no-compile --target "${work}/lib" \
    --implementation cp --python-version 3.11 --abi cp311 \
    --platform manylinux_2_36_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -r "${here}/requirements.lock" "${wheel}" >&2
rm -rf "${work}/lib/bin"
# pip records where the wheel came from (this build's temporary directory): not the image's business.
find "${work}/lib" -path '*.dist-info/direct_url.json' -delete
sed -i '/\/direct_url\.json,/d' "${work}"/lib/*.dist-info/RECORD
# Byte-compiled once here (hash-checked, no timestamps, the paths they will have in the image):
# the root filesystem is read-only at run time.
python3 -m compileall -q -j 0 --invalidation-mode unchecked-hash -d /opt/gpupack/lib "${work}/lib" >&2

log "[3/4] root filesystem: Debian bookworm essential + $(grep -v '^#' "${here}/packages.txt" | xargs)"
packages="$(grep -v '^#' "${here}/packages.txt" | xargs | tr ' ' ',')"
mmdebstrap --quiet --variant=essential --include="${packages}" bookworm "${work}/rootfs" >&2
mkdir -p "${work}/rootfs/opt/gpupack"
cp -a "${work}/lib" "${work}/rootfs/opt/gpupack/lib"
sh "${here}/finish-rootfs.sh" "${work}/rootfs"
# One layer, its entries sorted, owned by root, mtimes clamped to SOURCE_DATE_EPOCH.
# (pax format for the extended attributes, without the access and change times it would record).
tar --sort=name --mtime="@${SOURCE_DATE_EPOCH}" --clamp-mtime --numeric-owner --xattrs --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "${work}/rootfs" -cf "${work}/rootfs.tar" .

log "[4/4] OCI image (umoci): ${out}/oci:${version}"
rm -rf "${out}"
mkdir -p "${out}"
created="$(date -u -d "@${SOURCE_DATE_EPOCH}" +%Y-%m-%dT%H:%M:%SZ)"
umoci init --layout "${out}/oci"
umoci new --image "${out}/oci:${version}"
umoci raw add-layer --image "${out}/oci:${version}" --history.created "${created}" \
    --history.created_by "tools/image/build.sh" --history.comment "Debian bookworm + gpupack ${version}" \
    "${work}/rootfs.tar"
umoci config --no-history --image "${out}/oci:${version}" --created "${created}" --os linux --architecture amd64 \
    --config.user 65532:65532 --config.entrypoint /usr/local/bin/gpupack --config.workingdir / \
    --config.env PATH=/usr/local/bin:/usr/bin:/bin --config.env PYTHONDONTWRITEBYTECODE=1 \
    --config.label "org.opencontainers.image.version=${version}" \
    --config.label "org.opencontainers.image.title=gpupack" \
    --config.label "org.opencontainers.image.created=${created}"
umoci gc --layout "${out}/oci"
(cd "${out}/oci" && tar --sort=name --mtime="@${SOURCE_DATE_EPOCH}" --owner=0 --group=0 --numeric-owner \
    -cf "${out}/gpupack-${version}.oci.tar" .)
mkdir -p "${out}/dist" && cp "${work}/dist/"* "${out}/dist/"

python3 "${here}/report.py" "${out}" "${version}" "${inputs}" "$(( $(date +%s) - start ))" "${work}/rootfs.tar"
log "built in $(( $(date +%s) - start ))s: ${out}/oci:${version}"
echo "${out}"
