"""A self-signed certificate for 127.0.0.1 (TLS tests: syslog over TLS, https replicas)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

__all__ = ["self_signed"]


def self_signed(tmp: Path, *, rsa_key: bool = False) -> tuple[Path, Path]:
    """Write a CA-flagged P-256 (``rsa_key``: RSA-2048, for suites with RSA key exchange) certificate for
    127.0.0.1 (valid one day) and its key to ``tmp``; returns (cert.pem, key.pem), prefixed ``rsa-``
    for an RSA key."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048) if rsa_key else ec.generate_private_key(
        ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    stem = "rsa-" if rsa_key else ""
    cert_file, key_file = tmp / f"{stem}cert.pem", tmp / f"{stem}key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file
