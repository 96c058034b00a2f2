"""A local Kubernetes control plane built from Go modules, for tests and the demo.

:class:`ControlPlane` runs etcd, kube-apiserver and kube-controller-manager on loopback;
:class:`Cluster` is the handle tests use (kubeconfig, ``kubectl``, namespaces). The pytest plugin
(:mod:`modelroll_devcluster.pytest_plugin`) provides them as the ``cluster`` and ``namespace``
fixtures, and ``modelroll-cluster`` (:mod:`modelroll_devcluster.cli`) runs them from a shell.
"""

from .cluster import Cluster, KubectlError, namespace_name
from .controlplane import BINARIES, ControlPlane, MissingBinaryError, default_bin_dir
from .processes import ClusterError

__all__ = [
    "BINARIES",
    "Cluster",
    "ClusterError",
    "ControlPlane",
    "KubectlError",
    "MissingBinaryError",
    "default_bin_dir",
    "namespace_name",
]
