"""What the gateway and the sidecar share of the Open Inference Protocol (KServe's "v2")."""

from __future__ import annotations

BINARY_DATA_HEADER = "Inference-Header-Content-Length"
"""The binary tensor data extension: the length of the JSON head of a body whose tensors follow
as raw bytes. Neither the gateway nor the sidecar reads such a body."""

BINARY_DATA_REFUSED = (
    f"the binary tensor data extension ({BINARY_DATA_HEADER}) is not supported: send tensors "
    "as JSON (tritonclient: binary_data=False)"
)
"""The 400's message for a request with :data:`BINARY_DATA_HEADER`."""
