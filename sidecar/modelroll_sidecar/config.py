"""Sidecar settings: command-line flags, each also readable from a MODELROLL_* variable.

The settings a ModelVersion tunes (``spec.batching``, ``spec.sidecar``) take their flag names,
defaults and bounds from :mod:`modelroll_common.settings`, the table the operator and the CRD
use, so the sidecar refuses exactly the values the CRD refuses. Invalid values exit with a
message that names the flag, or the variable the value came from (parsing is
:mod:`modelroll_common.flags`'s, shared with the gateway and the operator).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields

from modelroll_common.flags import EnvArgumentParser, number
from modelroll_common.settings import BY_ATTR, CHOICES_BY_ATTR

EVENT_LOOPS = ("auto", "asyncio", "uvloop")
BATCH_BY = CHOICES_BY_ATTR["batch_by"].words
WAIT_POLICIES = CHOICES_BY_ATTR["wait_policy"].words
LENGTH_FROM = CHOICES_BY_ATTR["length_from"].words
PROTOCOLS = CHOICES_BY_ATTR["protocol"].words


def _default(attr: str) -> int:
    return BY_ATTR[attr].default


def _word(attr: str) -> str:
    """A word setting's default, as the flag spells it."""
    return CHOICES_BY_ATTR[attr].default.lower()


