"""The event scanner under every way a stream can arrive in pieces: whatever the split, and with
LF, CRLF or lone-CR line ends, it finds the same events, and what it passes on is whole events
only, exactly the bytes that came."""

from __future__ import annotations

import pytest

from modelroll_common.sse import MAX_EVENT_BYTES, EventScanner, EventTooLong, GenerationWatch

LINES = [
    b": keep-alive",
    b"",
    b'data: {"choices":[{"delta":{"content":"a"}}]}',
    b"",
    b"event: message",
    b"id: 7",
    b"data: first line",
    b"data:second line",
    b"",
    b"data: [DONE]",
    b"",
]
DATA = ['{"choices":[{"delta":{"content":"a"}}]}', "first line\nsecond line", "[DONE]"]
ENDINGS = {"LF": b"\n", "CRLF": b"\r\n", "CR": b"\r"}


def stream(ending: bytes) -> bytes:
    return b"".join(line + ending for line in LINES)


def event_ends(ending: bytes) -> set[int]:
    """Where the stream's events end: after each blank line (for CRLF, also between its CR and
    LF, since a CR alone ends a line)."""
    ends, at = set(), 0
    for line in LINES:
        at += len(line) + len(ending)
        if not line:
            ends.add(at)
            if ending == b"\r\n":
                ends.add(at - 1)
    return ends


def scan(pieces: list[bytes]) -> tuple[list[bytes], list[str]]:
    """What the scanner passes on after each piece, and every event's data."""
    scanner = EventScanner()
    passed, found = [], []
    for piece in pieces:
        whole, data = scanner.take(piece)
        passed.append(whole)
        found.extend(data)
    return passed, found


@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
def test_every_split_point_finds_the_same_events_and_passes_on_whole_events_only(
    ending: bytes,
) -> None:
    whole = stream(ending)
    ends = event_ends(ending)
    for split in range(len(whole) + 1):
        passed, found = scan([whole[:split], whole[split:]])
        assert found == DATA, split
        assert b"".join(passed) == whole, split
        assert len(passed[0]) in ends | {0}, split  # never part of an event


@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
def test_a_byte_at_a_time_finds_the_same_events(ending: bytes) -> None:
    whole = stream(ending)
    passed, found = scan([whole[i : i + 1] for i in range(len(whole))])
    assert found == DATA
    assert b"".join(passed) == whole
    sofar = 0
    for piece in passed:
        sofar += len(piece)
        assert not piece or sofar in event_ends(ending)


def test_done_split_between_cr_and_lf_completes_the_stream() -> None:
    watch, scanner = GenerationWatch(), EventScanner()
    for piece in (b"data: [DONE]\r\n\r", b"\n"):
        for data in scanner.feed(piece):
            watch.saw(data, 0.0)
    assert watch.done


def test_an_event_that_never_ends_is_refused() -> None:
    scanner = EventScanner()
    scanner.feed(b"data: " + b"x" * (MAX_EVENT_BYTES - 10))
    with pytest.raises(EventTooLong):
        scanner.feed(b"x" * 20)
