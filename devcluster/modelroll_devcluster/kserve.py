"""KServe's own Python model server on loopback, serving the digits model of
``models/mlserver/train.py`` through the team-written ``kserve.Model`` of
``models/kserve/digits.py``; and KServe's REST client (``models/kserve/rest_client.py``), both run
with KServe's virtualenv (``.venv-kserve``, ``make kserve``, hack/kserve.mk).

A :class:`KServe` is a :class:`Component` like every other process of the devcluster: started in
its own session, stopped with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .controlplane import MissingBinaryError, repo_root
from .processes import ClusterError, Component, free_port

VENV = ".venv-kserve"
SCRIPTS = Path("models") / "kserve"
READY_TIMEOUT = 60.0
"""Seconds KServe's server may take to import, load the forest and answer ready (a few on an
idle machine of two cores)."""
CLIENT_TIMEOUT = 60.0


class KServeError(ClusterError):
    """KServe's server or client did not run; the message has the tail of its output."""


def python(root: Path | None = None) -> Path:
    """The python of KServe's virtualenv; raises MissingBinaryError naming `make kserve` when it
    has not been made."""
    checkout = root or repo_root() or Path.cwd()
    venv = checkout / VENV
    if not (venv / ".installed").is_file():
        raise MissingBinaryError(
            f"KServe is not installed: missing {venv / '.installed'}. "
            "Make its virtualenv with `make kserve`."
        )
    return venv / "bin" / "python"


def script(name: str, root: Path | None = None) -> Path:
    return (root or repo_root() or Path.cwd()) / SCRIPTS / name


def rest_infer(url: str, model: str, rows: list[list[float]]) -> dict[str, Any]:
    """KServe's ``InferenceRESTClient`` (rest_client.py, in KServe's virtualenv) sending ``rows``
    of 64 pixels to ``url``'s ``/v2/models/{model}/infer``: what it read (``model_name``, ``id``,
    ``predict``, and ``version``, a gateway's X-Modelroll-Version)."""
    argv = [str(python()), str(script("rest_client.py")), url, model]
    done = subprocess.run(
        argv,
        input=json.dumps(rows),
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise KServeError(f"rest_client.py exited with {done.returncode}:\n{done.stderr[-4000:]}")
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


@dataclass
class KServe:
    """One KServe model server (``models/kserve/digits.py``) serving the trained digits model
    under ``models`` as ``name`` on a free port of 127.0.0.1, gRPC off; its log under
    ``workdir``. Start with :meth:`start` (it returns once the server and the model answer
    ready), stop with :meth:`stop`."""

    models: Path
    workdir: Path
    name: str = "digits"
    port: int = field(default_factory=free_port)
    component: Component | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = READY_TIMEOUT) -> Component:
        """Start the server and wait until it and the model are ready; on failure it is
        stopped."""
        argv = [
            str(python()),
            str(script("digits.py")),
            f"--model_dir={self.models / 'digits'}",
            f"--model_name={self.name}",
            f"--http_port={self.port}",
            "--enable_grpc=false",
        ]
        self.component = Component("kserve", argv, self.workdir / "kserve.log")
        ready = [self.url + path for path in ("/v2/health/ready", f"/v2/models/{self.name}/ready")]
        self.component.start_ready(ready, timeout, error=KServeError)
        return self.component

    def stop(self) -> None:
        """SIGTERM, then SIGKILL. Safe to call twice."""
        if self.component is not None:
            self.component.stop()
