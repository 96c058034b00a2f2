"""A local Kubernetes control plane: etcd, kube-apiserver and kube-controller-manager on loopback.

The processes run the way controller-runtime's envtest runs them (no kubelet, no scheduler, no
Docker), plus kube-controller-manager so that namespaces really finish deleting and owner
references are garbage-collected. Every port is a free loopback port picked at start, so many
control planes can run side by side on one machine.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import ssl
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import yaml

from .pki import FRONT_PROXY_CLIENT, Pki, create_pki
from .processes import STOP_TIMEOUT, ClusterError, Component, PortTaken, free_port

#: The binaries `make cluster-bins` builds into ``.bin/``.
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")
#: kube-controller-manager's controllers that a cluster without nodes needs: namespace deletion,
#: garbage collection through ownerReferences, Deployments and ReplicaSets, service accounts,
#: ResourceQuota usage (without it the API server refuses nothing a quota limits), the
#: type-checking of ValidatingAdmissionPolicies' expressions against the schemas they read (the
#: chart's, against the CRD's), and HorizontalPodAutoscalers (over a ModelVersion's scale
#: subresource, fed by KEDA's metrics adapter: modelroll_devcluster.keda).
CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "deployment-controller",
    "replicaset-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "resourcequota-controller",
    "validatingadmissionpolicy-status-controller",
    "horizontal-pod-autoscaler-controller",
)
#: What a cluster with a node (modelroll_devcluster.node) needs on top: Services get endpoints,
#: every namespace gets the CA that pods' service-account volumes carry, finished pods go, and a
#: node's not-ready taint goes once its kubelet reports Ready.
NODE_CONTROLLERS = (
    "node-lifecycle-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "root-ca-certificate-publisher-controller",
    "pod-garbage-collector-controller",
)
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
HPA_SYNC_PERIOD = "2s"
"""How often kube-controller-manager's HPA controller reads the metrics and sets the replicas."""


class MissingBinaryError(ClusterError):
    """A control-plane binary has not been built."""


def repo_root(start: Path | None = None) -> Path | None:
    """The checkout holding ``start`` (or this package), recognised by its hack/cluster.mk."""
    candidates = [start.resolve()] if start else []
    candidates.append(Path(__file__).resolve())
    for candidate in candidates:
        for directory in (candidate, *candidate.parents):
            if (directory / "hack" / "cluster.mk").is_file():
                return directory
    return None


def default_bin_dir(start: Path | None = None) -> Path:
    """``$MODELROLL_BIN_DIR``, else ``.bin/`` at the top of the checkout."""
    if env := os.environ.get("MODELROLL_BIN_DIR"):
        return Path(env).resolve()
    root = repo_root(start)
    return (root if root else Path.cwd()) / ".bin"


