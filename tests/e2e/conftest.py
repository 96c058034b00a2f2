"""The e2e suite's fixtures: the stack the scenario runs against (the figures it reports come
from modelroll_devcluster's pytest plugin: the ``figures`` fixture).

The cluster comes from the environment, like every tier's (modelroll_devcluster's ``cluster``
fixture): by default the local control plane, with the operator, the gateway, the two versions
and Prometheus started as processes on loopback (modelroll_devcluster.stack, the same code as
``make demo``). With ``MODELROLL_KUBECONFIG`` set (``make e2e-kind``) the scenario runs against
the chart installed in that cluster instead (see tests/support/incluster.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from modelroll_devcluster import Cluster
from modelroll_devcluster.stack import Stack, VersionSpec
from tests.support.incluster import InCluster
from tests.support.stack import Rollout, StartLocal

FAILED = pytest.StashKey[bool]()


class LocalRollout(Stack):
    settle_s = 30.0


@pytest.fixture
def rollout(cluster: Cluster, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rollout]:
    """The stack of the story, with no ModelVersion applied yet."""
    if not cluster.is_local:
        incluster = InCluster.from_env(cluster)
        try:
            yield incluster
        finally:
            show_logs_if_failed(request, incluster)
            incluster.cleanup()
        return
    namespace: str = request.getfixturevalue("namespace")
    stack = LocalRollout(tmp_path / "stack", cluster=cluster, namespace=namespace)
    try:
        stack.start()
    except Exception as err:  # the message carries the failing process's log
        pytest.fail(f"the local stack did not start: {err}", pytrace=False)
    try:
        yield stack
    finally:
        show_logs_if_failed(request, stack)
        stack.stop()


@pytest.fixture
def local_stacks(
    cluster: Cluster, namespace: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[StartLocal]:
    """``start(versions, prometheus=False)``: a local stack of those versions in the test's
    namespace, with no ModelVersion applied yet; stopped (its logs shown if the test failed)
    after the test. Scenarios that start their own versions run on the local control plane only."""
    if not cluster.is_local:
        pytest.skip("this scenario starts its own versions: local control plane only")
    stacks: list[Stack] = []

    def start(versions: Sequence[VersionSpec], prometheus: bool = False) -> Stack:
        stack = Stack(
            tmp_path / f"stack-{len(stacks)}",
            cluster=cluster,
            namespace=namespace,
            versions=versions,
            prometheus="required" if prometheus else "off",
        )
        stacks.append(stack)
        stack.start()
        return stack

    yield start
    for stack in stacks:
        show_logs_if_failed(request, stack)
        stack.stop()


def show_logs_if_failed(request: pytest.FixtureRequest, rollout: Rollout | Stack) -> None:
    """After a failed test, the end of each component's log (shown with the failure)."""
    if request.node.stash.get(FAILED, False):
        print(f"--- component logs ---\n{rollout.log_tails()}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[FAILED] = True
    return report
