"""Credentials the gateway can use to watch the API: kubeconfig files and the in-cluster account."""

from __future__ import annotations

import base64
import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from modelroll_gateway.kubeapi import (
    KubeConfigError,
    load_connection,
    load_incluster,
    load_kubeconfig,
)


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate and its key (serves as CA and as client certificate)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def _kubeconfig(path: Path, cluster: str, user: str, context_extra: str = "") -> Path:
    path.write_text(
        f"""
apiVersion: v1
kind: Config
current-context: dev
contexts: [{{name: dev, context: {{cluster: k, user: u{context_extra}}}}}]
clusters: [{{name: k, cluster: {cluster}}}]
users: [{{name: u, user: {user}}}]
"""
    )
    return path


def test_certificate_files_resolve_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    _self_signed(tmp_path)
    config = _kubeconfig(
        tmp_path / "config",
        "{server: 'https://127.0.0.1:6443', certificate-authority: tls.crt}",
        "{client-certificate: tls.crt, client-key: tls.key}",
        ", namespace: team-a",
    )
    conn = load_kubeconfig(config)
    assert conn.server == "https://127.0.0.1:6443"
    assert conn.ssl_context is not None
    assert conn.namespace == "team-a"
    assert conn.headers() == {}


def test_inline_certificate_data_is_accepted(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    b64 = {p.name: base64.b64encode(p.read_bytes()).decode() for p in (cert, key)}
    config = _kubeconfig(
        tmp_path / "config",
        f"{{server: 'https://h:1', certificate-authority-data: {b64['tls.crt']}}}",
        f"{{client-certificate-data: {b64['tls.crt']}, client-key-data: {b64['tls.key']}}}",
    )
    assert load_kubeconfig(config).ssl_context is not None


def test_a_token_file_is_read_again_for_every_request(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    config = _kubeconfig(
        tmp_path / "config", "{server: 'http://127.0.0.1:8080'}", "{tokenFile: token}"
    )
    conn = load_kubeconfig(config)
    assert conn.headers() == {"Authorization": "Bearer first"}
    token.write_text("rotated")
    assert conn.headers() == {"Authorization": "Bearer rotated"}


def test_kubeconfig_env_is_used_when_no_flag_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _kubeconfig(tmp_path / "config", "{server: 'http://h:1'}", "{token: abc}")
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{config}")
    conn = load_connection()
    assert conn.server == "http://h:1"
    assert conn.headers() == {"Authorization": "Bearer abc"}


def test_the_in_cluster_service_account_is_used_inside_a_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, _ = _self_signed(tmp_path)
    cert.rename(tmp_path / "ca.crt")
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "namespace").write_text("models\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    conn = load_incluster(tmp_path)
    assert conn.server == "https://10.0.0.1:443"
    assert conn.namespace == "models"
    assert conn.headers() == {"Authorization": "Bearer sa-token"}


@pytest.mark.parametrize(
    ("cluster", "user", "message"),
    [
        ("{server: 'https://h:1'}", "{exec: {command: x}}", "exec/auth-provider"),
        ("{}", "{token: t}", "has no server"),
        ("{server: 'https://h:1'}", "{client-key: tls.key}", "needs both cert and key"),
    ],
)
def test_unusable_kubeconfigs_say_why(
    tmp_path: Path, cluster: str, user: str, message: str
) -> None:
    _self_signed(tmp_path)
    with pytest.raises(KubeConfigError, match=message):
        load_kubeconfig(_kubeconfig(tmp_path / "config", cluster, user))
    with pytest.raises(KubeConfigError, match="cannot read kubeconfig"):
        load_kubeconfig(tmp_path / "nope")
