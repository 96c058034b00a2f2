"""A request's length: the unit of ``--batch-by length``, ``--max-batch-tokens`` and the padding
metrics, counted as the model will pad it.

``--length-from words`` counts the whitespace words of a string payload. ``--length-from
tokenizer`` counts its tokens under the model's own tokenizer, which the model serves at
``GET /v1/tokenizer`` (a Hugging Face ``tokenizer.json``): a WordPiece or BPE model pads
tokens, and a sentence has about 1.3 of them per word, more for rare words and numbers.
``--length-from auto`` counts tokens when the model serves a tokenizer, words when it answers
that it serves none (:class:`NoTokenizer`). A list payload counts its items either way (token
ids, say), anything else 1.

The tokenizer is the model's, so it is not trusted to be quick or to work: it runs in worker
threads, never on the event loop, and a request it fails on counts its words instead.
"""

from __future__ import annotations

import asyncio
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import aiohttp
from tokenizers import Tokenizer

from modelroll_common.sse import AnswerTooLarge, read_whole

from .batching import QueueFull
from .metrics import SidecarMetrics
from .protocol import ModelClient, payload_length

log = logging.getLogger(__name__)

TOKENIZER_PATH = "/v1/tokenizer"
NOT_SERVED = frozenset({404, 405, 410, 501})
"""The answers to GET /v1/tokenizer that say the model serves no tokenizer there, for good: any
other failure (no connection, a timeout, 500, 503 while the model starts) may pass."""
MAX_TOKENIZER_BYTES = 32 * 1024 * 1024
"""The largest tokenizer.json accepted from a model (a large LLM vocabulary's is about 10 MB)."""
HEAD_CHARS = 2048
"""Only this much of a string is tokenized (about 1 ms on one core; a sentence takes about
40 us): a longer string's count is its head's scaled by its length, capped at the tokenizer's
truncation length, which so long an input reaches in practice."""
TOKENIZER_THREADS = 2
"""Threads that tokenize requests. The tokenizer lets go of the GIL while it works, so one
request whose text the tokenizer is slow on (a pattern that backtracks) holds one thread, and
neither the event loop nor the other thread."""
PANIC = ("pyo3_runtime", "PanicException")
"""The module and name of the exception a Rust panic in the tokenizer library raises."""


def panicked(exc: BaseException) -> bool:
    """Whether ``exc`` is a Rust panic in an extension built with pyo3 (the tokenizer library).
    pyo3 raises it as a BaseException, so that ``except Exception`` lets it through; its type is
    created at an extension's first panic and can be imported from nowhere, hence the name."""
    kind = type(exc)
    return (kind.__module__, kind.__qualname__) == PANIC


class NoTokenizer(ValueError):
    """The model answered GET /v1/tokenizer, and the answer is no usable tokenizer: one of
    NOT_SERVED, or a body that is too large, not UTF-8 or not a tokenizer. Asking again would
    get the same answer."""


class Lengths(Protocol):
    """How a sidecar counts a request's length (never below 1)."""

    async def __call__(self, payload: object) -> int: ...

    def close(self) -> None: ...


class WordLengths:
    """``--length-from words``: counted on the event loop, which a split of the body takes
    well under a millisecond."""

    async def __call__(self, payload: object) -> int:
        return payload_length(payload)

    def close(self) -> None:
        pass


class TokenLengths:
    """Lengths in the model's tokens, special tokens included, truncated as the model's
    tokenizer truncates."""

    def __init__(self, tokenizer_json: str) -> None:
        """Raises NoTokenizer when ``tokenizer_json`` is not a tokenizer."""
        try:
            tokenizer = Tokenizer.from_str(tokenizer_json)
        except Exception as exc:  # the Rust side raises its own exception type
            raise NoTokenizer(f"not a Hugging Face tokenizer.json: {exc}") from None
        tokenizer.no_padding()  # a length, not a padded row
        self.tokenizer = tokenizer
        truncation = tokenizer.truncation
        self._longest: int | None = truncation["max_length"] if truncation else None
        self._special = tokenizer.num_special_tokens_to_add(is_pair=False)
        """[CLS] and [SEP], say: added once, however long the text."""

    def __call__(self, payload: object) -> int:
        """Raises whatever the tokenizer raises, a Rust panic included (:func:`panicked`)."""
        if not isinstance(payload, str):
            return payload_length(payload)
        head = payload[:HEAD_CHARS]
        # encode() holds the GIL while it works; encode_batch() lets go of it.
        count = len(self.tokenizer.encode_batch([head])[0].ids)
        if len(payload) > len(head):
            text_tokens = max(0, count - self._special)
            count = self._special + math.ceil(text_tokens * len(payload) / len(head))
        if self._longest is not None:
            count = min(count, self._longest)
        return max(1, count)


