"""A real node for the local control plane: containerd (CRI), kubelet, kube-proxy, kube-scheduler,
CNI bridge networking and CoreDNS, so that pods run, Services carry traffic and names resolve.

Everything runs as processes of this machine, as root (the kubelet and containerd need it):

- containerd from the host (Debian's ``containerd``, ``runc``, ``containernetworking-plugins``)
  on its own socket, state and CNI config under the run directory;
- kubelet, kube-proxy (iptables mode) and kube-scheduler from ``make node-bins``, each with a
  client certificate of its own identity (``system:node:<name>``, ``system:kube-proxy``,
  ``system:kube-scheduler``);
- the images from ``make images`` (``.cache/images/*.tar``), imported into containerd: nothing
  is pulled, so pods name them by an explicit tag with ``imagePullPolicy: IfNotPresent``;
- CoreDNS as a Deployment behind the ``kube-dns`` Service at :data:`DNS_IP`.

The control plane must be started with ``node_ip`` (see :class:`ControlPlane`). :meth:`Node.stop`
leaves no process, mount, bridge, iptables chain or cgroup behind (:mod:`.nodehost`).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import yaml

from . import nodehost
from .controlplane import (
    SERVICE_CLUSTER_IP_RANGE,
    ControlPlane,
    MissingBinaryError,
    find_binaries,
    repo_root,
)
from .pki import issue_client_cert
from .processes import ClusterError, Component, PortTaken, free_port

NODE_BINARIES = ("kubelet", "kube-proxy", "kube-scheduler")
NODE_NAME = "modelroll-node"
POD_CIDR = "10.244.0.0/24"
DNS_IP = "10.0.0.10"
KUBERNETES_SERVICE_IP = "10.0.0.1"
CLUSTER_DOMAIN = "cluster.local"
CNI_BIN_DIR = Path("/usr/lib/cni")
#: The node's own images, built by `make images` next to the project's (hack/node.mk).
PAUSE_IMAGE = "modelroll.local/pause:3.10.2"
COREDNS_PORT = 1053
HOST_COMMANDS = ("containerd", "runc", "ctr", "iptables", "ip", "umount")


def default_images_dir() -> Path:
    """``$MODELROLL_IMAGES_DIR``, else ``.cache/images`` at the top of the checkout."""
    if env := os.environ.get("MODELROLL_IMAGES_DIR"):
        return Path(env).resolve()
    root = repo_root()
    return (root if root else Path.cwd()) / ".cache" / "images"


def detect_node_ip() -> str:
    """``$MODELROLL_NODE_IP``, else the address this host uses for its default route."""
    if env := os.environ.get("MODELROLL_NODE_IP"):
        return env
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # TEST-NET-3; no packet is sent, it picks a route
        except OSError as err:
            raise ClusterError(
                "no default route to take a node IP from; set MODELROLL_NODE_IP"
            ) from err
        address: str = probe.getsockname()[0]
    if address.startswith("127."):
        raise ClusterError(f"the node IP would be {address}; set MODELROLL_NODE_IP")
    return address


def preflight(bin_dir: Path, images_dir: Path) -> dict[str, Path]:
    """The node's binaries; raises naming the fix for anything missing."""
    if os.geteuid() != 0:
        raise ClusterError("a local node runs the kubelet and containerd, which need root")
    binaries = find_binaries(bin_dir, NODE_BINARIES)
    missing = [c for c in HOST_COMMANDS if shutil.which(c) is None]
    if not (CNI_BIN_DIR / "bridge").exists():
        missing.append(f"{CNI_BIN_DIR}/bridge")
    if missing:
        raise MissingBinaryError(
            f"missing on this host: {', '.join(missing)}. Install the Debian packages "
            "containerd, runc, containernetworking-plugins, iptables, conntrack and iproute2 "
            "(`make node-packages` does)."
        )
    tars = sorted(images_dir.glob("*.tar")) if images_dir.is_dir() else []
    if not any(t.name == "pause.tar" for t in tars):
        raise MissingBinaryError(f"no node images in {images_dir}: run `make images`")
    return binaries


