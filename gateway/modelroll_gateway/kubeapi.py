"""Just enough Kubernetes API access, on aiohttp: kubeconfig or in-cluster credentials, list, watch.

Supported credentials: client certificates (files or inline data), bearer tokens (inline or a
token file, re-read on every request so rotated service-account tokens keep working) and basic
auth. Exec and auth-provider plugins are not supported: such a kubeconfig fails with a message
saying so.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
REQUEST_TIMEOUT = 30.0
"""Seconds for one non-watch API request."""
MAX_EVENT_BYTES = 8 * 1024 * 1024
"""Largest watch event line accepted (a ConfigMap is at most 1 MiB)."""


class KubeConfigError(Exception):
    """No usable credentials: the message says what is missing or unsupported."""


class KubeApiError(Exception):
    """The API server answered with an error status (or a watch ERROR event)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @classmethod
    def from_status(cls, status: int, body: Mapping[str, Any] | None) -> KubeApiError:
        body = body or {}
        return cls(
            int(body.get("code") or status),
            str(body.get("reason") or ""),
            str(body.get("message") or "no message"),
        )


@dataclass(frozen=True)
class KubeConnection:
    """Where the API server is and how to authenticate to it."""

    server: str
    ssl_context: ssl.SSLContext | None
    token: str | None = None
    token_file: Path | None = None
    basic_auth: tuple[str, str] | None = None
    namespace: str | None = None
    """The namespace the credentials point at (kubeconfig context, or the service account's)."""

    def headers(self) -> dict[str, str]:
        """Authorization headers for one request."""
        if self.token_file is not None:
            token = self.token_file.read_text().strip()
            return {"Authorization": f"Bearer {token}"}
        if self.token:
            return {"Authorization": f"Bearer {self.token}"}
        if self.basic_auth is not None:
            return {"Authorization": aiohttp.BasicAuth(*self.basic_auth).encode()}
        return {}


def _resolve(base: Path, value: str) -> Path:
    path = Path(os.path.expanduser(value))
    return path if path.is_absolute() else base / path


def _named(items: Any, name: str, kind: str, path: Path) -> dict[str, Any]:
    for item in items or []:
        if isinstance(item, dict) and item.get("name") == name:
            body = item.get(kind)
            return body if isinstance(body, dict) else {}
    raise KubeConfigError(f"{path}: no {kind} named {name!r}")


