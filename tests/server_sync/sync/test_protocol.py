"""The wire format: both codecs, and the schema check of every message type."""

import math
import re

import msgpack
import pytest

from server_sync.sync.protocol import decode_client, decode_server, validate_server
from server_sync.transport.wire import ProtocolError, decode, encode

HELLO = {"t": "hello", "v": 1, "token": "abc.def", "resume": {"epoch": "e1", "seq": 7},
         "pos": [1.5, -2.0]}
DELTA = {"t": "delta", "seq": 3, "time": 1000.5, "enter": {"n1": {"pos": [0, 1], "state": {"state": "idle"}}},
         "leave": ["n2"], "set": {"n3": {"state": "working", "mood": 2}}, "move": {"n3": [4.0, 5.0]}}


@pytest.mark.parametrize("codec", ["msgpack", "json"])
def test_round_trip_in_both_codecs_reports_the_codec_of_the_frame(codec):
    frame = encode(HELLO, codec)
    assert isinstance(frame, bytes if codec == "msgpack" else str)
    assert decode_client(frame) == (HELLO, codec)
    assert decode_server(encode(DELTA, codec)) == (DELTA, codec)


def test_msgpack_frames_are_smaller_than_json_for_a_delta():
    assert len(encode(DELTA, "msgpack")) < len(encode(DELTA, "json").encode())


@pytest.mark.parametrize("frame", [b"\xc1", b"\x92\x01", "{not json", b""])
def test_undecodable_frames_are_bad_frame_or_bad_message(frame):
    with pytest.raises(ProtocolError) as err:
        decode(frame)
    assert err.value.code in ("bad_frame", "bad_message")


def test_a_frame_that_is_not_a_map_is_bad_message():
    with pytest.raises(ProtocolError, match="must be a map") as err:
        decode(msgpack.packb([1, 2]))
    assert err.value.code == "bad_message"


@pytest.mark.parametrize(("message", "needle"), [
    ({"t": "nope"}, "'t' must be one of"),
    ({"t": "snapshot", "v": 1}, "'t' must be one of"),            # server type sent by a client
    ({"t": "hello", "v": 1}, "'token' is required"),
    ({"t": "hello", "v": 1, "token": 7}, "'token' must be a string"),
    ({"t": "hello", "v": "1", "token": "x"}, "'v' must be an integer"),
    ({"t": "hello", "v": 1, "token": "x", "admin": True}, "unknown field"),
    ({"t": "hello", "v": 1, "token": "x", "resume": {"epoch": "e", "seq": -1}}, "'seq' must be >= 0"),
    ({"t": "hello", "v": 1, "token": "x" * 2000}, "1..1024 characters"),
    ({"t": "intent", "cseq": 0, "pos": [1, 2]}, "'cseq' must be >= 1"),
    ({"t": "intent", "cseq": 1}, "needs 'pos' or 'talk'"),
    ({"t": "intent", "cseq": 1, "pos": [1]}, "intent: 'pos' must be [x, y]"),
    ({"t": "intent", "cseq": 1, "pos": [1, math.inf]}, "finite numbers"),
    ({"t": "intent", "cseq": 1, "pos": [True, 2]}, "intent: 'pos' must be [x, y]"),
    ({"t": "intent", "cseq": 1, "talk": {"npc": "n1"}}, "intent.talk: 'intent' is required"),
    ({"t": "resync"}, "'seq' is required"),
    ({"t": "resync", "seq": 1.0}, "'seq' must be an integer"),
])
def test_client_messages_failing_the_schema_name_the_field(message, needle):
    with pytest.raises(ProtocolError, match=re.escape(needle)) as err:
        decode_client(encode(message, "msgpack"))
    assert err.value.code == "bad_message"


def test_server_messages_are_validated_by_clients():
    bad = dict(DELTA, set={"n3": {"state": ["not", "scalar"]}})
    with pytest.raises(ProtocolError, match=r"delta\.set"):
        validate_server(bad)
    with pytest.raises(ProtocolError, match="'seq' must be >= 1"):
        validate_server(dict(DELTA, seq=0))


def test_error_codes_are_a_closed_set():
    with pytest.raises(ValueError, match="unknown protocol error code"):
        ProtocolError("oops", "x")
