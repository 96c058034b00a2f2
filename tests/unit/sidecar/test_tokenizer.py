"""--length-from tokenizer with a model's tokenizer that is slow, broken or too large, and
payloads that are not text: every request is answered, the event loop stays free, and a
tokenizer file over the bound is refused with a reason in /readyz. --length-from auto (the
default): tokens when the model serves a tokenizer, words when it answers that it serves none,
and no choice while the model cannot answer; /readyz and modelroll_length_unit say which."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pytest_aiohttp import AiohttpServer
from tokenizers import PreTokenizedString, Regex, Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import PreTokenizer, Split, Whitespace

from modelroll_models.batch_server import BatchModel, create_app
from modelroll_sidecar.config import SidecarConfig
from modelroll_sidecar.lengths import MAX_TOKENIZER_BYTES, TokenizerPool
from tests.support.sidecar import RunningSidecar, StartSidecar, until_ready

HOLD_LIMIT_S = 10.0
"""How long a held tokenizer waits for the test to let it go: only a sidecar that tokenizes on
its event loop (so that the test cannot run until the tokenizer returns) waits this long."""


def word_tokenizer(pre_tokenizer: PreTokenizer | None = None) -> str:
    """A tokenizer.json with one token per word and punctuation mark (Whitespace), or per
    piece that ``pre_tokenizer`` splits off."""
    tokenizer = Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizer or Whitespace()
    return tokenizer.to_str()


BACKTRACKING = word_tokenizer(Split(Regex("(a+)+b"), behavior="isolated"))
"""A pattern that backtracks catastrophically on a run of a's with no b: the regex engine gives
up after its retry limit, and the tokenizer library panics (Rust), on a real tokenizer."""


class Echo(BatchModel):
    """A model that answers each input with itself and serves a given tokenizer.json."""

    name = "echo"

    def __init__(self, tokenizer: str) -> None:
        self._tokenizer = tokenizer

    def predict(self, inputs: list[Any]) -> list[Any]:
        return inputs

    def tokenizer(self) -> str:
        return self._tokenizer


StartEcho = Callable[[str], Awaitable[str]]


@pytest.fixture
def start_echo(aiohttp_server: AiohttpServer) -> StartEcho:
    """Serve an Echo model with the given tokenizer.json; its URL."""

    async def start(tokenizer: str) -> str:
        server: TestServer = await aiohttp_server(create_app(Echo(tokenizer)))
        return str(server.make_url("")).rstrip("/")

    return start


async def counting_tokens(start_sidecar: StartSidecar, url: str, **settings: Any) -> RunningSidecar:
    sidecar = await start_sidecar(url, length_from="tokenizer", max_wait_ms=1, **settings)
    await until_ready(sidecar.client)
    return sidecar


@pytest.mark.parametrize("length_from", ["words", "tokenizer"])
@pytest.mark.parametrize(
    "body",
    [
        b'{"payload": "caf\\u00e9 \\ud800"}',  # an escape of half a pair
        b'{"payload": ["fine", "\\udfff"]}',
        b'{"payload": "ok", "\\ud800": 1}',  # a key
        b'{"payload": "\xed\xa0\x80"}',  # a surrogate spelled in (invalid) UTF-8
    ],
)
async def test_a_lone_surrogate_is_refused_with_400_and_counted(
    start_echo: StartEcho, start_sidecar: StartSidecar, length_from: str, body: bytes
) -> None:
    url = await start_echo(word_tokenizer())
    sidecar = await start_sidecar(url, length_from=length_from, max_wait_ms=1)
    await until_ready(sidecar.client)

    resp = await sidecar.client.post(
        "/v1/infer", data=body, headers={"Content-Type": "application/json"}
    )

    assert resp.status == 400
    assert (await resp.json())["error"] == (
        "undecodable text: a string holds a lone surrogate (an escape from \\ud800 to \\udfff "
        "that is not half of a surrogate pair); send Unicode text"
    )
    assert sidecar.sample("modelroll_requests_total", code="400") == 1
    assert await sidecar.infer("caf\u00e9 \U0001f600, a pair") == (
        200,
        {"output": "caf\u00e9 \U0001f600, a pair", "model": "sentiment", "version": "v1"},
    )


async def test_a_tokenizer_that_panics_still_answers_every_request_counting_words(
    start_echo: StartEcho, start_sidecar: StartSidecar
) -> None:
    """The backtracking tokenizer panics on each run of a's: those requests are answered all
    the same, their lengths their words, and each is counted as a fallback."""
    sidecar = await counting_tokens(start_sidecar, await start_echo(BACKTRACKING))
    panicking = ["a" * 30 + "!", "a" * 31 + "! and more words", "a" * 32 + "?"]

    answers = await asyncio.gather(*(sidecar.infer(text) for text in [*panicking, "hello"]))

    assert [status for status, _ in answers] == [200] * 4
    assert [body["output"] for _, body in answers] == [*panicking, "hello"]
    assert sidecar.sample("modelroll_tokenizer_fallbacks_total") == 3
    assert sidecar.sample("modelroll_requests_total", code="200") == 4
    # Words for the three that fell back (1 + 4 + 1), one token (the Split's) for "hello".
    assert sidecar.sample("modelroll_batch_tokens_total", kind="useful") == 7


class Held:
    """A pre-tokenizer that holds each call until the test lets it go."""

    def __init__(self, events: list[str]) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self._events = events

    def pre_tokenize(self, pretok: PreTokenizedString) -> None:
        self.entered.set()
        self.release.wait(HOLD_LIMIT_S)
        self._events.append("tokenized")
        pretok.split(lambda _, piece: piece.split(" ", "removed"))


async def test_the_event_loop_answers_livez_while_the_tokenizer_is_held(
    start_echo: StartEcho, start_sidecar: StartSidecar
) -> None:
    """A request the tokenizer is stuck on holds a worker thread, not the event loop: /livez
    and /readyz answer meanwhile, and the request is answered once the tokenizer returns."""
    sidecar = await counting_tokens(start_sidecar, await start_echo(word_tokenizer()))
    pool = sidecar.sidecar.lengths
    assert isinstance(pool, TokenizerPool)
    events: list[str] = []
    held = Held(events)
    pool.lengths.tokenizer.pre_tokenizer = PreTokenizer.custom(held)

    request = asyncio.create_task(sidecar.infer("a held sentence"))
    assert await asyncio.to_thread(held.entered.wait, HOLD_LIMIT_S)
    live = await sidecar.client.get("/livez")
    ready = await sidecar.client.get("/readyz")
    events.append("probes answered")
    held.release.set()
    status, body = await request

    assert (live.status, ready.status) == (200, 200)
    assert events == ["probes answered", "tokenized"]
    assert (status, body["output"]) == (200, "a held sentence")
    assert sidecar.sample("modelroll_tokenizer_fallbacks_total") == 0
    assert sidecar.sample("modelroll_batch_tokens_total", kind="useful") == 3


async def test_a_tokenizer_file_over_the_bound_is_refused_with_the_reason_in_readyz(
    start_echo: StartEcho, start_sidecar: StartSidecar
) -> None:
    sidecar = await start_sidecar(
        await start_echo(" " * (MAX_TOKENIZER_BYTES + 1)), length_from="tokenizer"
    )

    reason = await refusal(sidecar)
    status, body = await sidecar.infer("a sentence")

    assert reason == (
        "no tokenizer from the model: the model's tokenizer.json is larger than 32 MiB "
        f"({MAX_TOKENIZER_BYTES} bytes); --length-from tokenizer needs a model that serves its "
        "tokenizer.json there"
    )
    assert (status, body) == (503, {"error": "the model's tokenizer is not loaded yet"})


async def refusal(sidecar: RunningSidecar) -> str:
    """Why /readyz is 503 once the sidecar has asked the ready model for its tokenizer."""
    for _ in range(100):
        resp = await sidecar.client.get("/readyz")
        reason: str = (await resp.json()).get("error", "")
        if resp.status == 503 and reason.startswith("no tokenizer from the model"):
            return reason
        await asyncio.sleep(0.05)
    raise AssertionError("the sidecar never asked the model for its tokenizer")


class Scripted:
    """A model that echoes its inputs, is ready at once (/readyz, and /health as an OpenAI
    engine's), and answers GET /v1/tokenizer with ``answers`` in turn, the last one for good:
    200 serves a word tokenizer. The first answer waits for ``release`` when one is given."""

    def __init__(self, *answers: int, release: asyncio.Event | None = None) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []
        """The paths asked, probes included."""
        self.release = release
        self.tokenizer_asked = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/readyz", self.ready)
        app.router.add_get("/health", self.ready)
        app.router.add_get("/v1/tokenizer", self.tokenizer)
        app.router.add_post("/v1/batch", self.batch)
        return app

    async def ready(self, request: web.Request) -> web.Response:
        self.asked.append(request.path)
        return web.json_response({"status": "ready"})

    async def tokenizer(self, request: web.Request) -> web.Response:
        self.asked.append(request.path)
        self.tokenizer_asked.set()
        if self.release is not None:
            await self.release.wait()
        status = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if status == 200:
            return web.Response(text=word_tokenizer(), content_type="application/json")
        return web.json_response({"error": "no"}, status=status)

    async def batch(self, request: web.Request) -> web.Response:
        return web.json_response({"outputs": (await request.json())["inputs"]})

    @property
    def tokenizer_asks(self) -> int:
        return self.asked.count("/v1/tokenizer")


async def serve(aiohttp_server: AiohttpServer, model: Scripted, **settings: Any) -> str:
    server: TestServer = await aiohttp_server(model.app(), **settings)
    return str(server.make_url("")).rstrip("/")


async def counts_in(sidecar: RunningSidecar) -> str:
    """The unit a ready sidecar counts lengths in, as /readyz and modelroll_length_unit say
    (they must agree), checked by the useful tokens of one request: "hello, world" is two words
    and three tokens (Whitespace splits the comma off)."""
    await until_ready(sidecar.client)
    ready = await (await sidecar.client.get("/readyz")).json()
    units = {u for u in ("words", "tokens") if sidecar.sample("modelroll_length_unit", unit=u)}
    before = sidecar.sample("modelroll_batch_tokens_total", kind="useful")
    assert await sidecar.infer("hello, world") == (
        200,
        {"output": "hello, world", "model": "sentiment", "version": "v1"},
    )
    counted = sidecar.sample("modelroll_batch_tokens_total", kind="useful") - before
    assert units == {ready["length_unit"]}
    assert counted == {"words": 2, "tokens": 3}[ready["length_unit"]]
    return str(ready["length_unit"])


async def test_auto_counts_tokens_when_the_model_serves_a_tokenizer(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    sidecar = await start_sidecar(
        await serve(aiohttp_server, Scripted(200)), length_from="auto", max_wait_ms=1
    )

    assert SidecarConfig().length_from == "auto"  # the default
    assert await counts_in(sidecar) == "tokens"


@pytest.mark.parametrize("status", [404, 405, 410, 501])
async def test_auto_counts_words_for_good_when_the_model_says_it_serves_no_tokenizer(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar, status: int
) -> None:
    model = Scripted(status, 200)  # a tokenizer served later is never asked for
    sidecar = await start_sidecar(
        await serve(aiohttp_server, model), length_from="auto", max_wait_ms=1
    )

    unit = await counts_in(sidecar)
    await asyncio.sleep(0.3)  # three more probes of the model

    assert unit == "words"
    assert model.tokenizer_asks == 1
    assert sidecar.sample("modelroll_length_unit", unit="words") == 1


async def test_auto_counts_words_when_the_model_serves_no_usable_tokenizer(
    start_echo: StartEcho, start_sidecar: StartSidecar
) -> None:
    """A model that answers 200 with something else (a catch-all route, say) has no tokenizer
    to give: asking again would get the same answer."""
    sidecar = await start_sidecar(
        await start_echo("<html>not found</html>"), length_from="auto", max_wait_ms=1
    )

    assert await counts_in(sidecar) == "words"


@pytest.mark.parametrize("failures", [(503, 503), (500,)])
async def test_auto_asks_again_while_the_model_fails_and_then_counts_tokens(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar, failures: tuple[int, ...]
) -> None:
    """A model starting up answers 5xx at first: the sidecar stays unready, says why, has no
    unit yet, and counts tokens once the model serves its tokenizer; never words."""
    release = asyncio.Event()
    model = Scripted(*failures, 200, release=release)
    sidecar = await start_sidecar(
        await serve(aiohttp_server, model), length_from="auto", max_wait_ms=1
    )
    await asyncio.wait_for(model.tokenizer_asked.wait(), 5)  # that ask waits for the release

    deciding = await sidecar.client.get("/readyz")
    undecided = [sidecar.sample("modelroll_length_unit", unit=u) for u in ("words", "tokens")]
    refused = await sidecar.infer("hello")
    release.set()
    reason = await refusal(sidecar)

    assert deciding.status == 503
    assert undecided == [0, 0]
    assert refused == (503, {"error": "the model's tokenizer is not loaded yet"})
    assert reason == (
        f"no tokenizer from the model: the model answers GET /v1/tokenizer with HTTP {failures[0]}"
    )
    assert await counts_in(sidecar) == "tokens"
    assert model.tokenizer_asks == len(failures) + 1


async def test_auto_is_not_stuck_on_words_by_a_model_that_was_down(
    aiohttp_server: AiohttpServer,
    start_sidecar: StartSidecar,
    unused_tcp_port: int,
) -> None:
    """Nothing listens at the model's address at first (connection refused); once a model
    that serves a tokenizer comes up there, the sidecar counts its tokens."""
    port = unused_tcp_port
    sidecar = await start_sidecar(f"http://127.0.0.1:{port}", length_from="auto", max_wait_ms=1)
    await asyncio.sleep(0.3)  # three probes refused

    down = await sidecar.client.get("/readyz")
    units_while_down = sidecar.sample("modelroll_length_unit", unit="words")
    await serve(aiohttp_server, Scripted(200), port=port)

    assert down.status == 503
    assert units_while_down == 0
    assert await counts_in(sidecar) == "tokens"


async def test_auto_counts_words_in_front_of_an_openai_engine_without_asking_it(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    model = Scripted(200)
    sidecar = await start_sidecar(
        await serve(aiohttp_server, model), length_from="auto", protocol="openai"
    )
    await until_ready(sidecar.client)

    ready = await (await sidecar.client.get("/readyz")).json()

    assert ready == {"status": "ready", "length_unit": "words"}
    assert sidecar.sample("modelroll_length_unit", unit="words") == 1
    assert sidecar.sample("modelroll_length_unit", unit="tokens") == 0
    assert model.tokenizer_asks == 0
