"""The tick's direct frame writer must produce exactly what websockets would send."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode

from server_sync.transport import aio
from server_sync.transport.gate import ws_frame


def reference(message: bytes | str) -> bytes:
    if isinstance(message, str):
        return Frame(Opcode.TEXT, message.encode()).serialize(mask=False)
    return Frame(Opcode.BINARY, message).serialize(mask=False)


@pytest.mark.parametrize("n", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_binary_frame_matches_websockets_at_every_length_boundary(n: int) -> None:
    payload = bytes(range(256)) * (n // 256) + bytes(range(n % 256))
    assert ws_frame(payload) == reference(payload)


@given(st.text(max_size=300))
def test_text_frame_is_utf8_and_matches_websockets(text: str) -> None:
    assert ws_frame(text) == reference(text)


@given(st.binary(max_size=300))
def test_binary_frame_matches_websockets(data: bytes) -> None:
    assert ws_frame(data) == reference(data)


def test_loop_name_names_an_installed_loop_and_refuses_unknown_ones() -> None:
    assert aio.loop_name("asyncio") == "asyncio"
    assert aio.loop_name("auto") in ("uvloop", "asyncio")
    with pytest.raises(ValueError, match="loop must be one of"):
        aio.loop_name("trio")


def test_run_returns_the_coroutine_result_on_the_auto_loop() -> None:
    async def main() -> int:
        return 7

    assert aio.run(main(), loop="auto") == 7
