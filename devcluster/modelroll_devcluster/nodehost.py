"""What a local node changes on its host, and how all of it is put back.

A kubelet, containerd, kube-proxy and the CNI plugins leave state outside their own processes:
container processes and their shims, mounts (container root filesystems, volumes, network
namespaces), a bridge, iptables chains, cgroups and a few sysctls. :func:`sweep` removes all of
it, whether the node stopped cleanly or crashed, so that repeated runs and CI start from a clean
machine. The node runs :func:`sweep` before it starts as well as after it stops.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from .controlplane import pid_alive, pid_cmdline

#: The bridge the CNI config creates (hack's own name, so nothing else on the host is touched).
BRIDGE = "modelroll0"
#: iptables chains kube-proxy, the CNI plugins and the node itself create; rules jumping to them
#: are removed too.
CHAIN_PREFIXES = ("KUBE-", "CNI-", "MODELROLL-")
NO_SERVICE_CHAIN = "MODELROLL-NO-SERVICE"
IPTABLES_TABLES = ("filter", "nat", "mangle")
#: Where each node keeps what needs a short path: containerd's socket and the kubelet's root
#: directory, which hold unix sockets (see :func:`short_dir`).
SOCKETS_DIR = Path("/run/modelroll")
#: Where containerd's CRI plugin bind-mounts pod network namespaces.
NETNS_DIR = Path("/run/netns")
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The cgroup the kubelet puts pods under (cgroupfs driver, cgroupsPerQOS).
KUBEPODS = "kubepods"
#: Sysctls the node needs (forwarding for pods, bridged traffic through kube-proxy's rules)
#: and the ones the kubelet sets by itself; all are restored after the node stops.
NODE_SYSCTLS = {
    "net/ipv4/ip_forward": "1",
    "net/bridge/bridge-nf-call-iptables": "1",
}
KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")


def short_dir(node_dir: Path) -> Path:
    """A short directory of the node's own under /run: a unix socket's path may not exceed 104
    bytes (108 on Linux), and containerd and the kubelet make sockets with long suffixes
    (``<kubelet root>/pod-resources/<10 digits>``), so a node under a deep directory (a pytest
    tmp_path, a long checkout path) could not start."""
    digest = hashlib.sha256(str(node_dir.resolve()).encode()).hexdigest()[:12]
    return SOCKETS_DIR / digest


def containerd_socket(node_dir: Path) -> Path:
    """Where a node's containerd listens."""
    return short_dir(node_dir) / "containerd.sock"


def kubelet_root(node_dir: Path) -> Path:
    """The kubelet's --root-dir (pods' volumes, its plugin and pod-resources sockets)."""
    return short_dir(node_dir) / "kubelet"


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name


def set_sysctls(saved: Path) -> None:
    """Record the current values (once: a crashed run's record is kept) and set the node's."""
    if not saved.exists():
        values = {}
        for name in (*NODE_SYSCTLS, *KUBELET_SYSCTLS):
            with contextlib.suppress(OSError):
                values[name] = _sysctl_path(name).read_text().strip()
        saved.write_text(json.dumps(values, indent=2) + "\n")
    for name, value in NODE_SYSCTLS.items():
        _sysctl_path(name).write_text(value)


def restore_sysctls(saved: Path) -> None:
    try:
        values: dict[str, str] = json.loads(saved.read_text())
    except (FileNotFoundError, ValueError):
        return
    for name, value in values.items():
        with contextlib.suppress(OSError):
            _sysctl_path(name).write_text(value)
    saved.unlink()


def _cgroup_dirs(name: str) -> Iterator[Path]:
    """``name`` under every cgroup v1 hierarchy (and the v2 one) that has it."""
    if not CGROUP_ROOT.is_dir():
        return
    for hierarchy in CGROUP_ROOT.iterdir():
        candidate = hierarchy / name
        if candidate.is_dir():
            yield candidate


def _cgroup_pids(root: Path) -> set[int]:
    # os.walk, not Path.rglob: the kubelet removes pod cgroups while this walks them, and
    # rglob raises for a directory gone between listing and scanning (os.walk skips it).
    pids: set[int] = set()
    for directory, _, files in os.walk(root):
        if "cgroup.procs" in files:
            with contextlib.suppress(OSError, ValueError):
                text = Path(directory, "cgroup.procs").read_text()
                pids.update(int(line) for line in text.split())
    return pids


def kill_pod_processes() -> int:
    """SIGKILL every process in the kubelet's pod cgroups; returns how many there were."""
    pids: set[int] = set()
    for root in _cgroup_dirs(KUBEPODS):
        pids |= _cgroup_pids(root)
    _kill_and_wait(pids)
    return len(pids)


