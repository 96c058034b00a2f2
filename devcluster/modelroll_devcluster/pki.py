"""Certificates and keys for a throwaway control plane: a CA, a serving cert, an admin cert.

The layout follows controller-runtime's envtest: the API server serves a certificate for localhost
and 127.0.0.1 signed by the CA, the admin is a client certificate (CN ``admin``, O
``system:masters``) signed by the same CA, and service-account tokens are signed by an RSA key.
For the aggregation layer (extension API servers such as KEDA's metrics adapter), a second CA, the
front-proxy CA, signs the client certificate (CN ``front-proxy-client``) the API server presents
when it proxies a request, as kubeadm lays it out.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=365)
#: The identity the API server proxies to extension API servers as (--requestheader-allowed-names).
FRONT_PROXY_CLIENT = "front-proxy-client"


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files written by :func:`create_pki`."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path
    front_proxy_ca_cert: Path
    front_proxy_client_cert: Path
    front_proxy_client_key: Path

    @classmethod
    def in_dir(cls, directory: Path) -> Pki:
        """The file layout inside ``directory`` (whether or not the files exist yet)."""
        return cls(
            ca_cert=directory / "ca.crt",
            ca_key=directory / "ca.key",
            serving_cert=directory / "apiserver.crt",
            serving_key=directory / "apiserver.key",
            admin_cert=directory / "admin.crt",
            admin_key=directory / "admin.key",
            sa_key=directory / "sa.key",
            sa_pub=directory / "sa.pub",
            front_proxy_ca_cert=directory / "front-proxy-ca.crt",
            front_proxy_client_cert=directory / "front-proxy-client.crt",
            front_proxy_client_key=directory / "front-proxy-client.key",
        )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """Signing only: a CA also signs certificates and CRLs."""
    return x509.KeyUsage(
        digital_signature=True,
        key_encipherment=False,
        content_commitment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: datetime.datetime,
    *,
    ca: bool,
) -> x509.CertificateBuilder:
    """What every certificate here has: names, key, serial, validity, constraints, usage."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(_key_usage(ca=ca), critical=True)
    )


def _leaf(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    subject: x509.Name,
    usage: x509.ObjectIdentifier | list[x509.ObjectIdentifier],
    now: datetime.datetime,
    sans: list[x509.GeneralName] | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    usages = usage if isinstance(usage, list) else [usage]
    builder = (
        _builder(subject, ca_cert.subject, key.public_key(), now, ca=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _ca(
    common_name: str, now: datetime.datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA certificate and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    cert = (
        _builder(name, name, key.public_key(), now, ca=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def create_pki(directory: Path, extra_ips: tuple[str, ...] = ()) -> Pki:
    """Write a fresh CA, serving cert, admin client cert and service-account key pair.

    ``extra_ips`` are further addresses the API server's certificate is valid for (a node's IP,
    where pods and the kubelet reach it).
    """
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki.in_dir(directory)
    now = datetime.datetime.now(datetime.UTC)

    ca_cert, ca_key = _ca("modelroll-devcluster-ca", now)
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.ca_cert, ca_cert)

    serving_cert, serving_key = _leaf(
        ca_cert,
        ca_key,
        _name("kube-apiserver"),
        ExtendedKeyUsageOID.SERVER_AUTH,
        now,
        sans=[
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
            *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in extra_ips),
        ],
    )
    _write_key(pki.serving_key, serving_key)
    _write_cert(pki.serving_cert, serving_cert)

    admin_cert, admin_key = _leaf(
        ca_cert, ca_key, _name("admin", "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH, now
    )
    _write_key(pki.admin_key, admin_key)
    _write_cert(pki.admin_cert, admin_cert)

    # Only the API server's proxy client is signed by it: its key is not kept.
    front_proxy_ca, front_proxy_ca_key = _ca("modelroll-devcluster-front-proxy-ca", now)
    _write_cert(pki.front_proxy_ca_cert, front_proxy_ca)
    proxy_cert, proxy_key = _leaf(
        front_proxy_ca,
        front_proxy_ca_key,
        _name(FRONT_PROXY_CLIENT),
        ExtendedKeyUsageOID.CLIENT_AUTH,
        now,
    )
    _write_key(pki.front_proxy_client_key, proxy_key)
    _write_cert(pki.front_proxy_client_cert, proxy_cert)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def _load_ca(pki: Pki) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    return ca_cert, ca_key


def issue_client_cert(pki: Pki, stem: str, common_name: str, organization: str | None) -> Path:
    """A client certificate signed by ``pki``'s CA, written as ``<stem>.crt`` and ``<stem>.key``
    next to it (the identities of a node's kubelet, kube-proxy and kube-scheduler); returns the
    certificate's path."""
    ca_cert, ca_key = _load_ca(pki)
    now = datetime.datetime.now(datetime.UTC)
    cert, key = _leaf(
        ca_cert, ca_key, _name(common_name, organization), ExtendedKeyUsageOID.CLIENT_AUTH, now
    )
    directory = pki.ca_cert.parent
    _write_key(directory / f"{stem}.key", key)
    _write_cert(directory / f"{stem}.crt", cert)
    return directory / f"{stem}.crt"


def issue_tls_dir(pki: Pki, directory: Path, common_name: str, hosts: list[str]) -> Path:
    """``ca.crt``, ``tls.crt`` and ``tls.key`` in ``directory``, as a kubernetes.io/tls Secret
    mounted in a pod: a certificate signed by ``pki``'s CA for ``hosts`` (DNS names or IP
    addresses), good for serving and as a client (mutual TLS between a server's own processes,
    as KEDA's operator and metrics adapter use it); returns ``directory``."""
    ca_cert, ca_key = _load_ca(pki)
    now = datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    cert, key = _leaf(ca_cert, ca_key, _name(common_name), usages, now, sans=sans)
    directory.mkdir(parents=True, exist_ok=True)
    _write_key(directory / "tls.key", key)
    _write_cert(directory / "tls.crt", cert)
    _write_cert(directory / "ca.crt", ca_cert)
    return directory
