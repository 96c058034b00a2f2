"""Encoder fixtures: both variants loaded once per session, and the server on loopback in front of
an already loaded encoder (so a test pays for serving, not for loading)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from pytest_aiohttp import AiohttpServer

from modelroll_models.batch_server import BATCH_SERVICE
from modelroll_models.encoder import Encoder, EncoderFiles, load_encoder
from modelroll_models.model_files import ModelFilesMissing, default_onnx_path, default_zip_path
from modelroll_models.server import EncoderConfig, create_encoder_app
from tests.support.encoder import LOAD_TIMEOUT_S, RunningEncoder, StartEncoder, wait_loaded


@pytest.fixture(scope="session")
def files() -> EncoderFiles:
    try:
        return EncoderFiles(default_zip_path(), default_onnx_path())
    except ModelFilesMissing as exc:  # never a skip: `make venv` installs them
        pytest.fail(f"{exc} (run `make venv`)")


@pytest.fixture(scope="session")
def int8(files: EncoderFiles) -> Encoder:
    return load_encoder("int8", files, intra_op_threads=1)


@pytest.fixture(scope="session")
def fp32(files: EncoderFiles) -> Encoder:
    return load_encoder("fp32", files, intra_op_threads=1)


@pytest.fixture
def start_encoder(aiohttp_server: AiohttpServer, int8: Encoder) -> StartEncoder:
    """Serve the int8 encoder: ``await start_encoder(gate=event, max_batch_size=...)``. Loading
    finishes once ``gate`` is set (at once without one); ``load`` replaces the loader."""

    async def start(
        gate: threading.Event | None = None,
        load: Callable[[], Encoder] | None = None,
        **settings: Any,
    ) -> RunningEncoder:
        def loaded() -> Encoder:
            if gate is not None and not gate.wait(LOAD_TIMEOUT_S):
                raise TimeoutError("the test never opened the gate")
            return int8

        config = EncoderConfig(**settings)
        app = create_encoder_app(config, load or loaded)
        server = await aiohttp_server(app)
        running = RunningEncoder(server, app[BATCH_SERVICE])
        if gate is None:
            await wait_loaded(running.service)
        return running

    return start