class TokenizerPool:
    """``--length-from tokenizer``: lengths under the model's tokenizer, each request's counted
    as it arrives (its length decides which batch it joins) in one of TOKENIZER_THREADS worker
    threads. A request the tokenizer fails on, whatever it raises, counts its words instead, and
    is counted in ``modelroll_tokenizer_fallbacks_total``: it is still answered. At most
    ``max_waiting`` requests wait for a thread; more get 429, as a full queue does."""

    def __init__(self, lengths: TokenLengths, metrics: SidecarMetrics, max_waiting: int) -> None:
        self.lengths = lengths
        self._metrics = metrics
        self._max_waiting = max_waiting
        self._waiting = 0
        self._pool = ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="modelroll-tokenizer")
        self._logged: set[str] = set()
        """The kinds of failure logged so far: each is logged once, then only counted."""

    async def __call__(self, payload: object) -> int:
        """Raises QueueFull when ``max_waiting`` requests wait already."""
        if not isinstance(payload, str):
            return payload_length(payload)
        if self._waiting >= self._max_waiting:
            self._metrics.rejected["queue_full"].inc()
            raise QueueFull(f"the queue is full ({self._waiting} requests waiting to be tokenized)")
        self._waiting += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, self._count, payload)
        finally:
            self._waiting -= 1

    def _count(self, payload: str) -> int:
        """The payload's tokens, or its words where the tokenizer fails (in a worker thread)."""
        try:
            return self.lengths(payload)
        except Exception as exc:
            self._fell_back(exc)
        except BaseException as exc:
            if not panicked(exc):
                raise  # KeyboardInterrupt, SystemExit: not the tokenizer's
            self._fell_back(exc)
        return payload_length(payload)

    def _fell_back(self, exc: BaseException) -> None:
        self._metrics.tokenizer_fallbacks.inc()
        kind = type(exc).__qualname__
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(
                "The model's tokenizer failed (%s: %.200s); the request's length is its words, "
                "and further such failures are counted in modelroll_tokenizer_fallbacks_total",
                kind,
                exc,
            )

    def close(self) -> None:
        """Stop the threads once the tokenizations in progress end; drop those not begun."""
        self._pool.shutdown(wait=False, cancel_futures=True)


async def fetch_tokenizer(model: ModelClient, timeout_s: float) -> TokenLengths:
    """The model's tokenizer, from its ``GET /v1/tokenizer``. Raises NoTokenizer when the
    model's answer is none, and ValueError when there was no answer to judge (no connection, a
    timeout, another status); either's message is for the sidecar's /readyz."""
    url = model.base_url + TOKENIZER_PATH
    try:
        async with model.session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            raw = await read_whole(resp, MAX_TOKENIZER_BYTES)
            status = resp.status
    except AnswerTooLarge:
        raise NoTokenizer(
            f"the model's tokenizer.json is larger than {MAX_TOKENIZER_BYTES >> 20} MiB "
            f"({MAX_TOKENIZER_BYTES} bytes)"
        ) from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ValueError(f"GET {TOKENIZER_PATH} failed: {type(exc).__name__}") from None
    if status != 200:
        refusal = NoTokenizer if status in NOT_SERVED else ValueError
        raise refusal(f"the model answers GET {TOKENIZER_PATH} with HTTP {status}")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise NoTokenizer(f"GET {TOKENIZER_PATH} answered bytes that are not UTF-8") from None
    # Parsing a large vocabulary takes tens of milliseconds: not on the event loop.
    return await asyncio.to_thread(TokenLengths, text)
