"""Certificates for the local control plane, made with ``cryptography``.

One throw-away CA signs the API server's serving certificate and the client
certificates of the admin and of kube-scheduler (Kubernetes maps a client
certificate's CN to the user name and its O fields to groups). A separate key
pair signs ServiceAccount tokens. Keys are ECDSA P-256: fast to generate, which
keeps start-up in seconds.

:class:`CertificateAuthority` is also what tests use to issue a serving
certificate for an admission webhook whose ``caBundle`` is this CA.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Clock = Callable[[], dt.datetime]
# Long enough for a `gpupack dev cluster up` left running over a weekend.
DEFAULT_VALIDITY = dt.timedelta(days=30)
# Certificates start slightly in the past so a skewed clock does not reject them.
_BACKDATE = dt.timedelta(minutes=5)


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, as PEM."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        """Write ``<name>.crt`` and ``<name>.key`` (mode 0600) into ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        crt, key = directory / f"{name}.crt", directory / f"{name}.key"
        crt.write_bytes(self.cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(self.key_pem)
        return crt, key


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates."""

    def __init__(
        self, common_name: str = "gpupack-dev-ca", validity: dt.timedelta = DEFAULT_VALIDITY,
        clock: Clock = _utcnow,
    ) -> None:
        self._clock = clock
        self._validity = validity
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = clock()
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True,
                    content_commitment=False, key_encipherment=False, data_encipherment=False,
                    key_agreement=False, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )

    @property
    def pair(self) -> KeyPair:
        return KeyPair(self._cert.public_bytes(serialization.Encoding.PEM), _key_pem(self._key))

    @property
    def cert_pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        common_name: str,
        organizations: Sequence[str] = (),
        hosts: Sequence[str] = (),
        server: bool = False,
        client: bool = False,
    ) -> KeyPair:
        """A leaf certificate; ``hosts`` are DNS names or IP addresses (SANs)."""
        if not (server or client):
            raise ValueError("a certificate must be for a server, a client, or both")
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
            [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        )
        now = self._clock()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + self._validity)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if hosts:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False
            )
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def service_account_signing_key() -> tuple[bytes, bytes]:
    """(private PEM, public PEM) of the key that signs ServiceAccount tokens."""
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _key_pem(key), public
