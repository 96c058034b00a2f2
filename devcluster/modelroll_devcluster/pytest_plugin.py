"""pytest fixtures for tests that need a Kubernetes cluster (loaded by the pytest11 entry point).

- ``cluster`` (session): a :class:`~modelroll_devcluster.Cluster`. By default a local control
  plane is started once per test session in a temporary directory (component logs under
  ``<run dir>/logs``) and stopped at the end. With ``MODELROLL_KUBECONFIG=<path>`` the tests target
  that existing cluster instead and nothing is started.
- ``namespace`` (function): a fresh namespace for one test, deleted afterwards; the session
  errors if any is not really gone within a minute of its last test.
- ``kubeconfig`` (function): the cluster's kubeconfig path, also exported as ``KUBECONFIG`` for
  the duration of the test (for kopf, kubernetes clients and subprocesses that read it).
- ``figures`` (function): :class:`Figures`, measured figures printed as a test goes and again
  in the run's terminal summary ("modelroll: measured figures").
- ``node_cluster`` (session): a cluster whose pods really run: a local control plane with a
  node (containerd, kubelet, kube-proxy, kube-scheduler, CNI, CoreDNS; see
  :mod:`modelroll_devcluster.node`), torn down at the end with nothing left on the host. With
  ``MODELROLL_KUBECONFIG`` it is that cluster (kind), like ``cluster``. Needs root,
  ``make node-bins`` and ``make images``; anything missing fails the tests, naming the fix.

A missing binary fails the tests that use ``cluster`` with a message naming ``make cluster-bins``;
it never skips them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .cluster import NAMESPACE_DELETE_TIMEOUT, Cluster, namespace_name
from .controlplane import ControlPlane, default_bin_dir
from .node import Node, detect_node_ip
from .nodehost import leftovers
from .processes import ClusterError

#: Set to a kubeconfig path to run the suite against an existing cluster (e.g. kind).
KUBECONFIG_ENV = "MODELROLL_KUBECONFIG"
FIGURES = pytest.StashKey[list[tuple[str, str]]]()


class Figures:
    """Measured figures: printed as the test goes and again in the run's terminal summary."""

    def __init__(self, store: list[tuple[str, str]]) -> None:
        self.store = store

    def add(self, name: str, value: str) -> None:
        self.store.append((name, value))
        print(f"{name}: {value}")


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Figures:
    return Figures(request.config.stash.setdefault(FIGURES, []))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    measured = config.stash.get(FIGURES, [])
    if not measured:
        return
    where = os.environ.get(KUBECONFIG_ENV, "local")
    terminalreporter.section(f"modelroll: measured figures (cluster: {where})")
    width = max(len(name) for name, _ in measured)
    for name, value in measured:
        terminalreporter.write_line(f"{name.ljust(width)}  {value}")


def _existing(bin_dir: Path) -> Cluster | None:
    """The cluster $MODELROLL_KUBECONFIG names (None when it is unset); fails the test when it
    cannot be read."""
    existing = os.environ.get(KUBECONFIG_ENV)
    if not existing:
        return None
    try:
        return Cluster.existing(Path(existing), bin_dir)
    except (ClusterError, OSError) as err:
        pytest.fail(f"{KUBECONFIG_ENV}={existing}: {err}", pytrace=False)


@pytest.fixture(scope="session")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[Cluster]:
    """A running cluster for the whole session: local control plane or $MODELROLL_KUBECONFIG."""
    bin_dir = default_bin_dir(pytestconfig.rootpath)
    if given := _existing(bin_dir):
        yield given
        return
    plane = ControlPlane(tmp_path_factory.mktemp("cluster"), bin_dir)
    try:
        plane.start()
    except ClusterError as err:
        pytest.fail(str(err), pytrace=False)
    try:
        yield Cluster.local(plane)
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def node_cluster(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[Cluster]:
    """A cluster with a node that runs pods, for the whole session."""
    bin_dir = default_bin_dir(pytestconfig.rootpath)
    if given := _existing(bin_dir):
        yield given
        return
    try:
        plane = ControlPlane(tmp_path_factory.mktemp("node"), bin_dir, node_ip=detect_node_ip())
        node = Node(plane)
    except ClusterError as err:
        pytest.fail(str(err), pytrace=False)
    try:
        plane.start()
        node.start()
    except ClusterError as err:
        node.stop()
        plane.stop()
        pytest.fail(str(err), pytrace=False)
    try:
        yield Cluster.local(plane, node)
    finally:
        node.stop()
        plane.stop()
    if left := leftovers(node.dir):
        pytest.fail(f"the node left this on the host: {'; '.join(left)}", pytrace=False)


@pytest.fixture(scope="session")
def deleted_namespaces(cluster: Cluster) -> Iterator[list[str]]:
    """Namespaces whose deletion the tests started; at the end of the session every one of them
    must be really gone. Waiting once for all of them, rather than after each test, keeps the
    namespace controller's grace-period waits (up to a pod's terminationGracePeriodSeconds) off
    every test's time."""
    names: list[str] = []
    yield names
    deadline = time.monotonic() + NAMESPACE_DELETE_TIMEOUT
    for name in names:
        try:
            cluster.wait_gone("namespace", name, timeout=max(1.0, deadline - time.monotonic()))
        except ClusterError:
            left = [n for n in names if cluster.exists("namespace", n)]
            pytest.fail(
                f"namespaces still there {NAMESPACE_DELETE_TIMEOUT:.0f}s after the last test "
                f"(is kube-controller-manager running?): {', '.join(left)}",
                pytrace=False,
            )


@pytest.fixture
def namespace(
    cluster: Cluster, deleted_namespaces: list[str], request: pytest.FixtureRequest
) -> Iterator[str]:
    """The name of a namespace created for this test and deleted after it (really gone by the
    end of the session)."""
    name = cluster.create_namespace(namespace_name(request.node.name))
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")
    deleted_namespaces.append(name)


@pytest.fixture
def kubeconfig(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cluster's kubeconfig path, exported as KUBECONFIG while the test runs."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    return cluster.kubeconfig
