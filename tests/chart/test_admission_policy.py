"""operator.podSecurity: the operator's --pod-security, and the ValidatingAdmissionPolicy that
refuses at `kubectl apply` what the operator refuses (on the real API server:
tests/integration/test_pod_security.py)."""

from __future__ import annotations

import yaml

from modelroll_operator import cli as operator_cli
from modelroll_operator.spec import GROUP, PLURAL, VERSION
from tests.support.chart import CHART, Helm, by_kind, one
from tests.support.rendering import operator_args

POLICY = "ValidatingAdmissionPolicy"
BINDING = "ValidatingAdmissionPolicyBinding"


def pod_security(args: list[str]) -> str:
    level: str = operator_cli.parse_config(
        operator_cli.build_parser().parse_args(args)
    ).pod_security
    return level


def test_by_default_the_operator_and_the_policy_refuse_what_baseline_forbids(helm: Helm) -> None:
    docs = helm.template()
    assert pod_security(operator_args(docs)) == "baseline"
    policy, binding = one(docs, POLICY), one(docs, BINDING)
    assert policy["metadata"]["name"] == "modelroll-pod-security"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["apiVersions"], rule["resources"]) == (
        [GROUP],
        [VERSION],
        [PLURAL],
    )
    assert rule["operations"] == ["CREATE", "UPDATE"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    generated = yaml.safe_load((CHART / "admission" / "pod-security.yaml").read_text())
    assert policy["spec"]["validations"] == generated
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]  # every namespace, as the operator serves


def test_with_watch_namespaces_the_policy_binds_only_those(helm: Helm) -> None:
    binding = one(helm.template("--set", "operator.watchNamespaces={a,b}"), BINDING)
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a", "b"]}
        ]
    }


def test_privileged_relaxes_the_operator_and_renders_no_policy(helm: Helm) -> None:
    docs = helm.template("--set", "operator.podSecurity.level=privileged")
    assert pod_security(operator_args(docs)) == "privileged"
    assert not by_kind(docs, POLICY)
    assert not by_kind(docs, BINDING)


def test_the_policy_can_be_left_out_while_the_operator_still_refuses(helm: Helm) -> None:
    docs = helm.template("--set", "operator.podSecurity.admissionPolicy=false")
    assert pod_security(operator_args(docs)) == "baseline"
    assert not by_kind(docs, POLICY)
    assert not by_kind(docs, BINDING)


def test_an_unknown_level_is_refused(helm: Helm) -> None:
    result = helm.run(
        "template", "x", str(CHART), "--set", "operator.podSecurity.level=restricted", check=False
    )
    assert result.returncode != 0
    assert "podSecurity" in result.stderr
