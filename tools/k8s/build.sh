#!/usr/bin/env bash
# Build the real control-plane binaries gpupack's e2e tests run against:
# kube-apiserver and kube-scheduler (k8s.io/kubernetes) and etcd
# (go.etcd.io/etcd), at the versions pinned in versions.env.
#
# The binaries are cached by version outside the repository, in
#   ${GPUPACK_CACHE_DIR:-~/.cache/gpupack}/k8s/<versions>/bin/
# so the first build costs minutes (about 10 on a 2-core VM) and later runs
# return at once. Prints the bin directory as its last line on success.
#
# Usage: tools/k8s/build.sh [--print-bin-dir]
#   --print-bin-dir  only print where the binaries go; build nothing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "${here}/versions.env"

cache_root="${GPUPACK_CACHE_DIR:-${HOME}/.cache/gpupack}"
tag="kube-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}"
bin_dir="${cache_root}/k8s/${tag}/bin"
binaries=(kube-apiserver kube-scheduler etcd)

if [[ "${1:-}" == "--print-bin-dir" ]]; then
    echo "${bin_dir}"
    exit 0
fi

log() { echo "[gpupack build $(date -u +%H:%M:%S)] $*" >&2; }

all_present() {
    local b
    for b in "${binaries[@]}"; do
        [[ -x "${bin_dir}/${b}" ]] || return 1
    done
}

if all_present; then
    log "cached: ${bin_dir} (kube ${KUBERNETES_VERSION}, etcd ${ETCD_VERSION})"
    echo "${bin_dir}"
    exit 0
fi

# shellcheck source=../go-env.sh
source "${here}/../go-env.sh"
require_go "k8s.io/kubernetes ${KUBERNETES_VERSION}" "put prebuilt binaries (${binaries[*]}) into ${bin_dir}"

# Build into a scratch dir next to the final one and rename at the end, so an
# interrupted build never leaves a half-written binary that looks cached.
mkdir -p "$(dirname "${bin_dir}")"
work="$(mktemp -d "${cache_root}/k8s/.build.XXXXXX")"
trap 'rm -rf "${work}"' EXIT
mkdir -p "${work}/bin"

start=$(date +%s)
log "building kube ${KUBERNETES_VERSION} + etcd ${ETCD_VERSION} with $(go env GOVERSION) ($(nproc) CPUs)"
log "first build: downloads ~210 MB of modules, then compiles (about 10 min on 2 cores)"

# Version stamps the way Kubernetes' own build (hack/lib/version.sh) sets them,
# so /version and the components' logs report the real release.
kv="${KUBERNETES_VERSION#v}"
vpkg="k8s.io/component-base/version"
ldflags="-s -w"
ldflags+=" -X ${vpkg}.gitVersion=${KUBERNETES_VERSION}"
ldflags+=" -X ${vpkg}.gitMajor=${kv%%.*}"
minor="${kv#*.}"; ldflags+=" -X ${vpkg}.gitMinor=${minor%%.*}"
ldflags+=" -X ${vpkg}.gitTreeState=clean"
ldflags+=" -X ${vpkg}.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"

log "[1/4] downloading k8s.io/kubernetes modules"
(cd "${here}/kubernetes" && go mod download) || {
    log "ERROR: downloading modules failed (see above). Fix: check that the Go module proxy"
    log "       (go env GOPROXY) is reachable, or pre-fill the module cache (go env GOMODCACHE)."
    exit 5; }
(cd "${here}/etcd" && go mod download) || exit 5

log "[2/4] compiling kube-apiserver and kube-scheduler (the long step)"
(cd "${here}/kubernetes" && go build -trimpath -ldflags="${ldflags}" -o "${work}/bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler)
log "    done after $(( $(date +%s) - start ))s"

log "[3/4] compiling etcd ${ETCD_VERSION}"
(cd "${here}/etcd" && go build -trimpath -ldflags="-s -w" -o "${work}/bin/etcd" go.etcd.io/etcd/server/v3)
log "    done after $(( $(date +%s) - start ))s"

log "[4/4] checking the binaries run"
for b in "${binaries[@]}"; do
    "${work}/bin/${b}" --version >/dev/null 2>&1 || {
        log "ERROR: ${b} --version failed after a successful build"; exit 4; }
done
"${work}/bin/kube-apiserver" --version >&2

rm -rf "${bin_dir}"
mv "${work}/bin" "${bin_dir}"
log "built in $(( $(date +%s) - start ))s into ${bin_dir}"
echo "${bin_dir}"
