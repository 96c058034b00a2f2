"""The preStop hook's way in: GET /prestop only on --control-port, bound to 127.0.0.1 whatever
--host is, and called by ``python3 -m modelroll_sidecar.prestop``. On the inference port, which
a version's Service exposes to every pod, /prestop is an unknown path and changes nothing."""

from __future__ import annotations

import asyncio
import sys
import time

import aiohttp
import pytest

from modelroll_sidecar.config import parse_args
from tests.support.processes import Proc, Spawn, free_port

DELAY_MS = 400


async def status(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url) as resp:
        await resp.read()
        return resp.status


async def run_prestop(*args: str) -> tuple[int, str, str]:
    """``python3 -m modelroll_sidecar.prestop`` as the kubelet's exec hook runs it: its exit
    status, standard output and standard error."""
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "modelroll_sidecar.prestop", *args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def start(spawn: Spawn, control_port: int) -> tuple[Proc, str]:
    """A demo model and a sidecar listening on every address, with its control port."""
    model_port, port = free_port(), free_port()
    model = f"http://127.0.0.1:{model_port}"
    spawn("modelroll-demo-model", f"--port={model_port}", "--fixed-ms=1", ready=f"{model}/readyz")
    flags = [f"--port={port}", f"--control-port={control_port}", f"--upstream={model}"]
    sidecar = spawn(
        "modelroll-sidecar",
        "--host=0.0.0.0",
        *flags,
        f"--prestop-delay-ms={DELAY_MS}",
        ready=f"http://127.0.0.1:{port}/readyz",
    )
    return sidecar, f"http://127.0.0.1:{port}"


async def test_prestop_on_the_inference_port_is_404_and_the_pod_stays_ready(spawn: Spawn) -> None:
    """What any pod can send to a version's Service: nothing it does takes the pod out."""
    sidecar, base = start(spawn, free_port())
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            async with session.get(f"{base}/prestop") as resp:
                assert resp.status == 404
                assert await resp.json() == {"error": "no such path '/prestop'"}
        assert await status(session, f"{base}/readyz") == 200
        async with session.post(f"{base}/v1/infer", json={"payload": "still here"}) as resp:
            assert resp.status == 200
            assert "close" not in resp.headers.get("Connection", "").lower()
    assert "Closing" not in sidecar.log()


async def test_the_control_port_listens_on_loopback_only(spawn: Spawn) -> None:
    """--host 0.0.0.0 takes the inference port to every address (127.0.0.2 among them, as a
    pod's IP would be); the control port answers on 127.0.0.1 alone."""
    control = free_port()
    _, base = start(spawn, control)
    other = base.replace("127.0.0.1", "127.0.0.2")
    async with aiohttp.ClientSession() as session:
        assert await status(session, f"{other}/readyz") == 200
        with pytest.raises(aiohttp.ClientConnectorError):
            await status(session, f"http://127.0.0.2:{control}/prestop")
        assert await status(session, f"{base}/readyz") == 200  # nothing changed


async def test_the_prestop_module_drains_through_the_control_port_and_exits_0(
    spawn: Spawn,
) -> None:
    """The hook's command turns the sidecar unready at once and returns after the delay; the
    sidecar keeps serving meanwhile and afterwards, every answer telling its client to close."""
    control = free_port()
    sidecar, base = start(spawn, control)
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        hook = asyncio.ensure_future(run_prestop(f"--control-port={control}"))
        while await status(session, f"{base}/readyz") == 200:
            assert not hook.done(), await hook
            await asyncio.sleep(0.02)
        async with session.post(f"{base}/v1/infer", json={"payload": "during"}) as resp:
            assert resp.status == 200
            assert resp.headers.get("Connection", "").lower() == "close"
        code, out, err = await hook
        waited = time.monotonic() - started
        assert (code, err) == (0, "")
        assert out == 'preStop: {"status":"closing","queued":0}\n'
        assert waited >= DELAY_MS / 1000
        assert await status(session, f"{base}/readyz") == 503  # unready until SIGTERM
        assert await status(session, f"{base}/livez") == 200  # and not restarted for it
    assert "Closing default/v1" in sidecar.log()


async def test_the_prestop_module_exits_1_with_a_message_when_nothing_answers(
    spawn: Spawn,
) -> None:
    port = free_port()
    code, out, err = await run_prestop(f"--control-port={port}")
    assert (code, out) == (1, "")
    assert err.startswith(f"preStop: GET /prestop on 127.0.0.1:{port} failed: ")
    # The inference port has no /prestop: the hook reports the 404 and nothing is drained.
    _, base = start(spawn, free_port())
    inference = int(base.rsplit(":", 1)[1])
    code, out, err = await run_prestop(f"--control-port={inference}")
    assert (code, out) == (1, "")
    assert err == f"preStop: GET /prestop on 127.0.0.1:{inference} answered 404\n"
    async with aiohttp.ClientSession() as session:
        assert await status(session, f"{base}/readyz") == 200


def test_without_the_flag_there_is_no_control_listener() -> None:
    """Off by default, so that several sidecars run side by side on one host; the operator
    gives managed pods one."""
    assert parse_args([], environ={}).control_port == 0
    assert parse_args([], environ={"MODELROLL_CONTROL_PORT": "8001"}).control_port == 8001