class Node:
    """One node joined to a started :class:`ControlPlane`; a context manager like it."""

    def __init__(
        self,
        plane: ControlPlane,
        *,
        images_dir: Path | None = None,
        start_timeout: float = 120.0,
    ) -> None:
        if not plane.node_ip:
            raise ClusterError("the control plane was not started for a node (node_ip unset)")
        self.plane = plane
        self.node_ip = plane.node_ip
        self.images_dir = images_dir or default_images_dir()
        self.start_timeout = start_timeout
        self.dir = plane.run_dir / "node"
        self.containerd_socket = nodehost.containerd_socket(self.dir)
        self.components: dict[str, Component] = {}

    # -- public surface -------------------------------------------------------------------

    def start(self) -> Self:
        """Start containerd, kubelet, kube-proxy and kube-scheduler, import the images, run
        CoreDNS, and wait until the node is Ready and DNS answers; on failure nothing is left.
        A component that loses a port picked for it to another process is started again, with
        the others, on new ports (up to three times)."""
        binaries = preflight(self.plane.bin_dir, self.images_dir)
        for attempt in range(3):
            try:
                return self._start(binaries)
            except PortTaken:
                if attempt == 2:
                    raise
        return self  # pragma: no cover - the loop returns or raises

    def _start(self, binaries: dict[str, Path]) -> Self:
        self.stop()  # a crashed run's leftovers
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        try:
            nodehost.set_sysctls(self.dir / "sysctls.json")
            nodehost.reject_unprogrammed_services(SERVICE_CLUSTER_IP_RANGE)
            self._write_config()
            logs = self.plane.log_dir
            self.components = {
                "containerd": Component(
                    "containerd",
                    ["containerd", "--config", str(self.dir / "containerd" / "config.toml")],
                    logs / "containerd.log",
                ),
                "kubelet": Component("kubelet", self._kubelet_argv(binaries), logs / "kubelet.log"),
                "kube-proxy": Component(
                    "kube-proxy",
                    [str(binaries["kube-proxy"]), f"--config={self.dir / 'kube-proxy.yaml'}"],
                    logs / "kube-proxy.log",
                ),
                "kube-scheduler": Component(
                    "kube-scheduler", self._scheduler_argv(binaries), logs / "kube-scheduler.log"
                ),
            }
            containerd = self.components["containerd"]
            self.containerd_socket.parent.mkdir(parents=True, exist_ok=True)
            containerd.start(die_with_parent=self.plane.die_with_parent)
            self._wait(self.containerd_socket.exists, "containerd")
            self.import_images()
            for name in ("kubelet", "kube-proxy", "kube-scheduler"):
                self.components[name].start(die_with_parent=self.plane.die_with_parent)
            self._wait(self._node_ready, "kubelet")
            self._kubectl("apply", "-f", "-", input=yaml.safe_dump_all(coredns_manifests()))
            self._wait(self._dns_ready, "kubelet")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the node and remove everything it left on the host (safe to call twice)."""
        for name in ("kube-scheduler", "kubelet"):
            if component := self.components.get(name):
                component.stop()
        # With the kubelet gone nothing restarts the containers: kill them, then their shims.
        nodehost.kill_pod_processes()
        nodehost.kill_shims(self.containerd_socket)
        for name in ("containerd", "kube-proxy"):
            if component := self.components.get(name):
                component.stop()
        nodehost.sweep(self.dir)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def ctr(self, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        """containerd's ``ctr`` on this node's socket, in the Kubernetes namespace."""
        argv = ["ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args]
        return subprocess.run(argv, input=input, capture_output=True, check=False, timeout=300)

    def import_images(self) -> None:
        """Import every ``.cache/images/*.tar`` into containerd."""
        for tar in sorted(self.images_dir.glob("*.tar")):
            result = self.ctr("images", "import", str(tar))
            if result.returncode != 0:
                raise ClusterError(f"importing {tar} failed: {result.stderr.decode().strip()}")

    # -- readiness --------------------------------------------------------------------------

    def _wait(self, ready: Callable[[], bool], waiting_on: str) -> None:
        """Poll ``ready`` until it holds; fail as soon as a started component exits, or with
        the log of ``waiting_on`` (the component it depends on most) when time runs out."""
        deadline = time.monotonic() + self.start_timeout
        while not ready():
            for component in self.components.values():
                if component.process is not None and not component.running():
                    raise component.exited()
            if time.monotonic() > deadline:
                component = self.components[waiting_on]
                raise component.failure(f"was not ready after {self.start_timeout:.0f}s")
            time.sleep(0.2)

    def _get_json(self, path: str) -> Any:
        try:
            status, body = self.plane.get(path)
        except OSError:
            return None
        return json.loads(body) if status == 200 else None

    def _node_ready(self) -> bool:
        node = self._get_json(f"/api/v1/nodes/{NODE_NAME}")
        conditions = (node or {}).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _dns_ready(self) -> bool:
        """Whether the cluster's DNS answers through its Service, as pods will ask it (which
        needs CoreDNS ready and kube-proxy's rules for the Service in place)."""
        return resolve(f"kubernetes.default.svc.{CLUSTER_DOMAIN}") == KUBERNETES_SERVICE_IP

    def _kubectl(self, *args: str, input: str | None = None) -> None:
        kubectl = find_binaries(self.plane.bin_dir, ("kubectl",))["kubectl"]
        result = subprocess.run(
            [str(kubectl), f"--kubeconfig={self.plane.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if result.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")

    # -- configuration ----------------------------------------------------------------------

    def _write_config(self) -> None:
        pki = self.plane.pki
        for stem, user, group in (
            ("kubelet", f"system:node:{NODE_NAME}", "system:nodes"),
            ("kube-proxy", "system:kube-proxy", None),
            ("kube-scheduler", "system:kube-scheduler", None),
        ):
            cert = issue_client_cert(pki, stem, user, group)
            self._write_kubeconfig(self.dir / f"{stem}.kubeconfig", user, cert)
        containerd = self.dir / "containerd"
        cni = self.dir / "cni"
        kubelet_dirs = (self.dir / "kubelet", nodehost.kubelet_root(self.dir))
        for directory in (containerd, cni / "net.d", *kubelet_dirs):
            directory.mkdir(parents=True, exist_ok=True)
        (containerd / "config.toml").write_text(self._containerd_toml(containerd, cni))
        (cni / "net.d" / "10-modelroll.conflist").write_text(json.dumps(self._cni(cni), indent=2))
        self._write_yaml("kubelet.yaml", self._kubelet_config())
        self._write_yaml("kube-proxy.yaml", self._kube_proxy_config())

    def _write_yaml(self, name: str, document: dict[str, Any]) -> None:
        (self.dir / name).write_text(yaml.safe_dump(document, sort_keys=False))

    def _write_kubeconfig(self, path: Path, user: str, cert: Path) -> None:
        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": self.plane.server,
                        "certificate-authority-data": b64(self.plane.pki.ca_cert),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": b64(cert),
                        "client-key-data": b64(cert.with_suffix(".key")),
                    },
                }
            ],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
            "current-context": "local",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)

    def _containerd_toml(self, containerd: Path, cni: Path) -> str:
        # containerd 1.6's CRI plugin (config version 2). runc cannot set a negative
        # oom_score_adj on hosts without CAP_SYS_RESOURCE, hence restrict_oom_score_adj.
        return f"""version = 2
root = "{containerd / "root"}"
state = "{containerd / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "{self.containerd_socket}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni / "net.d"}"
"""

    def _cni(self, cni: Path) -> dict[str, Any]:
        # The firewall plugin admits pod traffic in FORWARD whatever the host's policy is.
        return {
            "cniVersion": "1.0.0",
            "name": "modelroll",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": nodehost.BRIDGE,
                    "isGateway": True,
                    "ipMasq": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(cni / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
                {"type": "firewall"},
            ],
        }

    def _kubelet_config(self) -> dict[str, Any]:
        pki = self.plane.pki
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This host has cgroup v1, which kubelet 1.35+ refuses unless told otherwise.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": self.node_ip,
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(pki.ca_cert)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "clusterDNS": [DNS_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": "/etc/resolv.conf",
            # Without CAP_SYS_RESOURCE the kubelet can neither lower its own oom_score_adj nor
            # raise RLIMIT_NOFILE past the hard limit; these values avoid both attempts.
            "oomScoreAdj": 0,
            "maxOpenFiles": 20000,
            "failSwapOn": False,
            "protectKernelDefaults": False,
            # A developer's disk may be fuller than the defaults allow; nothing can be pulled
            # again once evicted or garbage-collected, so images are never collected.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "shutdownGracePeriod": "0s",
        }

    def _kubelet_argv(self, binaries: dict[str, Path]) -> list[str]:
        return [
            str(binaries["kubelet"]),
            f"--config={self.dir / 'kubelet.yaml'}",
            f"--kubeconfig={self.dir / 'kubelet.kubeconfig'}",
            f"--root-dir={nodehost.kubelet_root(self.dir)}",
            f"--cert-dir={self.dir / 'kubelet' / 'pki'}",
            f"--node-ip={self.node_ip}",
            f"--hostname-override={NODE_NAME}",
            "--v=1",
        ]

    def _kube_proxy_config(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.dir / "kube-proxy.kubeconfig")},
            "hostnameOverride": NODE_NAME,
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            # Leave the host's conntrack limits and timeouts as they are.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "iptables": {"localhostNodePorts": False},
        }

    def _scheduler_argv(self, binaries: dict[str, Path]) -> list[str]:
        kubeconfig = str(self.dir / "kube-scheduler.kubeconfig")
        return [
            str(binaries["kube-scheduler"]),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--leader-elect=false",
        ]


def resolve(name: str, server: str = DNS_IP, timeout: float = 1.0) -> str | None:
    """The first IPv4 address ``server`` gives for ``name`` (one UDP query), or None."""
    query_id = secrets.randbits(16)
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    packet = struct.pack(">HHHHHH", query_id, 0x0100, 1, 0, 0, 0) + question + b"\0\1\0\1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.sendto(packet, (server, 53))
            answer = sock.recv(512)
        except OSError:
            return None
    ident, flags, _, count = struct.unpack(">HHHH", answer[:8])
    # The last record: ... TYPE(2) CLASS(2) TTL(4) RDLENGTH(2) RDATA; an A record's is 4 bytes.
    is_a = answer[-14:-12] == b"\0\1" and answer[-6:-4] == b"\0\4"
    if ident != query_id or flags & 0xF or count == 0 or not is_a:
        return None
    return socket.inet_ntoa(answer[-4:])


def coredns_manifests() -> list[dict[str, Any]]:
    """CoreDNS in kube-system: RBAC to watch Services and EndpointSlices, the Corefile, a
    Deployment of the locally built image, and the ``kube-dns`` Service at :data:`DNS_IP`.
    It listens on an unprivileged port, so it runs as non-root with no added capability."""
    labels = {"k8s-app": "kube-dns"}
    meta = {"name": "coredns", "namespace": "kube-system"}
    corefile = f""".:{COREDNS_PORT} {{
    errors
    health :8080
    ready :8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    forward . /etc/resolv.conf
    cache 30
}}
"""
    container = {
        "name": "coredns",
        "image": f"modelroll.local/coredns:{coredns_version()}",
        "imagePullPolicy": "Never",
        "args": ["-conf", "/etc/coredns/Corefile"],
        "ports": [
            {"name": "dns", "containerPort": COREDNS_PORT, "protocol": "UDP"},
            {"name": "dns-tcp", "containerPort": COREDNS_PORT, "protocol": "TCP"},
        ],
        "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
        "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["services", "namespaces", "pods"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", **meta}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta,
            "data": {"Corefile": corefile},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {**meta, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "dnsPolicy": "Default",
                        "containers": [container],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
            "spec": {
                "clusterIP": DNS_IP,
                "selector": labels,
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": "dns", "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": "dns-tcp", "protocol": "TCP"},
                ],
            },
        },
    ]


def coredns_version() -> str:
    """The CoreDNS version hack/go/coredns pins (the image's tag, as hack/node.mk sets it)."""
    root = repo_root()
    gomod = (root if root else Path.cwd()) / "hack" / "go" / "coredns" / "go.mod"
    for line in gomod.read_text().splitlines():
        words = line.split()
        if words[:2] == ["require", "github.com/coredns/coredns"]:
            return words[2]
    raise ClusterError(f"{gomod} does not require github.com/coredns/coredns")
