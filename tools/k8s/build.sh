#!/usr/bin/env bash
# Build the real control-plane binaries gpupack's e2e tests run against:
# kube-apiserver, kube-scheduler and kube-controller-manager (k8s.io/kubernetes)
# and etcd (go.etcd.io/etcd), at the versions pinned in versions.env; and kwok
# (sigs.k8s.io/kwok, the fake nodes and pod life cycles of `ControlPlaneConfig(kwok=True)`),
# at the version pinned in ../kwok/go.mod: its own wrapper module, because it pins
# older Kubernetes libraries than k8s.io/kubernetes does.
#
# The binaries are cached by version outside the repository, in
#   ${GPUPACK_CACHE_DIR:-~/.cache/gpupack}/k8s/<versions>/bin/
# so the first build costs minutes (about 10 on a 2-core VM for the first
# three; kube-controller-manager and kwok add a few more each) and later runs
# return at once. Only the binaries missing from the bin dir are compiled, so
# adding a binary to the list does not rebuild the ones already cached. kwok's
# version is not part of the directory's name (a kwok bump must not rebuild the
# rest): a cached kwok reporting another version counts as missing. Prints the
# bin directory as its last line on success.
#
# Usage: tools/k8s/build.sh [--print-bin-dir] [BINARY...]
#   --print-bin-dir  only print where the binaries go; build nothing.
#   BINARY...        build only these (any of: kube-apiserver kube-scheduler
#                    kube-controller-manager etcd kwok) if missing; default: all.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "${here}/versions.env"

cache_root="${GPUPACK_CACHE_DIR:-${HOME}/.cache/gpupack}"
tag="kube-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}"
bin_dir="${cache_root}/k8s/${tag}/bin"
# The binaries from k8s.io/kubernetes (each is k8s.io/kubernetes/cmd/<name>), then etcd.
kube_binaries=(kube-apiserver kube-scheduler kube-controller-manager)
all_binaries=("${kube_binaries[@]}" etcd kwok)
# kwok's pinned version: the require line of its wrapper module.
kwok_module="sigs.k8s.io/kwok"
kwok_version="$(awk -v m="${kwok_module}" '$1 == "require" && $2 == m {print $3}' "${here}/../kwok/go.mod")"
[[ -n "${kwok_version}" ]] || { echo "tools/k8s/build.sh: no ${kwok_module} version in tools/kwok/go.mod" >&2; exit 4; }

if [[ "${1:-}" == "--print-bin-dir" ]]; then
    echo "${bin_dir}"
    exit 0
fi

log() { echo "[gpupack build $(date -u +%H:%M:%S)] $*" >&2; }

if (( $# > 0 )); then
    binaries=("$@")
    for b in "${binaries[@]}"; do
        [[ " ${all_binaries[*]} " == *" ${b} "* ]] || {
            log "ERROR: unknown binary '${b}'; known: ${all_binaries[*]}"; exit 2; }
    done
else
    binaries=("${all_binaries[@]}")
fi

# The requested binaries not yet in bin_dir (each is checked on its own; kwok
# also by the version it reports, stamped below).
cached() {
    [[ -x "${bin_dir}/$1" ]] || return 1
    [[ "$1" != kwok ]] || [[ "$("${bin_dir}/kwok" --version 2>/dev/null)" == *" ${kwok_version} "* ]]
}
missing=()
for b in "${binaries[@]}"; do
    cached "${b}" || missing+=("${b}")
done

if (( ${#missing[@]} == 0 )); then
    log "cached: ${bin_dir} (kube ${KUBERNETES_VERSION}, etcd ${ETCD_VERSION}, kwok ${kwok_version})"
    echo "${bin_dir}"
    exit 0
fi

# shellcheck source=../go-env.sh
source "${here}/../go-env.sh"
require_go "k8s.io/kubernetes ${KUBERNETES_VERSION}" "put prebuilt binaries (${missing[*]}) into ${bin_dir}"

# Build into a scratch dir next to the final one and move each binary in at the
# end (a rename on the same file system), so an interrupted build never leaves
# a half-written binary that looks cached.
mkdir -p "$(dirname "${bin_dir}")"
work="$(mktemp -d "${cache_root}/k8s/.build.XXXXXX")"
trap 'rm -rf "${work}"' EXIT
mkdir -p "${work}/bin"

kube_missing=()
etcd_missing=false
kwok_missing=false
for b in "${missing[@]}"; do
    case "${b}" in
        etcd) etcd_missing=true ;;
        kwok) kwok_missing=true ;;
        *) kube_missing+=("${b}") ;;
    esac
done

start=$(date +%s)
log "building ${missing[*]} (kube ${KUBERNETES_VERSION}, etcd ${ETCD_VERSION}, kwok ${kwok_version}) with $(go env GOVERSION) ($(nproc) CPUs)"
log "a first build downloads ~210 MB of modules, then compiles (about 10 min on 2 cores for the"
log "  first three; kube-controller-manager and kwok add minutes, less with a warm Go build cache)"

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

if (( ${#kube_missing[@]} > 0 )); then
    log "[1/5] downloading k8s.io/kubernetes modules"
    (cd "${here}/kubernetes" && go mod download) || {
        log "ERROR: downloading modules failed (see above). Fix: check that the Go module proxy"
        log "       (go env GOPROXY) is reachable, or pre-fill the module cache (go env GOMODCACHE)."
        exit 5; }
    pkgs=()
    for b in "${kube_missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/${b}"); done
    log "[2/5] compiling ${kube_missing[*]} (the long step)"
    (cd "${here}/kubernetes" && go build -trimpath -ldflags="${ldflags}" -o "${work}/bin/" "${pkgs[@]}")
    log "    done after $(( $(date +%s) - start ))s"
else
    log "[1-2/5] kube binaries cached, nothing to compile"
fi

if [[ "${etcd_missing}" == true ]]; then
    log "[3/5] compiling etcd ${ETCD_VERSION}"
    (cd "${here}/etcd" && go mod download) || exit 5
    (cd "${here}/etcd" && go build -trimpath -ldflags="-s -w" -o "${work}/bin/etcd" go.etcd.io/etcd/server/v3)
    log "    done after $(( $(date +%s) - start ))s"
else
    log "[3/5] etcd cached, nothing to compile"
fi

if [[ "${kwok_missing}" == true ]]; then
    log "[4/5] compiling kwok ${kwok_version} (its own module, tools/kwok)"
    (cd "${here}/../kwok" && go mod download) || exit 5
    # The version kwok --version reports, as its release build stamps it (consts.Version has no "v").
    (cd "${here}/../kwok" && go build -trimpath \
        -ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${kwok_version#v}" \
        -o "${work}/bin/kwok" "${kwok_module}/cmd/kwok")
    log "    done after $(( $(date +%s) - start ))s"
else
    log "[4/5] kwok cached, nothing to compile"
fi

log "[5/5] checking the binaries run"
for b in "${missing[@]}"; do
    "${work}/bin/${b}" --version >/dev/null 2>&1 || {
        log "ERROR: ${b} --version failed after a successful build"; exit 4; }
    "${work}/bin/${b}" --version >&2
done

mkdir -p "${bin_dir}"
for b in "${missing[@]}"; do
    mv -f "${work}/bin/${b}" "${bin_dir}/${b}"
done
log "built ${missing[*]} in $(( $(date +%s) - start ))s into ${bin_dir}"
echo "${bin_dir}"
