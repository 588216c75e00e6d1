#!/bin/sh
# Finish gpupack's image root filesystem at $1 (build.sh runs it on the host as a
# mmdebstrap customize hook; the Containerfile runs it inside the build with "/").
# Expects the Python dependencies and gpupack in $1/opt/gpupack/lib already.
# Both image recipes run this one script, so they end with the same user,
# entrypoint and removals.
set -eu
root="${1:?usage: finish-rootfs.sh <root filesystem>}"

# The user every component runs as (the manifests' runAsUser), and its group.
grep -q '^gpupack:' "$root/etc/group" || echo 'gpupack:x:65532:' >> "$root/etc/group"
grep -q '^gpupack:' "$root/etc/passwd" || \
    echo 'gpupack:x:65532:65532:gpupack:/nonexistent:/usr/sbin/nologin' >> "$root/etc/passwd"

# The command. -I: ignore PYTHON* variables and the user's site directory; the
# packages come from /opt/gpupack/lib only.
mkdir -p "$root/usr/local/bin"
cat > "$root/usr/local/bin/gpupack" <<'SCRIPT'
#!/usr/bin/python3 -I
import sys
sys.path.insert(0, "/opt/gpupack/lib")
from gpupack.cli import main
sys.exit(main())
SCRIPT
chmod 0755 "$root/usr/local/bin/gpupack"

# No package managers and no compilers in the image: dpkg, apt and their state go
# (nothing is installed after this), and so does what only they need.
rm -rf "$root/usr/bin/dpkg" "$root/usr/bin/dpkg-"* "$root/usr/sbin/dpkg-"* "$root/usr/bin/apt" "$root/usr/bin/apt-"* \
    "$root/usr/lib/apt" "$root/var/lib/apt" "$root/var/cache/apt" "$root/var/lib/dpkg" "$root/etc/apt" \
    "$root/etc/dpkg" "$root/usr/share/dpkg" "$root/usr/lib/python3/dist-packages/pip" \
    "$root/usr/bin/pip"* "$root/usr/bin/gcc"* "$root/usr/bin/cc" "$root/usr/bin/c++" "$root/usr/bin/g++"*
# Parts of the Python dependencies nothing in gpupack imports: the Kubernetes
# client's asyncio twin (68 MB; gpupack uses the synchronous client, kopf its own
# aiohttp session) and the libraries' own test suites.
rm -rf "$root/opt/gpupack/lib/kubernetes/aio"
find "$root/opt/gpupack/lib" -depth -type d \( -name tests -o -name test \) -exec rm -rf {} +
# Documentation, manuals and locales: not read by anything in the image.
rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/info" "$root/usr/share/locale" \
    "$root/var/log/"* "$root/var/cache/debconf/"*-old
# Empty runtime directories with fixed modes (a read-only root filesystem works:
# gpupack writes only to /tmp, a tmpfs in the manifests).
mkdir -p "$root/tmp" && chmod 1777 "$root/tmp"
