"""pytest fixtures for tests that need a Kubernetes cluster (loaded by the pytest11 entry point).

- ``cluster`` (session): a :class:`~modelroll_devcluster.Cluster`. By default a local control
  plane is started once per test session in a temporary directory (component logs under
  ``<run dir>/logs``) and stopped at the end. With ``MODELROLL_KUBECONFIG=<path>`` the tests target
  that existing cluster instead and nothing is started.
- ``namespace`` (function): a fresh namespace for one test; deleted afterwards, and the test
  errors if it is not really gone within a minute.
- ``kubeconfig`` (function): the cluster's kubeconfig path, also exported as ``KUBECONFIG`` for
  the duration of the test (for kopf, kubernetes clients and subprocesses that read it).

A missing binary fails the tests that use ``cluster`` with a message naming ``make cluster-bins``;
it never skips them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster import Cluster, namespace_name
from .controlplane import ClusterError, ControlPlane, default_bin_dir

#: Set to a kubeconfig path to run the suite against an existing cluster (e.g. kind).
KUBECONFIG_ENV = "MODELROLL_KUBECONFIG"


@pytest.fixture(scope="session")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[Cluster]:
    """A running cluster for the whole session: local control plane or $MODELROLL_KUBECONFIG."""
    bin_dir = default_bin_dir(pytestconfig.rootpath)
    if existing := os.environ.get(KUBECONFIG_ENV):
        try:
            given = Cluster.existing(Path(existing), bin_dir)
        except (ClusterError, OSError) as err:
            pytest.fail(f"{KUBECONFIG_ENV}={existing}: {err}", pytrace=False)
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


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """The name of a namespace created for this test and deleted (really gone) after it."""
    name = cluster.create_namespace(namespace_name(request.node.name))
    yield name
    cluster.delete_namespace(name)


@pytest.fixture
def kubeconfig(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cluster's kubeconfig path, exported as KUBECONFIG while the test runs."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    return cluster.kubeconfig
