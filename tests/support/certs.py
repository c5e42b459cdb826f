"""Test certificates made in the test run (``cryptography``): a CA, a server certificate for 127.0.0.1 and
localhost, a client certificate, and a second CA for the "wrong certificate" cases. Nothing is committed."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 2


@dataclass(frozen=True)
class CertSet:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    #: a CA that signed nothing here (a client trusting it refuses our server)
    other_ca: Path
    #: a server certificate signed by other_ca (a client trusting ``ca`` refuses it)
    rogue_cert: Path
    rogue_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def _leaf(cn: str, ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], *,
          server: bool) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                     else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_certs(directory: Path) -> CertSet:
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca("ferrymq test CA")
    other = _ca("some other CA")
    server = _leaf("ferrymq test server", ca, server=True)
    client = _leaf("ferrymq test client", ca, server=False)
    rogue = _leaf("rogue server", other, server=True)
    return CertSet(
        ca=_write_cert(ca[0], directory / "ca.pem"),
        server_cert=_write_cert(server[0], directory / "server.pem"),
        server_key=_write_key(server[1], directory / "server.key"),
        client_cert=_write_cert(client[0], directory / "client.pem"),
        client_key=_write_key(client[1], directory / "client.key"),
        other_ca=_write_cert(other[0], directory / "other-ca.pem"),
        rogue_cert=_write_cert(rogue[0], directory / "rogue.pem"),
        rogue_key=_write_key(rogue[1], directory / "rogue.key"),
    )
