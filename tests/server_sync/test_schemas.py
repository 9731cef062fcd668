"""The shipped JSON Schemas: generated from the validators' tables, valid JSON Schema, in
agreement with the validators message by message, and met by every message type the sync
server sends (the dialogue server's: tests/server_sync/dialogue/test_dialogue_server.py)."""

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from server_sync import Client, ServerConfig, SyncServer
from server_sync.dialogue.dialogue_protocol import DIALOGUE
from server_sync.schemas import SCHEMA_DIR, all_schemas, load_schema, schema_files
from server_sync.sync.protocol import SYNC
from server_sync.sync.world import sim_world
from server_sync.transport.wire import ProtocolError

from .conftest import SECRET, token, until
from .schema_check import errors
from .strategies import mutated_message, valid_message


def test_the_shipped_schema_files_are_the_ones_the_tables_generate():
    for name, text in schema_files().items():
        assert (SCHEMA_DIR / name).read_text(encoding="utf-8") == text, \
            f"{name} is stale: run python -m server_sync.schemas"


def test_the_schemas_are_valid_draft_2020_12():
    jsonschema = pytest.importorskip("jsonschema")
    for schema in all_schemas().values():
        jsonschema.Draft202012Validator.check_schema(schema)


def test_flashnpc_serve_prints_the_schemas():
    from server_sync.cli import print_schemas

    lines = []
    print_schemas(lines.append)
    assert json.loads("".join(lines)) == all_schemas()


CASES = [(p, d) for p in (SYNC, DIALOGUE) for d in ("client", "server")]


@pytest.mark.parametrize(("protocol", "direction"), CASES,
                         ids=[f"{p.name}-{d}" for p, d in CASES])
@seed(15)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_schemas_and_the_validators_agree_on_valid_and_broken_messages(protocol, direction,
                                                                          data):
    schema = load_schema(protocol.name, direction)
    msg = data.draw(st.one_of(valid_message(protocol, direction),
                              mutated_message(protocol, direction)))
    try:
        protocol.validate(msg, direction)
        accepted = True
    except ProtocolError:
        accepted = False
    if any(isinstance(v, str) and not _encodable(v) for v in _strings(msg)):
        assert not accepted  # lone surrogates: refused by the validators; JSON cannot carry them
        return
    if any(isinstance(v, float) and v != v for v in _numbers(msg)):
        return  # NaN: refused by the validators, unrepresentable in JSON
    assert accepted == (errors(msg, schema, schema) == []), msg


def _walk(v):
    yield v
    if isinstance(v, dict):
        for k, x in v.items():
            yield k
            yield from _walk(x)
    elif isinstance(v, list):
        for x in v:
            yield from _walk(x)


def _strings(msg):
    return [v for v in _walk(msg) if isinstance(v, str)]


def _numbers(msg):
    return [v for v in _walk(msg) if isinstance(v, float)]


def _encodable(s):
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def line_world():
    world = sim_world(6, changes_per_s=1e-6, size=1.0)
    for k in range(6):
        world.move_npc(f"npc{k}", (k * 30.0, 0.0))
    return world


async def test_every_sync_server_message_type_is_checked_against_its_schema(outbound_schema_check):
    config = ServerConfig(secret=SECRET, port=0, http_port=None, radius=40.0, tick_hz=50.0)
    async with SyncServer(line_world(), config) as srv:
        url = f"ws://127.0.0.1:{srv.port}"
        client = Client(url, token("p1"), position=(0.0, 0.0), codec="json")
        task = asyncio.create_task(client.run())
        await until(client.synced.is_set, 10, "synced")
        await client.send_intent(pos=(40.0, 0.0))              # enter + leave + ack
        await client.send_intent(talk=("npc2", "greet"))      # set
        await client.send_intent(talk=("npc5", "greet"))      # refused (not in area)
        await client.wait_acked()
        srv.core.world.move_npc("npc1", (41.0, 1.0))          # move
        srv.core.teleport("p1", (45.0, 0.0))                  # delta pos
        await until(lambda: client.replica.player_pos == [45.0, 0.0], 10, "teleport")
        bad = Client(url, "not-a-token", position=(0.0, 0.0))
        with pytest.raises(Exception, match="auth_failed"):
            await asyncio.wait_for(bad.run(), 10)              # error
    assert client.last_error == ("bye", "server_shutdown")    # bye
    await client.close()
    await task
    got = {k.split(".")[1] for k in outbound_schema_check.checked if k.startswith("sync.")}
    assert got == {"snapshot", "delta", "ack", "refused", "error", "bye"}, got
    assert outbound_schema_check.violations == []
