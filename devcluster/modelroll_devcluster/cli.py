"""``modelroll-cluster``: start, stop and inspect the local control plane from the command line.

``up`` leaves etcd, kube-apiserver and kube-controller-manager running in the background and
records their pids in ``<dir>/state.json``; ``down`` stops exactly those processes. ``run`` keeps
the control plane in the foreground until interrupted. With ``--node`` (``make cluster-up
NODE=1``) a node joins it (:mod:`.node`: containerd, kubelet, kube-proxy, kube-scheduler, CNI,
CoreDNS), and ``down`` also removes what the node left on the host.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from . import nodehost
from .controlplane import ControlPlane, default_bin_dir, pid_alive, pid_cmdline, stop_pid
from .node import NODE_NAME, Node, detect_node_ip
from .processes import ClusterError

STATE_FILE = "state.json"


@dataclass
class State:
    """What ``up`` leaves behind so that ``down`` and ``status`` can find the processes."""

    server: str
    kubeconfig: str
    pids: dict[str, int]
    argv0: dict[str, str]
    node: bool = False

    @classmethod
    def load(cls, directory: Path) -> State | None:
        try:
            raw = json.loads((directory / STATE_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return cls(**raw)

    def save(self, directory: Path) -> None:
        tmp = directory / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(directory / STATE_FILE)

    def ours(self, name: str) -> bool:
        """Whether the recorded pid still runs the recorded binary (pids get reused)."""
        pid = self.pids[name]
        cmdline = pid_cmdline(pid)
        return pid_alive(pid) and bool(cmdline) and cmdline[0] == self.argv0[name]

    def running(self) -> list[str]:
        return [name for name in self.pids if self.ours(name)]


def _export_line(kubeconfig: str) -> str:
    return f"export KUBECONFIG={kubeconfig}"


def _stop(directory: Path, state: State) -> None:
    for name in reversed(list(state.pids)):
        if state.ours(name):
            stop_pid(state.pids[name])
    if state.node:
        nodehost.sweep(directory / "node")
    (directory / STATE_FILE).unlink(missing_ok=True)


def cmd_up(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    state = State.load(directory)
    if state is not None:
        running = state.running()
        if len(running) == len(state.pids):
            print(f"Control plane already up at {state.server}", file=sys.stderr)
            print(_export_line(state.kubeconfig))
            return 0
        print(
            f"Control plane in {directory} was partly down ({', '.join(running) or 'nothing'}"
            " running); restarting it",
            file=sys.stderr,
        )
        _stop(directory, state)
    node_ip = detect_node_ip() if args.node else None
    plane = ControlPlane(directory, args.bin_dir, die_with_parent=False, node_ip=node_ip)
    plane.start()
    components = dict(plane.components)
    if args.node:
        node = Node(plane)
        try:
            node.start()
        except BaseException:
            plane.stop()
            raise
        components.update(node.components)
    pids = {n: c.pid for n, c in components.items() if c.pid is not None and c.running()}
    State(
        server=plane.server,
        kubeconfig=str(plane.kubeconfig),
        pids=pids,
        argv0={name: components[name].argv[0] for name in pids},
        node=args.node,
    ).save(directory)
    what = f"Control plane and node {NODE_NAME} ({node_ip})" if args.node else "Control plane"
    print(f"{what} up at {plane.server} (logs in {directory / 'logs'})", file=sys.stderr)
    print(_export_line(str(plane.kubeconfig)))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
    state = State.load(directory)
    if state is None:
        print(f"No control plane recorded in {directory}", file=sys.stderr)
        return 0
    _stop(directory, state)
    print("Control plane stopped", file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    directory: Path = args.dir.resolve()
    state = State.load(directory)
    if state is None:
        print("down")
        return 1
    running = state.running()
    if len(running) != len(state.pids):
        print(f"degraded: running {', '.join(running) or 'nothing'} of {', '.join(state.pids)}")
        return 1
    print(f"up: {state.server}, KUBECONFIG={state.kubeconfig}")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    state = State.load(args.dir.resolve())
    if state is None:
        print("No control plane is up; run `make cluster-up`", file=sys.stderr)
        return 1
    print(_export_line(state.kubeconfig))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    node_ip = detect_node_ip() if args.node else None
    with contextlib.ExitStack() as stack:
        plane = stack.enter_context(ControlPlane(args.dir.resolve(), args.bin_dir, node_ip=node_ip))
        if args.node:
            stack.enter_context(Node(plane))
        print(_export_line(str(plane.kubeconfig)), flush=True)
        print("Cluster running; Ctrl-C stops it", file=sys.stderr)
        stop.wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="modelroll-cluster", description=__doc__)
    parser.add_argument(
        "--dir", type=Path, default=Path(".cluster"), help="state and logs (default: .cluster)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, text in (
        ("up", cmd_up, "start in the background (does nothing when already up)"),
        ("down", cmd_down, "stop what `up` started"),
        ("status", cmd_status, "exit 0 when up"),
        ("env", cmd_env, "print the export KUBECONFIG=... line"),
        ("run", cmd_run, "run in the foreground until Ctrl-C"),
    ):
        command = sub.add_parser(name, help=text)
        command.set_defaults(func=func)
        command.add_argument("--dir", type=Path, default=argparse.SUPPRESS)
        if name in ("up", "run"):
            command.add_argument(
                "--node",
                action="store_true",
                help="also run a node (root; make node-bins and make images first)",
            )
            command.add_argument(
                "--bin-dir",
                type=Path,
                default=None,
                help="where the binaries are (default: $MODELROLL_BIN_DIR or .bin)",
            )
    args = parser.parse_args(argv)
    if getattr(args, "bin_dir", None) is None and args.command in ("up", "run"):
        args.bin_dir = default_bin_dir(Path.cwd())
    try:
        code: int = args.func(args)
    except ClusterError as err:
        print(f"modelroll-cluster: {err}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
