"""modelroll gateway: weighted routing across model versions, following the routes ConfigMap."""

from .app import create_admin_app, create_app
from .config import GatewayConfig

__all__ = ["GatewayConfig", "create_admin_app", "create_app"]
