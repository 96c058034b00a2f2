"""modelroll's batching sidecar: a dynamic batcher in front of a model server."""

from .app import create_app
from .config import SidecarConfig

__all__ = ["SidecarConfig", "create_app"]