def _load_cert_chain(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl only loads client certificates from files: write them to a private temp dir briefly."""
    with tempfile.TemporaryDirectory(prefix="modelroll-kube-") as tmp:
        cert_path, key_path = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        for path, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(cert_path, key_path)


def _data_or_file(entry: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    inline = entry.get(f"{key}-data")
    if inline:
        return base64.b64decode(inline)
    file = entry.get(key)
    if file:
        return _resolve(base, str(file)).read_bytes()
    return None


def load_kubeconfig(path: Path, context: str | None = None) -> KubeConnection:
    """Credentials from a kubeconfig file (its current context unless `context` is given)."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise KubeConfigError(f"cannot read kubeconfig {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise KubeConfigError(f"{path}: not a kubeconfig (expected a mapping)")
    base = path.parent
    context_name = context or doc.get("current-context")
    if not context_name:
        raise KubeConfigError(f"{path}: no current-context")
    ctx = _named(doc.get("contexts"), str(context_name), "context", path)
    cluster = _named(doc.get("clusters"), str(ctx.get("cluster")), "cluster", path)
    user = _named(doc.get("users"), str(ctx.get("user")), "user", path) if ctx.get("user") else {}
    server = cluster.get("server")
    if not server:
        raise KubeConfigError(f"{path}: cluster {ctx.get('cluster')!r} has no server")
    if "exec" in user or "auth-provider" in user:
        raise KubeConfigError(f"{path}: exec/auth-provider credentials are not supported")

    ssl_context: ssl.SSLContext | None = None
    if str(server).startswith("https://"):
        ca = _data_or_file(cluster, "certificate-authority", base)
        ssl_context = ssl.create_default_context(cadata=ca.decode() if ca else None)
        if cluster.get("insecure-skip-tls-verify"):
            ssl_context.check_hostname = False
            ssl_context.verify_mode = ssl.CERT_NONE
        cert = _data_or_file(user, "client-certificate", base)
        key = _data_or_file(user, "client-key", base)
        if cert and key:
            _load_cert_chain(ssl_context, cert, key)
        elif cert or key:
            raise KubeConfigError(f"{path}: a client certificate needs both cert and key")

    token_file = _resolve(base, str(user["tokenFile"])) if user.get("tokenFile") else None
    basic = None
    if user.get("username") and user.get("password"):
        basic = (str(user["username"]), str(user["password"]))
    return KubeConnection(
        server=str(server).rstrip("/"),
        ssl_context=ssl_context,
        token=str(user["token"]) if user.get("token") else None,
        token_file=token_file,
        basic_auth=basic,
        namespace=str(ctx["namespace"]) if ctx.get("namespace") else None,
    )


def load_incluster(account_dir: Path = SERVICE_ACCOUNT_DIR) -> KubeConnection:
    """Credentials of the pod's service account."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    token_file = account_dir / "token"
    if not host or not token_file.exists():
        raise KubeConfigError(
            "no kubeconfig: pass --kubeconfig, set KUBECONFIG, "
            "or run in a pod with a service account"
        )
    if ":" in host:
        host = f"[{host}]"
    ssl_context = ssl.create_default_context(cafile=str(account_dir / "ca.crt"))
    ns_file = account_dir / "namespace"
    namespace = ns_file.read_text().strip() if ns_file.exists() else None
    return KubeConnection(
        server=f"https://{host}:{port}",
        ssl_context=ssl_context,
        token_file=token_file,
        namespace=namespace,
    )


def load_connection(kubeconfig: Path | None = None) -> KubeConnection:
    """--kubeconfig, else the first file in $KUBECONFIG, else the in-cluster service account."""
    if kubeconfig is not None:
        return load_kubeconfig(kubeconfig)
    env = os.environ.get("KUBECONFIG", "")
    for item in env.split(os.pathsep):
        if item and Path(item).exists():
            return load_kubeconfig(Path(item))
    return load_incluster()


class KubeClient:
    """List and watch on one aiohttp session (owned by the caller)."""

    def __init__(self, connection: KubeConnection, session: aiohttp.ClientSession) -> None:
        self.connection = connection
        self.session = session

    def _url(self, path: str) -> str:
        return f"{self.connection.server}{path}"

    async def _raise_for(self, resp: aiohttp.ClientResponse) -> None:
        if resp.status < 400:
            return
        text = await resp.text()
        try:
            body = json.loads(text)
        except ValueError:
            body = {"message": text[:500]}
        raise KubeApiError.from_status(resp.status, body if isinstance(body, dict) else None)

    async def get_json(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        """GET a path (a list or an object) and decode it."""
        async with self.session.get(
            self._url(path),
            params=params,
            headers=self.connection.headers(),
            ssl=self.connection.ssl_context or True,
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
        ) as resp:
            await self._raise_for(resp)
            body = await resp.json(content_type=None)
        if not isinstance(body, dict):
            raise KubeApiError(resp.status, "BadResponse", "expected a JSON object")
        return body

    async def watch(
        self, path: str, params: Mapping[str, str], read_timeout: float
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream watch events ({"type": ..., "object": ...}) until the server ends the watch.

        An ERROR event is raised as KubeApiError (410 Gone: the resourceVersion is too old).
        """
        query = {**params, "watch": "true"}
        async with self.session.get(
            self._url(path),
            params=query,
            headers=self.connection.headers(),
            ssl=self.connection.ssl_context or True,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=read_timeout),
        ) as resp:
            await self._raise_for(resp)
            buffer = b""
            async for chunk in resp.content.iter_any():
                buffer += chunk
                while True:
                    end = buffer.find(b"\n")
                    if end < 0:
                        break
                    line, buffer = buffer[:end], buffer[end + 1 :]
                    if line.strip():
                        yield _decode_event(line)
                if len(buffer) > MAX_EVENT_BYTES:
                    raise KubeApiError(resp.status, "EventTooLarge", "a watch event exceeded 8 MiB")
            if buffer.strip():
                yield _decode_event(buffer)


def _decode_event(line: bytes) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except ValueError as exc:
        raise KubeApiError(200, "BadWatchEvent", f"undecodable watch event: {exc}") from None
    if not isinstance(event, dict):
        raise KubeApiError(200, "BadWatchEvent", "a watch event is not an object")
    if event.get("type") == "ERROR":
        obj = event.get("object")
        raise KubeApiError.from_status(500, obj if isinstance(obj, dict) else None)
    return event
