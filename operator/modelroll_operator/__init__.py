"""modelroll operator: ModelVersion weights into the gateway's routes ConfigMap, managed versions
as Deployments and Services, and the kubectl-modelroll plugin."""

from .config import OperatorConfig

__all__ = ["OperatorConfig"]
