"""The managed pod's preStop hook: ``python3 -m modelroll_sidecar.prestop --control-port=PORT``.

The kubelet runs it in the sidecar container (an exec hook), so the GET /prestop it sends to the
sidecar's control listener on 127.0.0.1 comes from the pod itself and from nobody else. It waits
for the answer, which comes after --prestop-delay-ms, and exits 0; on any failure it prints why
and exits 1 (the kubelet shows that message in a FailedPreStopHook event, then goes on to
SIGTERM). Standard library only.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

TIMEOUT_S = 10.0
"""Seconds to wait for the answer: well above the sidecar's 3 s --prestop-delay-ms, and at most
10 of the 15 s the pod's grace period adds to the drain timeout, so that a stuck sidecar still
gets its whole drain after SIGTERM."""


def prestop(port: int, timeout_s: float = TIMEOUT_S) -> str:
    """Send GET /prestop to 127.0.0.1:``port`` and return its answer; raise OSError (an
    HTTPError for an answer other than 200) when there is none."""
    url = f"http://127.0.0.1:{port}/prestop"
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        body: bytes = response.read()
    return body.decode("utf-8", "replace")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m modelroll_sidecar.prestop",
        description="The pod's preStop hook: GET /prestop on the sidecar's --control-port, on "
        "127.0.0.1; exits 0 once the sidecar has answered, 1 otherwise.",
    )
    parser.add_argument(
        "--control-port", type=int, required=True, help="the sidecar's --control-port"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    port: int = build_parser().parse_args(argv).control_port
    try:
        answer = prestop(port)
    except urllib.error.HTTPError as exc:
        print(f"preStop: GET /prestop on 127.0.0.1:{port} answered {exc.code}", file=sys.stderr)
        return 1
    except OSError as exc:  # refused, reset, timed out
        print(f"preStop: GET /prestop on 127.0.0.1:{port} failed: {exc}", file=sys.stderr)
        return 1
    print(f"preStop: {answer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
