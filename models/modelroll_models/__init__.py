"""Real model servers that speak modelroll's model protocol (``POST /v1/batch``,
``GET /readyz``), apart from the sidecar and its stand-in models."""
