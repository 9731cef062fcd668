"""A worker killed with kill -9 mid-run behind real nginx: every request is answered - the ones
in flight on it with authored fallback lines, then real lines from another worker once the
client re-opened its session there - and no request goes unanswered."""

from __future__ import annotations

import asyncio
import signal

from server_sync.dialogue.client import DialogueClient, Line
from tests.server_sync.conftest import until

from .conftest import client

CLIENT_REASONS = {"worker_lost", "no_answer", "no_worker", "refused", "closed"}


async def test_a_worker_killed_mid_run_leaves_no_request_unanswered(front, workers):
    victim = workers[2]
    _, _, url = front([w.worker for w in workers])
    clients: list[DialogueClient] = []
    for i in range(200):  # keys until 3 land on the victim and 9 on the others
        c = client(url, f"npc-{i}", f"p{i}")
        await c.connect()
        on_it = sum(x.worker == "w2" for x in clients)
        if (c.worker == "w2" and on_it < 3) or (c.worker != "w2" and len(clients) - on_it < 9):
            clients.append(c)
        else:
            await c.close()
        if len(clients) == 12:
            break
    assert len(clients) == 12, "the hash put too few keys on one side"
    sessions = [await c.open_session("guard", "idle") for c in clients]
    on_victim = [i for i, c in enumerate(clients) if c.worker == "w2"]
    sent = [0] * len(clients)
    lines: list[list[Line]] = [[] for _ in clients]
    stop = asyncio.Event()

    async def talk(i: int) -> None:
        while not stop.is_set():
            sent[i] += 1
            lines[i].append(await sessions[i].request_line("greet", max_tokens=24))

    talkers = [asyncio.create_task(talk(i)) for i in range(len(clients))]
    try:
        # (bounds, not waits: generous, so a loaded machine's slow lines are not a failure)
        await until(lambda: min(len(x) for x in lines) >= 2, 60, "two lines for every client")
        # stop the victim, ask each of its clients for one more line (it cannot be answered:
        # surely in flight), then kill -9 the victim
        victim.proc.send_signal(signal.SIGSTOP)
        answered_at_stop = [len(x) for x in lines]
        asked: list[int] = []

        async def in_flight(i: int) -> Line:
            asked.append(i)  # request_line sends before its first await
            return await sessions[i].request_line("greet", max_tokens=24)

        stranded = [asyncio.create_task(in_flight(i)) for i in on_victim]
        await until(lambda: len(asked) == len(on_victim), 5, "the stranded requests sent")
        victim.kill()
        for line in await asyncio.wait_for(asyncio.gather(*stranded), 10):
            assert line.fallback and line.fallback_reason == "worker_lost" and line.text
            assert line.worker == "w2"

        def recovered(i: int) -> bool:
            after = lines[i][answered_at_stop[i]:]
            return any(not x.fallback and x.worker != "w2" for x in after)

        await until(lambda: all(recovered(i) for i in on_victim), 60,
                    "real lines from another worker for the victim's clients")
        stop.set()
        await asyncio.wait_for(asyncio.gather(*talkers), 10)
        assert [len(x) for x in lines] == sent  # every request answered
        for i in on_victim:
            tail = lines[i][answered_at_stop[i]:]
            lost = [k for k, x in enumerate(tail) if x.fallback_reason in CLIENT_REASONS]
            assert all(tail[k].fallback_reason == "worker_lost" for k in lost)
            assert all(x.worker in ("w0", "w1") for x in tail[lost[-1] + 1 if lost else 0:])
            assert clients[i].reopens == 1 and sessions[i].opens == 2
        others = [i for i in range(len(clients)) if i not in on_victim]
        assert all(not any(x.fallback_reason in CLIENT_REASONS for x in lines[i]) for i in others)
    finally:  # a failed check must not leave the victim stopped (it would hold the pool's teardown)
        stop.set()
        for t in talkers:
            t.cancel()
        victim.kill()
        for c in clients:
            await asyncio.wait_for(c.close(), 10)
