"""A request's length: the unit of ``--batch-by length``, ``--max-batch-tokens`` and the padding
metrics, counted as the model will pad it.

``--length-from words`` counts the whitespace words of a string payload. ``--length-from
tokenizer`` counts its tokens under the model's own tokenizer, which the model serves at
``GET /v1/tokenizer`` (a Hugging Face ``tokenizer.json``): a WordPiece or BPE model pads
tokens, and a sentence has about 1.3 of them per word, more for rare words and numbers.
A list payload counts its items either way (token ids, say), anything else 1.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import aiohttp
from tokenizers import Tokenizer

from modelroll_common.sse import AnswerTooLarge, read_whole

from .protocol import ModelClient, payload_length

Lengths = Callable[[object], int]
"""A payload's length, never below 1."""

TOKENIZER_PATH = "/v1/tokenizer"
MAX_TOKENIZER_BYTES = 32 * 1024 * 1024
"""The largest tokenizer.json accepted from a model (a large LLM vocabulary's is about 10 MB)."""
HEAD_CHARS = 2048
"""Only this much of a string is tokenized, on the event loop (about 1 ms on one core; a
sentence takes about 40 us): a longer string's count is its head's scaled by its length, capped
at the tokenizer's truncation length, which so long an input reaches in practice."""


class TokenLengths:
    """Lengths in the model's tokens, special tokens included, truncated as the model's
    tokenizer truncates."""

    def __init__(self, tokenizer_json: str) -> None:
        """Raises ValueError when ``tokenizer_json`` is not a tokenizer."""
        try:
            tokenizer = Tokenizer.from_str(tokenizer_json)
        except Exception as exc:  # the Rust side raises its own exception type
            raise ValueError(f"not a Hugging Face tokenizer.json: {exc}") from None
        tokenizer.no_padding()  # a length, not a padded row
        self._tokenizer = tokenizer
        truncation = tokenizer.truncation
        self._longest: int | None = truncation["max_length"] if truncation else None
        self._special = tokenizer.num_special_tokens_to_add(is_pair=False)
        """[CLS] and [SEP], say: added once, however long the text."""

    def __call__(self, payload: object) -> int:
        if not isinstance(payload, str):
            return payload_length(payload)
        head = payload[:HEAD_CHARS]
        count = len(self._tokenizer.encode(head).ids)
        if len(payload) > len(head):
            text_tokens = max(0, count - self._special)
            count = self._special + math.ceil(text_tokens * len(payload) / len(head))
        if self._longest is not None:
            count = min(count, self._longest)
        return max(1, count)


async def fetch_tokenizer(model: ModelClient, timeout_s: float) -> TokenLengths:
    """The model's tokenizer, from its ``GET /v1/tokenizer``. Raises ValueError with a message
    for the sidecar's /readyz when the model serves none, or something else."""
    url = model.base_url + TOKENIZER_PATH
    try:
        async with model.session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            raw = await read_whole(resp, MAX_TOKENIZER_BYTES)
            status = resp.status
    except AnswerTooLarge:
        raise ValueError(
            f"the model's tokenizer is larger than {MAX_TOKENIZER_BYTES} bytes"
        ) from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ValueError(f"GET {TOKENIZER_PATH} failed: {type(exc).__name__}") from None
    if status != 200:
        raise ValueError(
            f"the model answers GET {TOKENIZER_PATH} with HTTP {status}; --length-from "
            "tokenizer needs a model that serves its tokenizer.json there"
        )
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise ValueError(f"GET {TOKENIZER_PATH} answered bytes that are not UTF-8") from None
    # Parsing a large vocabulary takes tens of milliseconds: not on the event loop.
    return await asyncio.to_thread(TokenLengths, text)
