"""TLS for tests: certificates made at test time (a CA, a server certificate for
127.0.0.1/localhost, client certificates with a chosen common name, as PEM files, by the
`cryptography` library, a test-only dependency: no openssl binary or fixed certificates in the
tree), and a broker subprocess that reports its AMQPS and HTTPS ports."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.conftest import BrokerProc

__all__ = ["CertFiles", "TestCA", "TlsBroker"]

_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path


def _name(common_name: str, org: str = "Hare tests") -> x509.Name:
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ))


class TestCA:
    """A self-signed CA in `directory`; `cert_path` is what a peer trusts."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, name: str = "Hare test CA") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = _name(name)
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + 30 * _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True,
                    content_commitment=False, key_encipherment=False, data_encipherment=False,
                    key_agreement=False, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.cert_path = directory / f"{name.replace(' ', '_')}.pem"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, file_stem: str, common_name: str, *, server: bool = False,
              org: str = "Hare tests") -> CertFiles:
        """A leaf certificate signed by this CA: for 127.0.0.1/::1/localhost when `server`,
        else a client certificate."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, org))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + 30 * _DAY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("::1")),
                ]),
                critical=False,
            )
        cert = builder.sign(self.key, hashes.SHA256())
        files = CertFiles(self.directory / f"{file_stem}.crt", self.directory / f"{file_stem}.key")
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, files.key)
        return files


class TlsBroker(BrokerProc):
    """BrokerProc that also reads the AMQPS and management HTTPS ports from stdout (the lines
    after the AMQP one, see docs/MANAGEMENT.md)."""

    def __init__(self, data_dir: Path, args: list[str]) -> None:
        super().__init__(data_dir, args)
        self.ports: dict[str, int] = {}

    def start(self, timeout: float = 20.0) -> TlsBroker:
        super().start(timeout)
        assert self.proc is not None and self.proc.stdout is not None
        wanted = {"hare-server amqps"}
        if "--management-ssl-certfile" in self.args:
            wanted.add("hare-management https")
        while not wanted <= set(self.ports):
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"broker exited; log:\n{self.log()}")
            banner, _, port = line.strip().rpartition(" listening on port ")
            self.ports[banner] = int(port)
        return self

    @property
    def tls_port(self) -> int:
        return self.ports["hare-server amqps"]
