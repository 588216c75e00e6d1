#!/usr/bin/env bash
# Build the helm binary gpupack's chart tests run (helm lint, template,
# install, upgrade, uninstall against the real control plane), from its Go
# module at the version pinned in go.mod.
#
# Cached by version outside the repository, in
#   ${GPUPACK_CACHE_DIR:-~/.cache/gpupack}/helm/<version>/helm
# so the first build costs a few minutes and later runs return at once.
# Prints the binary's path as its last line on success.
#
# Usage: tools/helm/build.sh [--print-path]
#   --print-path  only print where the binary goes; build nothing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="$(sed -n 's/^require helm\.sh\/helm\/v3 \(v[0-9.]*\)$/\1/p' "${here}/go.mod")"
[[ -n "${version}" ]] || { echo "tools/helm/build.sh: no helm.sh/helm/v3 version in go.mod" >&2; exit 4; }
cache_root="${GPUPACK_CACHE_DIR:-${HOME}/.cache/gpupack}"
bin="${cache_root}/helm/${version}/helm"

if [[ "${1:-}" == "--print-path" ]]; then
    echo "${bin}"
    exit 0
fi

log() { echo "[gpupack helm build $(date -u +%H:%M:%S)] $*" >&2; }

if [[ -x "${bin}" ]]; then
    log "cached: ${bin} (helm ${version})"
    echo "${bin}"
    exit 0
fi

# shellcheck source=../go-env.sh
source "${here}/../go-env.sh"
require_go "helm ${version}" "put a helm ${version} binary at ${bin}"

mkdir -p "$(dirname "${bin}")"
work="$(mktemp -d "${cache_root}/helm/.build.XXXXXX")"
trap 'rm -rf "${work}"' EXIT
start=$(date +%s)
log "building helm ${version} with $(go env GOVERSION) ($(nproc) CPUs); first build: module download, then about 3 min on 2 cores"
(cd "${here}" && go mod download) || {
    log "ERROR: downloading modules failed (see above). Fix: check that the Go module proxy"
    log "       (go env GOPROXY) is reachable, or pre-fill the module cache (go env GOMODCACHE)."
    exit 5; }
# helm reports the version its release build stamps (helm version, and the
# chart's kubeVersion checks compare against the cluster, not this).
(cd "${here}" && go build -trimpath \
    -ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${version} -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
    -o "${work}/helm" helm.sh/helm/v3/cmd/helm)
"${work}/helm" version --short >&2 || { log "ERROR: helm version failed after a successful build"; exit 4; }
mv "${work}/helm" "${bin}"
log "built in $(( $(date +%s) - start ))s: ${bin}"
echo "${bin}"
