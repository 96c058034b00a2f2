"""Saturation throughput with wrk (Debian package ``wrk``): a C load generator, so the client
is not what limits a fast server. POSTs one JSON body, or cycles through a list of them, over
keep-alive connections."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SCRIPT = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = {body}
"""
# Several bodies: each request takes the next one, every thread starting at the first. The
# requests are formatted once in init() (after wrk has set the Host header), as wrk's SCRIPTING
# advises, so cycling costs no more per request than one fixed body.
CYCLE_SCRIPT = """local bodies = {{
{bodies}
}}
local requests = {{}}
local i = 0
init = function(args)
  for k, body in ipairs(bodies) do
    requests[k] = wrk.format("POST", nil, {{["Content-Type"] = "application/json"}}, body)
  end
end
request = function()
  i = i % #requests + 1
  return requests[i]
end
"""
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


@dataclass(frozen=True)
class WrkResult:
    label: str
    rps: float
    requests: int
    non_2xx: int
    socket_errors: int
    p50_ms: float
    p99_ms: float


def _duration_ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if match is None:
        raise ValueError(f"unexpected wrk duration {text!r}")
    return float(match.group(1)) * UNITS[match.group(2)] * 1000


def parse(label: str, output: str) -> WrkResult:
    rps = re.search(r"Requests/sec:\s+([\d.]+)", output)
    total = re.search(r"(\d+) requests in", output)
    if rps is None or total is None:
        raise RuntimeError(f"could not read wrk output:\n{output}")
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    latency = dict(re.findall(r"^\s+(50|99)%\s+(\S+)\s*$", output, re.MULTILINE))
    return WrkResult(
        label=label,
        rps=float(rps.group(1)),
        requests=int(total.group(1)),
        non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
        socket_errors=sum(int(n) for n in errors.groups()) if errors else 0,
        p50_ms=_duration_ms(latency["50"]) if "50" in latency else 0.0,
        p99_ms=_duration_ms(latency["99"]) if "99" in latency else 0.0,
    )


def script(body: str | Sequence[str]) -> str:
    """The Lua script that makes wrk POST ``body``, or cycle through the bodies in order."""
    if isinstance(body, str):
        return SCRIPT.format(body=_lua_string(body))
    if not body:
        raise ValueError("no request bodies to send")
    return CYCLE_SCRIPT.format(bodies=",\n".join(_lua_string(b) for b in body))


def run(
    label: str,
    url: str,
    body: str | Sequence[str],
    *,
    connections: int,
    duration_s: int,
    threads: int = 1,
    timeout_s: int | None = None,
) -> WrkResult:
    """Run wrk; slower answers than ``timeout_s`` (wrk's default: 2 s) count as socket timeouts
    and are left out of its latency figures."""
    exe = shutil.which("wrk")
    if exe is None:
        raise SystemExit("wrk is not installed: apt-get install wrk (the Debian package)")
    with tempfile.TemporaryDirectory() as tmp:
        lua = Path(tmp) / "post.lua"
        lua.write_text(script(body))
        done = subprocess.run(
            [
                exe,
                f"-t{threads}",
                f"-c{connections}",
                f"-d{duration_s}s",
                *([f"--timeout={timeout_s}s"] if timeout_s else []),
                "--latency",
                "-s",
                str(lua),
                url,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    return parse(label, done.stdout)


def _lua_string(text: str) -> str:
    """A Lua string literal holding ``text`` (JSON is valid Lua once quoted this way)."""
    if "]==]" in text:
        raise ValueError("a request body may not contain ]==]")
    return "[==[" + text + "]==]"
