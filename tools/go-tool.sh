#!/usr/bin/env bash
# Build one of the Go command-line tools gpupack's tests run (helm, kustomize) from
# its Go module, at the version pinned in tools/<tool>/go.mod (a wrapper module:
# tools.go imports the command, so `go mod tidy` keeps the whole graph in go.sum).
# tools/<tool>/tool.env says which module and package, and how the tool stamps its
# version (TOOL_MODULE, TOOL_PACKAGE, TOOL_VERSION_VAR); optionally the build tags
# (TOOL_TAGS, e.g. ones that leave out plugins) and the arguments that make the
# built binary print its version (TOOL_VERSION_ARGS, default: version).
#
# Cached by version outside the repository, in
#   ${GPUPACK_CACHE_DIR:-~/.cache/gpupack}/<tool>/<version>/<tool>
# so the first build costs a minute or two and later runs return at once.
# Prints the binary's path as its last line on success.
#
# Usage: tools/go-tool.sh <tool> [--print-path]
#   --print-path  only print where the binary goes; build nothing.
set -euo pipefail

tools="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tool="${1:?usage: tools/go-tool.sh <tool> [--print-path]}"
here="${tools}/${tool}"
[[ -f "${here}/tool.env" ]] || { echo "tools/go-tool.sh: no tools/${tool}/tool.env" >&2; exit 4; }
# shellcheck source=/dev/null
source "${here}/tool.env"
version="$(awk -v m="${TOOL_MODULE}" '$1 == "require" && $2 == m {print $3} $1 == m {print $2}' "${here}/go.mod" | head -1)"
[[ -n "${version}" ]] || { echo "tools/go-tool.sh: no ${TOOL_MODULE} version in tools/${tool}/go.mod" >&2; exit 4; }
cache_root="${GPUPACK_CACHE_DIR:-${HOME}/.cache/gpupack}"
bin="${cache_root}/${tool}/${version}/${tool}"

if [[ "${2:-}" == "--print-path" ]]; then
    echo "${bin}"
    exit 0
fi

log() { echo "[gpupack ${tool} build $(date -u +%H:%M:%S)] $*" >&2; }

if [[ -x "${bin}" ]]; then
    log "cached: ${bin} (${tool} ${version})"
    echo "${bin}"
    exit 0
fi

# shellcheck source=go-env.sh
source "${tools}/go-env.sh"
require_go "${tool} ${version}" "put a ${tool} ${version} binary at ${bin}"

mkdir -p "$(dirname "${bin}")"
work="$(mktemp -d "${cache_root}/${tool}/.build.XXXXXX")"
trap 'rm -rf "${work}"' EXIT
start=$(date +%s)
log "building ${tool} ${version} with $(go env GOVERSION) ($(nproc) CPUs); first build: module download, then a minute or two on 2 cores"
tags="${TOOL_TAGS:-}"
# Only the modules the command needs with these tags (go.sum holds the whole graph).
(cd "${here}" && go list -deps -tags "${tags}" "${TOOL_PACKAGE}" >/dev/null) || {
    log "ERROR: downloading modules failed (see above). Fix: check that the Go module proxy"
    log "       (go env GOPROXY) is reachable, or pre-fill the module cache (go env GOMODCACHE)."
    exit 5; }
# The version the tool reports, stamped as its own release build does.
(cd "${here}" && go build -trimpath -tags "${tags}" -ldflags="-s -w -X ${TOOL_VERSION_VAR}=${version}" -o "${work}/${tool}" "${TOOL_PACKAGE}")
"${work}/${tool}" ${TOOL_VERSION_ARGS:-version} >&2 || { log "ERROR: ${tool} version failed after a successful build"; exit 4; }
mv "${work}/${tool}" "${bin}"
log "built in $(( $(date +%s) - start ))s: ${bin}"
echo "${bin}"
