"""Serving certificate that follows rotation without a restart.

cert-manager renews the webhook's certificate and the kubelet swaps the files
of the mounted Secret (an atomic symlink flip of ``..data``). :class:`ReloadingTLS`
keeps one ``SSLContext`` for the server's lifetime and, when the files' identity
(inode, size, mtime of what the paths resolve to) changes, loads the new pair
into it; OpenSSL uses the new certificate for every handshake after that, and
open connections keep theirs. A half-written or mismatched pair is first tried
in a scratch context and ignored (the old certificate stays) until a later check
sees a consistent pair, so a rotation can never leave the server without a
certificate.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable

log = logging.getLogger("gpupack.webhook.tls")

Stamp = tuple[tuple[int, int, int], ...]


class TLSConfigError(ValueError):
    """The certificate or key cannot be used; names the files."""


TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
"""OpenSSL cipher string for TLS 1.2: ECDHE key exchange with AES-GCM or ChaCha20-Poly1305."""


def _stamp(*paths: str) -> Stamp:
    out = []
    for path in paths:
        st = os.stat(path)  # follows symlinks: a flipped ..data link changes the inode
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # TLS 1.2: forward-secret AEAD suites only (no CBC); TLS 1.3 suites are all AEAD already.
    ctx.set_ciphers(TLS12_CIPHERS)
    ctx.load_cert_chain(cert, key)
    return ctx


class ReloadingTLS:
    def __init__(self, cert: str, key: str, on_reload: Callable[[], None] | None = None) -> None:
        self.cert, self.key = cert, key
        self.on_reload = on_reload
        try:
            self.context = _context(cert, key)
            self._stamp = _stamp(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise TLSConfigError(f"cannot load TLS certificate {cert!r} with key {key!r}: {exc}") from None

    def check(self) -> bool:
        """Reload if the files changed; True when a new certificate was loaded."""
        try:
            stamp = _stamp(self.cert, self.key)
        except OSError as exc:
            log.warning("TLS files unreadable (%s); keeping the current certificate", exc)
            return False
        if stamp == self._stamp:
            return False
        try:
            _context(self.cert, self.key)  # validate the new pair before touching the live context
            self.context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            log.warning("new TLS certificate not loaded yet (%s); keeping the current one", exc)
            return False
        self._stamp = stamp
        log.info("reloaded TLS certificate from %s", self.cert)
        if self.on_reload is not None:
            self.on_reload()
        return True