def find_binaries(bin_dir: Path, names: Sequence[str] = BINARIES) -> dict[str, Path]:
    """Paths of the named binaries in ``bin_dir``; raises MissingBinaryError naming the fix."""
    found = {name: bin_dir / name for name in names}
    missing = [n for n, p in found.items() if not (p.is_file() and os.access(p, os.X_OK))]
    if missing:
        raise MissingBinaryError(
            f"missing control-plane binaries in {bin_dir}: {', '.join(missing)}. "
            "Build them with `make cluster-bins` (or point MODELROLL_BIN_DIR at a directory "
            "that has them)."
        )
    return found


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # The state is the field after the parenthesised command name.
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def pid_cmdline(pid: int) -> list[str]:
    """The argv of ``pid`` ([] when it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def stop_pid(pid: int, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM ``pid``, wait up to ``timeout`` s, then SIGKILL it; it need not be our child."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while pid_alive(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)
    _reap(pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


class ControlPlane:
    """etcd, kube-apiserver and kube-controller-manager, started and stopped together.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. Everything it writes
    (certificates, etcd data, component logs, the admin kubeconfig) lives in ``run_dir``.
    """

    def __init__(
        self,
        run_dir: Path,
        bin_dir: Path | None = None,
        *,
        die_with_parent: bool = True,
        start_timeout: float = 60.0,
        extra_apiserver_args: Sequence[str] = (),
        node_ip: str | None = None,
    ) -> None:
        self.run_dir = run_dir.resolve()
        self.bin_dir = (bin_dir or default_bin_dir()).resolve()
        self.die_with_parent = die_with_parent
        self.start_timeout = start_timeout
        self.extra_apiserver_args = list(extra_apiserver_args)
        #: Set when a node (kubelet, pods) joins: the API server then listens on every address and
        #: advertises this one, authorizes kubelets as nodes, and mounts service-account tokens.
        self.node_ip = node_ip
        self.kubeconfig = self.run_dir / "kubeconfig"
        self.pki = Pki.in_dir(self.run_dir / "pki")
        self.etcd_port = self.etcd_peer_port = self.apiserver_port = self.kcm_port = 0
        self.components: dict[str, Component] = {}
        self._ssl: ssl.SSLContext | None = None

    # -- public surface -------------------------------------------------------------------

    @property
    def server(self) -> str:
        """The API server URL, e.g. ``https://127.0.0.1:40123``."""
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def log_dir(self) -> Path:
        """Where each component's log is kept (``etcd.log``, ``kube-apiserver.log``, ...)."""
        return self.run_dir / "logs"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    def pids(self) -> dict[str, int]:
        """The pid of every running component, by name."""
        return {n: c.pid for n, c in self.components.items() if c.pid is not None and c.running()}

    def start(self) -> Self:
        """Start all components and wait until each is ready; on failure nothing is left running."""
        binaries = find_binaries(self.bin_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        create_pki(self.pki.ca_cert.parent, (self.node_ip,) if self.node_ip else ())
        self._ssl = self._client_ssl()
        try:
            for attempt in range(3):
                try:
                    self._start_all(binaries)
                    return self
                except PortTaken:
                    self.stop()
                    if attempt == 2:
                        raise
            return self  # pragma: no cover - the loop returns or raises
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the components in reverse start order (SIGTERM, then SIGKILL after ``timeout``)."""
        for component in reversed(list(self.components.values())):
            component.stop(timeout)

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver and start it again on the same port over the same etcd."""
        component = self.components["kube-apiserver"]
        component.stop()
        component.start(die_with_parent=self.die_with_parent)
        self._wait_apiserver(component)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """GET ``path`` from the API server as the admin; returns (status, body)."""
        return _https_get(self.apiserver_port, path, self._client_ssl(), timeout)

    # -- start-up ---------------------------------------------------------------------------

    def _start_all(self, binaries: Mapping[str, Path]) -> None:
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.apiserver_port, self.kcm_port = free_port(), free_port()
        data_dir = self.run_dir / "etcd-data"
        shutil.rmtree(data_dir, ignore_errors=True)
        logs = self.log_dir
        self.components = {
            "etcd": Component(
                "etcd", self._etcd_argv(binaries["etcd"], data_dir), logs / "etcd.log"
            ),
            "kube-apiserver": Component(
                "kube-apiserver",
                self._apiserver_argv(binaries["kube-apiserver"]),
                logs / "kube-apiserver.log",
            ),
            "kube-controller-manager": Component(
                "kube-controller-manager",
                self._kcm_argv(binaries["kube-controller-manager"]),
                logs / "kube-controller-manager.log",
            ),
        }
        etcd = self.components["etcd"]
        etcd.start(die_with_parent=self.die_with_parent)
        self._wait(etcd, self._etcd_ready)

        apiserver = self.components["kube-apiserver"]
        apiserver.start(die_with_parent=self.die_with_parent)
        self._wait_apiserver(apiserver)
        self._write_kubeconfig()

        kcm = self.components["kube-controller-manager"]
        kcm.start(die_with_parent=self.die_with_parent)
        self._wait(kcm, self._kcm_ready)
        # The serviceaccount controller answers only once kube-controller-manager has synced
        # its informers and runs its controllers: a stronger signal than its /healthz.
        self._wait(kcm, lambda: self._api_ok("/api/v1/namespaces/default/serviceaccounts/default"))

    def _wait_apiserver(self, apiserver: Component) -> None:
        self._wait(apiserver, lambda: self._api_ok("/readyz"))
        self._wait(apiserver, lambda: self._api_ok("/api/v1/namespaces/default"))

    def _wait(self, component: Component, ready: Callable[[], bool]) -> None:
        """Poll ``ready`` every 100 ms until it holds, the component dies, or time runs out."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            if not component.running():
                raise component.exited()
            if ready():
                return
            if time.monotonic() > deadline:
                raise component.failure(f"was not ready after {self.start_timeout:.0f}s")
            time.sleep(0.1)

    def _etcd_ready(self) -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.etcd_port, timeout=1)
            try:
                conn.request("GET", "/health")
                response = conn.getresponse()
                body = json.loads(response.read() or b"{}")
            finally:
                conn.close()
        except (OSError, ValueError, http.client.HTTPException):
            return False
        return response.status == 200 and body.get("health") == "true"

    def _api_ok(self, path: str) -> bool:
        try:
            status, _ = self.get(path, timeout=2)
        except (OSError, http.client.HTTPException):
            return False
        return status == 200

    def _kcm_ready(self) -> bool:
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # its serving cert is self-signed
        try:
            status, _ = _https_get(self.kcm_port, "/healthz", insecure, 2)
        except (OSError, http.client.HTTPException):
            return False
        return status == 200

    def _client_ssl(self) -> ssl.SSLContext:
        if self._ssl is None:
            context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
            context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
            self._ssl = context
        return self._ssl

    # -- command lines ----------------------------------------------------------------------

    def _etcd_argv(self, binary: Path, data_dir: Path) -> list[str]:
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        return [
            str(binary),
            "--name=devcluster",
            f"--data-dir={data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=devcluster={peer}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]

    def _apiserver_argv(self, binary: Path) -> list[str]:
        pki = self.pki
        if self.node_ip:
            access = [
                "--bind-address=0.0.0.0",
                f"--advertise-address={self.node_ip}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                # For logs, exec and port-forward through the kubelet.
                f"--kubelet-client-certificate={pki.admin_cert}",
                f"--kubelet-client-key={pki.admin_key}",
                "--kubelet-preferred-address-types=InternalIP",
            ]
        else:
            access = [
                "--bind-address=127.0.0.1",
                "--authorization-mode=RBAC",
                # No kubelet mounts tokens, and pods must not wait for a default ServiceAccount.
                "--disable-admission-plugins=ServiceAccount",
            ]
        return [
            str(binary),
            f"--etcd-servers={self.etcd_url}",
            f"--cert-dir={self.run_dir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            *access,
            f"--secure-port={self.apiserver_port}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            f"--service-account-issuer=https://127.0.0.1:{self.apiserver_port}/",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            *self._aggregation_args(),
            # Close open watches (kube-controller-manager's, an operator's) on SIGTERM instead of
            # waiting up to --request-timeout for them, so a stop or restart takes about a second.
            "--shutdown-watch-termination-grace-period=2s",
            "--profiling=false",
            *self.extra_apiserver_args,
        ]

    def _aggregation_args(self) -> list[str]:
        """The aggregation layer: the API server proxies an APIService's group to an extension
        API server (KEDA's metrics adapter) as ``front-proxy-client``, naming the user in request
        headers the extension server trusts through the front-proxy CA (kubeadm's layout)."""
        pki = self.pki
        return [
            f"--requestheader-client-ca-file={pki.front_proxy_ca_cert}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-uid-headers=X-Remote-Uid",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.front_proxy_client_cert}",
            f"--proxy-client-key-file={pki.front_proxy_client_key}",
        ]

    def _kcm_argv(self, binary: Path) -> list[str]:
        kubeconfig = str(self.kubeconfig)
        return [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.kcm_port}",
            f"--cert-dir={self.run_dir / 'kcm-certs'}",
            "--leader-elect=false",
            f"--controllers={','.join(CONTROLLERS + (NODE_CONTROLLERS if self.node_ip else ()))}",
            f"--root-ca-file={self.pki.ca_cert}",
            f"--service-account-private-key-file={self.pki.sa_key}",
            # The HPA controller's period (15 s by default) is how long a change of load takes
            # to reach a scale target's replicas; a shorter one keeps the autoscaling tests short.
            f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_PERIOD}",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--profiling=false",
        ]

    def _write_kubeconfig(self) -> None:
        write_kubeconfig(self.kubeconfig, self.server, self.pki)


def _https_get(port: int, path: str, context: ssl.SSLContext, timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=context)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def write_kubeconfig(path: Path, server: str, pki: Pki) -> None:
    """An admin kubeconfig (context ``modelroll-devcluster``) with the CA and client cert inline."""

    def b64(p: Path) -> str:
        import base64

        return base64.b64encode(p.read_bytes()).decode()

    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "modelroll-devcluster",
                "cluster": {"server": server, "certificate-authority-data": b64(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate-data": b64(pki.admin_cert),
                    "client-key-data": b64(pki.admin_key),
                },
            }
        ],
        "contexts": [
            {
                "name": "modelroll-devcluster",
                "context": {"cluster": "modelroll-devcluster", "user": "admin"},
            }
        ],
        "current-context": "modelroll-devcluster",
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)


@contextlib.contextmanager
def running_control_plane(run_dir: Path, bin_dir: Path | None = None) -> Iterator[ControlPlane]:
    """Start a control plane in ``run_dir`` for the duration of the ``with`` block."""
    plane = ControlPlane(run_dir, bin_dir)
    with plane:
        yield plane