@dataclass(frozen=True, slots=True)
class SidecarConfig:
    """Everything the sidecar needs to run; built by :func:`parse_args` or directly in tests."""

    upstream: str = "http://127.0.0.1:8080"
    model: str = "default"
    version: str = "v1"
    served_model_name: str = ""
    host: str = "0.0.0.0"
    port: int = 8000
    control_port: int = 0
    max_batch_size: int = _default("max_batch_size")
    max_wait_ms: float = float(_default("max_wait_ms"))
    max_queue_size: int = _default("max_queue_size")
    max_batch_tokens: int = _default("max_batch_tokens")
    timeout_ms: float = float(_default("timeout_ms"))
    max_concurrent_batches: int = _default("max_concurrent_batches")
    batch_by: str = _word("batch_by")
    wait_policy: str = _word("wait_policy")
    length_from: str = _word("length_from")
    protocol: str = _word("protocol")
    max_in_flight: int = _default("max_in_flight")
    max_body_bytes: int = _default("max_body_bytes")
    read_timeout_ms: float = float(_default("read_timeout_ms"))
    upstream_timeout_ms: float = float(_default("upstream_timeout_ms"))
    generation_timeout_ms: float = float(_default("generation_timeout_ms"))
    readiness_interval_ms: float = 1000.0
    readiness_timeout_ms: float = float(_default("readiness_timeout_ms"))
    drain_timeout_s: float = float(_default("drain_timeout_s"))
    prestop_delay_ms: float = 3000.0
    engine_api_key_file: str = ""
    event_loop: str = "auto"

    def __post_init__(self) -> None:
        # spec.batching spells these Length, Arrival, Auto, Fixed...; the flags take any case.
        object.__setattr__(self, "batch_by", self.batch_by.lower())
        object.__setattr__(self, "wait_policy", self.wait_policy.lower())
        object.__setattr__(self, "length_from", self.length_from.lower())
        object.__setattr__(self, "protocol", self.protocol.lower())
        problem = self.problem()
        if problem is not None:
            raise ValueError(problem)

    def problem(self) -> str | None:
        """The first invalid setting, phrased with its flag name, or None."""
        bounds = {s.flag: (s.attr, s.low, s.high) for s in BY_ATTR.values()}
        bounds["--port"] = ("port", 1, 65535)
        bounds["--control-port"] = ("control_port", 0, 65535)
        for name, (attr, low, high) in bounds.items():
            value = getattr(self, attr)
            if not low <= value <= high:  # .15g: 3600001 (not 3.6e+06), 0.5, -1
                return f"{name} must be within {low}..{high}, got {value:.15g}"
        if self.readiness_interval_ms <= 0:
            interval = self.readiness_interval_ms
            return f"--readiness-interval-ms must be greater than 0, got {interval:g}"
        if self.control_port == self.port:
            return f"--control-port must differ from --port, got {self.port} for both"
        if self.prestop_delay_ms < 0:
            return f"--prestop-delay-ms must be 0 or more, got {self.prestop_delay_ms:g}"
        if self.max_wait_ms > self.timeout_ms:
            return (
                f"--max-wait-ms ({self.max_wait_ms:g}) must not exceed "
                f"--timeout-ms ({self.timeout_ms:g})"
            )
        if self.engine_api_key_file and not os.access(self.engine_api_key_file, os.R_OK):
            return f"--engine-api-key-file {self.engine_api_key_file!r} cannot be read"
        if not self.upstream.startswith(("http://", "https://")):
            return f"--upstream must be an http(s) URL, got {self.upstream!r}"
        choices = {
            "batch_by": BATCH_BY,
            "wait_policy": WAIT_POLICIES,
            "length_from": LENGTH_FROM,
            "protocol": PROTOCOLS,
            "event_loop": EVENT_LOOPS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                return (
                    f"{flag(name)} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )
        if self.length_from == "tokenizer" and self.protocol == "openai":
            return (
                "--length-from tokenizer needs --protocol batch: an OpenAI engine serves no "
                "tokenizer"
            )
        for name in ("model", "version"):
            if not getattr(self, name):
                return f"{flag(name)} must not be empty"
        return None

    def engine_api_key(self) -> str | None:
        """The key in --engine-api-key-file (surrounding whitespace stripped), or None."""
        if not self.engine_api_key_file:
            return None
        with open(self.engine_api_key_file, encoding="utf-8") as file:
            return file.read().strip() or None

    @property
    def asks_for_tokenizer(self) -> bool:
        """Whether the sidecar asks the model for its tokenizer (GET /v1/tokenizer): with
        --length-from tokenizer, and with auto unless --protocol openai, whose engines serve
        none (auto counts words there)."""
        return self.length_from == "tokenizer" or (
            self.length_from == "auto" and self.protocol != "openai"
        )

    @property
    def served_name(self) -> str:
        """The model server's name for the model: --served-model-name, else --model."""
        return self.served_model_name or self.model

    @property
    def max_wait_s(self) -> float:
        return self.max_wait_ms / 1000.0

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000.0


HELP = {
    "upstream": "base URL of the model server (its /v1/batch and /readyz)",
    "model": "model name, used in responses and metric labels",
    "version": "version name, used in responses and metric labels",
    "served_model_name": "--protocol openinference: the model server's name for the model, in "
    "the paths the sidecar calls (POST /v2/models/<name>/infer); empty: --model",
    "host": "address to listen on",
    "port": "port to listen on",
    "control_port": "port on 127.0.0.1 only, whatever --host says, that serves GET /prestop "
    "(the pod's preStop hook) out of reach of other pods; must differ from --port; 0: no such "
    "listener, so that several sidecars can share a host (the operator gives managed pods 8001)",
    "max_batch_size": "a batch closes when it holds this many requests (--protocol "
    "openinference: rows)",
    "max_wait_ms": "a batch closes when its oldest request has waited this long",
    "max_queue_size": "requests waiting beyond this are refused with 429",
    "max_batch_tokens": "padded-token budget per batch (rows x longest length); 0 disables it",
    "timeout_ms": "a request not sent to the model within this time gets 504",
    "max_concurrent_batches": "batches sent to the model at the same time",
    "batch_by": "length: the oldest request and the queued requests that serve the queue for "
    "the least model time by the cost surface learned while serving (neighbouring lengths "
    "together, as many as pay for themselves); arrival: the oldest requests, first in, first out",
    "wait_policy": "auto: a batch that is not full goes as soon as a model slot is free, unless "
    "the model time the next arrival would save by joining exceeds the time the slot would stand "
    "idle for it (and the learned cost surface is trusted); fixed: it waits until its oldest "
    "request has waited --max-wait-ms; adaptive: it goes as soon as a slot is free and no arrival "
    "is expected soon enough to save the waiting requests time; never longer than --max-wait-ms",
    "length_from": "what a request's length counts, for --batch-by length, --max-batch-tokens "
    "and the padding metrics: auto: the model's tokens when it serves its tokenizer at GET "
    "/v1/tokenizer, words when it answers 404, 405, 410 or 501 there or serves no usable "
    "tokenizer (the sidecar is unready until the model has answered; --protocol openai: words); "
    "words: whitespace words of a string payload; tokenizer: the model's tokens (the sidecar is "
    "unready until it has the tokenizer); either way a list payload counts its items",
    "protocol": "batch: the model speaks POST /v1/batch and the sidecar batches requests to "
    "POST /v1/infer; openai: the model is an OpenAI-compatible engine that batches generation "
    "itself, and the sidecar streams /v1/chat/completions and /v1/completions through, batching "
    "only /v1/embeddings; openinference: the model server speaks the Open Inference Protocol "
    "(KServe v2), and the sidecar batches requests to POST /v2/models/<--model>/infer by rows "
    "into its POST /v2/models/<--served-model-name>/infer",
    "max_in_flight": "--protocol openai: generation requests at once; more get 429",
    "max_body_bytes": "largest accepted request body; larger ones get 413",
    "read_timeout_ms": "a client must send its whole request within this time of its first "
    "byte (a new connection: of connecting), or it gets 408 and its connection closes",
    "upstream_timeout_ms": "a model call slower than this fails its batch with 502; --protocol "
    "openai: the longest a stream's engine may be silent, its headers included (504), and its "
    "client may take no data before it is cut (client_stalled)",
    "generation_timeout_ms": "--protocol openai: a generation not streamed must be answered "
    "whole within this time (the engine sends nothing until it has generated it all), or 504",
    "readiness_interval_ms": "how often, in milliseconds, the model's /readyz (--protocol "
    "openai: /health; openinference: /v2/health/ready and /v2/models/<name>/ready) is probed",
    "readiness_timeout_ms": "a probe of the model's /readyz (--protocol openai: /health) that "
    "takes longer counts as not ready",
    "drain_timeout_s": "on SIGTERM, how long queued and in-flight work may take to finish",
    "engine_api_key_file": "a file holding the model server's API key (a mounted Secret: "
    "spec.sidecar.engineApiKeySecret in managed pods), sent with every call to it (generations, "
    "embeddings, batches, readiness) as Authorization: Bearer <key>; an engine started with a "
    "key (vllm --api-key) needs it. A client's own Authorization is never passed on; "
    "X-Request-Id, traceparent and tracestate are. Empty (the default): no key",
    "prestop_delay_ms": "how long, in milliseconds, GET /prestop on --control-port (the pod's "
    "preStop hook) keeps serving, unready and closing each connection after its next answer, "
    "before it closes the idle ones and answers; keep it above the gateway's 2 s idle limit",
    "event_loop": "auto (uvloop when installed: a dependency outside Windows), asyncio or uvloop",
}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


KINDS: dict[type, Callable[[str], object]] = {int: int, float: number, str: str}
"""How a field's flag converts its text, by the type of the field's default."""


def build_parser(environ: Mapping[str, str] | None = None) -> EnvArgumentParser:
    """A flag per SidecarConfig field, each falling back on its MODELROLL_* variable in
    ``environ`` (default: the process environment)."""
    parser = EnvArgumentParser(
        prog="modelroll-sidecar",
        description="Dynamic batching sidecar: queues requests and sends them to the model in "
        "batches that close on size, max-wait, token budget or shutdown. Every flag can also be "
        "set as MODELROLL_<FLAG> in the environment; a flag replaces its variable.",
        environ=environ,
    )
    defaults = SidecarConfig()
    for field in fields(SidecarConfig):
        default = getattr(defaults, field.name)
        parser.add_argument(
            flag(field.name),
            dest=field.name,
            type=KINDS[type(default)],  # a KeyError here: a field of a new kind
            default=default,
            help=HELP[field.name],
        )
    return parser


def parse_args(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> SidecarConfig:
    """Flags win over MODELROLL_* variables, which win over defaults. Exits 2 on bad values."""
    parser = build_parser(environ)
    namespace = parser.parse_args(argv)
    try:
        return SidecarConfig(**vars(namespace))
    except ValueError as exc:
        parser.reject(str(exc))  # names the variable when the bad value came from one
