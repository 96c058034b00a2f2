"""Reading wrk's output and writing its Lua scripts."""

from __future__ import annotations

import pytest

from modelroll_bench.wrk import parse, script

# wrk pads these latency lines with a trailing space; {SPACE} keeps it out of the source.
SLOW = """Running 4s test @ http://127.0.0.1:54271/v1/infer
  1 threads and 128 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.33s   508.23ms   1.75s    80.00%
    Req/Sec    75.82      8.85    90.00     72.50%
  Latency Distribution
     50%    1.63s{SPACE}
     75%    1.67s{SPACE}
     90%    1.72s{SPACE}
     99%    1.74s{SPACE}
  305 requests in 4.03s, 69.33KB read
Requests/sec:     75.61
Transfer/sec:     17.19KB
""".replace("{SPACE}", " ")

FAST_WITH_ERRORS = """Running 8s test @ http://127.0.0.1:40000/v1/infer
  1 threads and 128 connections
  Latency Distribution
     50%  812.00us
     75%    1.20ms
     90%    2.10ms
     99%    9.66ms
  8667 requests in 8.00s, 1.2MB read
  Socket errors: connect 0, read 3, write 1, timeout 2
  Non-2xx or 3xx responses: 17
Requests/sec:   1083.37
Transfer/sec:    150.00KB
"""


def test_latencies_in_seconds_with_trailing_spaces() -> None:
    result = parse("slow", SLOW)
    assert result.rps == 75.61
    assert result.requests == 305
    assert result.p50_ms == pytest.approx(1630)
    assert result.p99_ms == pytest.approx(1740)
    assert (result.non_2xx, result.socket_errors) == (0, 0)


def test_microseconds_errors_and_non_2xx() -> None:
    result = parse("fast", FAST_WITH_ERRORS)
    assert result.p50_ms == pytest.approx(0.812)
    assert result.p99_ms == pytest.approx(9.66)
    assert result.non_2xx == 17
    assert result.socket_errors == 6


def test_unreadable_output_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="could not read wrk output"):
        parse("x", "wrk: connection refused")


def test_one_body_sets_wrk_body() -> None:
    lua = script('{"payload": "a b"}')
    assert 'wrk.body = [==[{"payload": "a b"}]==]' in lua
    assert "request = function" not in lua


def test_several_bodies_are_formatted_once_in_init_and_cycled() -> None:
    lua = script(['{"payload": "a"}', '{"payload": "b b"}'])
    assert '[==[{"payload": "a"}]==],\n[==[{"payload": "b b"}]==]' in lua
    assert "init = function(args)" in lua
    assert "i = i % #requests + 1" in lua


def test_bodies_that_would_end_the_lua_string_are_refused() -> None:
    with pytest.raises(ValueError, match="]==]"):
        script(['{"payload": "]==]"}'])
    with pytest.raises(ValueError, match="no request bodies"):
        script([])
