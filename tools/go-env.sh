# Sourced by tools/k8s/build.sh and tools/helm/build.sh: the Go toolchain check and
# the build environment both use. Expects a log function; defines require_go.

# require_go WHAT FALLBACK: exit 3 with the fix unless Go >= 1.26 is on PATH (WHAT
# names what needs it, FALLBACK how to do without building); then set the
# environment both builds use: stay on the local toolchain unless the caller chose
# otherwise, build the committed go.mod/go.sum read-only and without vcs stamping
# (meaningless for a module-cache build), no cgo.
require_go() {
    local what="$1" fallback="$2" go_version go_minor
    if ! command -v go >/dev/null 2>&1; then
        log "ERROR: the Go toolchain ('go') is not on PATH."
        log "Fix: install Go >= 1.26 (${what} needs it) and re-run, or ${fallback}."
        exit 3
    fi
    go_version="$(go env GOVERSION)"
    go_minor="$(echo "${go_version}" | sed -E 's/^go1\.([0-9]+).*/\1/')"
    if [[ ! "${go_minor}" =~ ^[0-9]+$ ]] || (( go_minor < 26 )); then
        log "ERROR: ${go_version} is too old; ${what} needs Go >= 1.26."
        log "Fix: install a newer Go, or set GOTOOLCHAIN=auto so go can fetch one from the module proxy."
        exit 3
    fi
    export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
    export GOFLAGS="-mod=readonly -buildvcs=false ${GOFLAGS:-}"
    export CGO_ENABLED="${CGO_ENABLED:-0}"
}
