"""DialogueClient against one dialogue server (no front needed): lines streamed or whole, the
state kept and re-sent after a dropped connection, a hung worker answered by fallbacks on the
deadline, cancel, and the errors it passes on."""

from __future__ import annotations

import asyncio
import signal

import pytest

from server_sync.dialogue.client import DialogueClient, DialogueRefused, RequestError
from tests.server_sync.conftest import token, until

from .conftest import client, in_process_worker


async def test_lines_come_whole_or_streamed_and_pieces_make_the_text():
    async with in_process_worker("solo") as srv:
        c = client(f"ws://127.0.0.1:{srv.port}", "k")
        await c.connect()
        assert c.worker == "solo" and c.url.endswith("/?session=k")
        s = await c.open_session("merchant", "idle", persona=["greedy"])
        whole = await s.request_line("greet", seed=5)
        pieces: list[str] = []
        streamed = await s.request_line("greet", seed=5, on_piece=pieces.append)
        assert whole.text and whole.worker == "solo" and whole.tokens > 0
        if not streamed.fallback:
            assert "".join(pieces) == streamed.text and streamed.ttft_ms is not None
            assert 0 < streamed.ttft_ms <= streamed.latency_ms
        assert whole.ttft_ms is None and whole.server_latency_ms is not None
        await s.close()
        await until(lambda: srv.service.num_sessions == 0, what="session closed on the server")
        await c.close()


async def test_the_last_state_is_re_sent_when_a_dropped_connection_re_opens_the_session():
    async with in_process_worker("solo") as srv:
        c = client(f"ws://127.0.0.1:{srv.port}", "k")
        await c.connect()
        s = await c.open_session("guard", "idle")
        await s.update_state(state="alert", persona=["gruff"])
        first_sid = s.sid
        await c.drop_connection()
        await until(lambda: s.sid is not None and s.sid != first_sid, what="the session re-opened")
        assert c.reopens == 1 and c.worker_losses == 1 and c.connects == 2
        served = srv.service.session(s.sid)
        assert (served.state, served.persona) == ("alert", ("gruff",))
        assert (await s.request_line("greet")).text
        await c.close()


async def test_sixty_sessions_open_and_re_open_under_the_servers_default_rate_limit():
    from server_sync.dialogue.dialogue_server import DialogueConfig

    limits = DialogueConfig(secret=b"x" * 32)
    async with in_process_worker("solo", rate_per_s=limits.rate_per_s,
                                 rate_burst=limits.rate_burst) as srv:
        c = client(f"ws://127.0.0.1:{srv.port}", "many")
        await c.connect()
        sessions = await asyncio.gather(*[c.open_session("guard", "idle") for _ in range(60)])
        assert srv.service.num_sessions == 60
        await c.drop_connection()
        await until(lambda: all(s.sid is not None for s in sessions) and c.connects == 2,
                    timeout=20, what="60 sessions re-opened")
        assert c.reopens == 60 and c.worker_losses == 1 and c.connects == 2  # never cut
        assert srv.errors.get("rate_limited", 0) == 0
        await c.close()


async def test_a_hung_worker_gets_no_answer_fallbacks_and_the_session_comes_back_with_it(workers):
    w = workers[0]
    c = client(f"ws://127.0.0.1:{w.worker.port}", "hang", deadline_ms=300, answer_grace_s=0.3,
               open_timeout_s=1.0, backoff_max_s=0.2)
    await c.connect()
    s = await c.open_session("guard", "patrol")
    w.proc.send_signal(signal.SIGSTOP)
    try:
        line = await asyncio.wait_for(s.request_line("greet"), 5)  # 300 ms + 0.3 s grace
        assert (line.fallback, line.fallback_reason, line.worker) == (True, "no_answer", "w0")
        assert line.text in c.fallbacks.candidates("guard", "patrol", "greet")  # answers the greeting
        assert 550 <= line.latency_ms < 2000
        waiting = await asyncio.wait_for(s.request_line("greet"), 5)  # nobody to re-open on
        assert (waiting.fallback, waiting.fallback_reason) == (True, "no_worker")
        assert 290 <= waiting.latency_ms < 1500  # by its deadline, not the grace after it
    finally:
        w.proc.send_signal(signal.SIGCONT)
    await until(lambda: s.sid is not None, 10, "the session re-opened on the woken worker")
    back = await s.request_line("greet")
    assert back.worker == "w0" and back.fallback_reason not in ("no_answer", "no_worker")
    await c.close()


async def test_cancelling_a_request_sends_cancel_and_errors_come_back_as_request_errors():
    async with in_process_worker("solo") as srv:
        c = client(f"ws://127.0.0.1:{srv.port}", "k")
        await c.connect()
        with pytest.raises(RequestError) as bad:
            await c.open_session("dragon", "idle")
        assert bad.value.code == "invalid_request" and "dragon" in bad.value.reason
        s = await c.open_session("guard", "idle")
        for sent in range(1, 11):  # a short line can be answered before the cancel: ask again
            task = asyncio.create_task(s.request_line("greet", max_tokens=256, deadline_ms=30_000,
                                                      on_piece=lambda _: None))
            await until(lambda n=sent: srv.messages["request_line"] == n, what="the request sent")
            if task.done():
                await task
                continue
            task.cancel()  # still in flight (one event loop: nothing answers it in between)
            with pytest.raises(asyncio.CancelledError):
                await task
            break
        else:
            pytest.fail("every line was answered before its cancel could be sent")
        await until(lambda: srv.errors["cancelled"] == 1, what="the server cancelled it")
        with pytest.raises(RequestError, match="invalid_request"):
            await s.update_state(state="dancing")
        assert s.state == "idle"  # refused: the local copy stays
        await c.close()


async def test_a_refused_token_is_a_clear_error_not_a_reconnect_loop():
    async with in_process_worker("solo") as srv:
        c = DialogueClient(f"ws://127.0.0.1:{srv.port}", "forged.token", key="k")
        with pytest.raises(DialogueRefused, match="auth_failed"):
            await c.connect()
        assert srv.connections_total == 1
        ok = DialogueClient(f"ws://127.0.0.1:{srv.port}", token("p"))
        await ok.connect()
        with pytest.raises(ValueError, match=r"deadline_ms must be 1\.\.60000"):
            DialogueClient("ws://x", "t", deadline_ms=0)
        await ok.close()
