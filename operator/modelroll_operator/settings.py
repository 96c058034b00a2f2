"""Operator configuration (from the command line) and the kopf settings derived from it.

``OperatorConfig`` travels to the handlers in kopf's memo; ``configure`` tunes the framework
once, from the startup handler.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from pathlib import Path

import kopf

from modelroll_gateway.routes import CONFIGMAP_NAME

from .spec import FINALIZER, LABEL_MANAGED_BY, MANAGED_BY, PREFIX

DEFAULT_SIDECAR_IMAGE = "ghcr.io/modelroll/modelroll-sidecar:0.1.0"
SIDECAR_PORT = 8000
"""The sidecar's port in managed pods, and the port of each version's Service."""


@dataclass(frozen=True)
class OperatorConfig:
    """Everything the handlers need to know beyond the cluster state."""

    sidecar_image: str = DEFAULT_SIDECAR_IMAGE
    sidecar_port: int = SIDECAR_PORT
    drain_timeout_s: int = 30
    """The sidecar's --drain-timeout-s; the pod's grace period is this plus a margin."""
    kubeconfig: Path | None = None
    workers: int = 4
    """Models reconciled at the same time (one model is never reconciled twice at once)."""
    retry_initial_s: float = 0.5
    retry_max_s: float = 30.0
    peering: str | None = None
    """A kopf peering name: replicas with the same name elect one active operator."""
    priority: int = 0

    @property
    def termination_grace_s(self) -> int:
        """Longer than the sidecar's drain, so the kubelet never kills a draining sidecar."""
        return self.drain_timeout_s + 15


def configure(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """Tune kopf: our own finalizer and annotations, quiet events, narrow watches, peering."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    # kopf would post an event for every handler run; the operator posts its own routing
    # events, so only kopf's warnings and errors become events.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = MANAGED_BY
    settings.posting.reporting_instance = socket.gethostname()
    # Watch only what the operator manages (server-side selectors), not every object.
    managed = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
    settings.watching.label_selectors["apps", "v1", "deployments"] = managed
    settings.watching.label_selectors["v1", "services"] = managed
    settings.watching.field_selectors["v1", "configmaps"] = f"metadata.name={CONFIGMAP_NAME}"
    # Reconnect soon after the API server comes back.
    settings.watching.reconnect_backoff = 1.0
    settings.networking.error_backoffs = [1, 1, 2, 3, 5, 8]
    if config.peering:
        settings.peering.name = config.peering
        settings.peering.mandatory = True
        settings.peering.standalone = False
        settings.peering.priority = config.priority
    else:
        settings.peering.standalone = True
