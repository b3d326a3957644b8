"""weed's own security for the local store: a fresh `security.toml` (JWT signing keys for the
volume and filer HTTP APIs, UI off) and a self-signed gRPC certificate that every weed server
and client presents and trusts alone (mutual TLS). See server.py for which ports
exist and how each is closed.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import secrets
from pathlib import Path

from batchscale.storage import write_bytes_atomic

HOST = "127.0.0.1"

GRPC_ROLES = ("master", "volume", "filer", "s3", "admin", "worker", "client", "msg_broker",
              "msg_agent", "mq")
"""Every `[grpc.ROLE]` of weed's security.toml: each server and client gets our certificate."""
JWT_SECTIONS = ("jwt.signing", "jwt.signing.read", "jwt.filer_signing", "jwt.filer_signing.read")
"""Volume reads/writes and filer reads/writes over HTTP need a token signed with these keys."""


def write_weed_config(state: Path) -> Path:
    """A fresh security.toml and gRPC certificate for this start, in a private directory.

    Nothing but this weed process uses them, so they are new at every start: a copy taken from
    an earlier start is worthless. The JWT keys guard the volume and filer HTTP APIs; every gRPC
    server and client of weed presents the certificate and trusts only it (mutual TLS).
    """
    config = state / "weed-config"
    config.mkdir(mode=0o700, exist_ok=True)
    cert, key = config / "grpc.crt", config / "grpc.key"
    for path, pem in zip((cert, key), grpc_certificate(), strict=True):
        write_bytes_atomic(path, pem, mode=0o600)
    lines = []
    for section in JWT_SECTIONS:
        lines += [f"[{section}]", f'key = "{secrets.token_hex(32)}"', "expires_after_seconds = 10"]
    lines += ["[access]", "ui = false", "[filer.expose_directory_metadata]", "enabled = false"]
    lines += ["[grpc]", f"ca = {toml_string(cert)}"]
    for role in GRPC_ROLES:
        lines += [f"[grpc.{role}]", f"cert = {toml_string(cert)}", f"key = {toml_string(key)}"]
    write_bytes_atomic(config / "security.toml", ("\n".join(lines) + "\n").encode(), mode=0o600)
    return config


def toml_string(path: Path) -> str:
    """A TOML basic string (JSON's escapes are valid TOML ones)."""
    return json.dumps(str(path), ensure_ascii=False)


def grpc_certificate() -> tuple[bytes, bytes]:
    """PEM of a new self-signed certificate for client and server use, and of its key.

    It is its own (and weed's only) CA: a gRPC peer must hold this very key.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "batchscale local store")])
    now = datetime.datetime.now(datetime.UTC)
    usage = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]),
            critical=False)
        .sign(key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(pem), key_pem