def kill_shims(containerd_address: Path) -> int:
    """SIGKILL the containerd shims that serve ``containerd_address`` (they outlive containerd)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        argv = pid_cmdline(int(entry.name))
        if argv and argv[0].endswith("containerd-shim-runc-v2") and str(containerd_address) in argv:
            pids.append(int(entry.name))
    _kill_and_wait(pids)
    return len(pids)


def _kill_and_wait(pids: Iterable[int], timeout: float = 10.0) -> None:
    pids = list(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)


def remove_cgroups() -> None:
    """rmdir the kubelet's pod cgroups, deepest first, in every hierarchy."""
    for root in _cgroup_dirs(KUBEPODS):
        for directory in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below ``directory``, deepest first (from /proc/self/mountinfo)."""
    prefix = str(directory.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # Field 5 is the mount point, with spaces and the like octal-escaped.
        point = line.split()[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return sorted(set(points), key=lambda p: p.count("/"), reverse=True)


def unmount_under(directory: Path) -> None:
    for point in mounts_under(directory):
        subprocess.run(["umount", "--lazy", point], check=False, capture_output=True)


def remove_netns() -> None:
    """Unmount and remove the pod network namespaces containerd's CRI created (``cni-*``)."""
    if not NETNS_DIR.is_dir():
        return
    for netns in NETNS_DIR.glob("cni-*"):
        subprocess.run(["umount", "--lazy", str(netns)], check=False, capture_output=True)
        with contextlib.suppress(OSError):
            netns.unlink()


def _ours(word: str) -> bool:
    return word.startswith(CHAIN_PREFIXES)


def reject_unprogrammed_services(service_cidr: str) -> None:
    """Refuse connections to a cluster IP that kube-proxy has not translated (yet): a Service
    created a moment ago. Without this they follow the host's default route, and on a network
    with a transparent HTTP proxy a client may keep a connection that some proxy answers.
    Pods' traffic passes the firewall plugin's CNI-ADMIN chain (meant for such rules) first."""
    for table_args in (["-N", NO_SERVICE_CHAIN], ["-N", "CNI-ADMIN"]):
        _iptables("filter", *table_args)
    _iptables(
        "filter",
        "-A",
        NO_SERVICE_CHAIN,
        "-d",
        service_cidr,
        "-p",
        "tcp",
        "-j",
        "REJECT",
        "--reject-with",
        "tcp-reset",
    )
    _iptables("filter", "-A", NO_SERVICE_CHAIN, "-d", service_cidr, "-j", "REJECT")
    _iptables("filter", "-A", "CNI-ADMIN", "-j", NO_SERVICE_CHAIN)
    _iptables("filter", "-A", "OUTPUT", "-j", NO_SERVICE_CHAIN)


def _jumps_to_ours(rule: list[str]) -> bool:
    return "-j" in rule and _ours(rule[rule.index("-j") + 1])


def remove_iptables_chains() -> None:
    """Delete every rule that jumps to a KUBE-*/CNI-* chain, then flush and delete those chains."""
    for table in IPTABLES_TABLES:
        listing = subprocess.run(
            ["iptables", "-w", "-t", table, "-S"], capture_output=True, text=True, check=False
        )
        if listing.returncode != 0:
            continue
        chains: list[str] = []
        for line in listing.stdout.splitlines():
            words = shlex.split(line)
            if words[:1] == ["-N"] and _ours(words[1]):
                chains.append(words[1])
            elif words[:1] == ["-A"] and not _ours(words[1]) and _jumps_to_ours(words):
                _iptables(table, "-D", *words[1:])
        for flag in ("-F", "-X"):
            for chain in chains:
                _iptables(table, flag, chain)


def _iptables(table: str, *args: str) -> None:
    subprocess.run(["iptables", "-w", "-t", table, *args], check=False, capture_output=True)


def remove_bridge() -> None:
    if Path("/sys/class/net", BRIDGE).exists():
        subprocess.run(["ip", "link", "delete", BRIDGE], check=False, capture_output=True)


def leftovers(node_dir: Path) -> list[str]:
    """What of a node is still on the host (empty after a clean tear-down)."""
    found = []
    pods = set().union(*(_cgroup_pids(root) for root in _cgroup_dirs(KUBEPODS)))
    if pods:
        found.append(f"{len(pods)} pod processes")
    if any(True for _ in _cgroup_dirs(KUBEPODS)):
        found.append("kubepods cgroups")
    for directory in (node_dir, short_dir(node_dir)):
        if points := mounts_under(directory) if directory.exists() else []:
            found.append(f"mounts {points[:3]}")
    if short_dir(node_dir).exists():
        found.append(f"directory {short_dir(node_dir)}")
    if NETNS_DIR.is_dir() and (netns := sorted(p.name for p in NETNS_DIR.glob("cni-*"))):
        found.append(f"network namespaces {netns[:3]}")
    if Path("/sys/class/net", BRIDGE).exists():
        found.append(f"bridge {BRIDGE}")
    for table in IPTABLES_TABLES:
        listing = subprocess.run(
            ["iptables", "-w", "-t", table, "-S"], capture_output=True, text=True, check=False
        )
        chains = [w for line in listing.stdout.splitlines() for w in line.split()[1:2]]
        if ours := sorted({c for c in chains if _ours(c)}):
            found.append(f"iptables {table} chains {ours[:3]}")
    return found


def sweep(node_dir: Path) -> None:
    """Remove everything a node leaves on the host. Its own daemons must already be stopped."""
    socket = containerd_socket(node_dir)
    kill_pod_processes()
    kill_shims(socket)
    unmount_under(short_dir(node_dir))  # the pods' volumes, under the kubelet's root
    unmount_under(node_dir)
    shutil.rmtree(short_dir(node_dir), ignore_errors=True)
    remove_netns()
    remove_iptables_chains()
    remove_bridge()
    remove_cgroups()
    restore_sysctls(node_dir / "sysctls.json")
