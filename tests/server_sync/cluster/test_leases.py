"""Area leases on a real Redis: acquire, renew, expire, fence; a zombie's writes are refused."""

from __future__ import annotations

import time

import pytest

from server_sync.cluster.backplane import Backplane, Commit, Fenced
from server_sync.cluster.keys import Keys, area_of
from server_sync.cluster.leases import LeaseTable, preferred


def table(redis_server, node, lease_ms=200):
    return LeaseTable(redis_server.client(), Keys("t"), node, lease_ms)


def wait_expired(r, key, timeout=5.0):
    deadline = time.monotonic() + timeout
    while r.exists(key):  # Redis expires the key on its own clock: poll it
        assert time.monotonic() < deadline, f"{key} did not expire"
        time.sleep(0.01)


def test_an_area_has_one_owner_and_each_takeover_bumps_the_fence(redis_server):
    a, b = table(redis_server, "a"), table(redis_server, "b")
    [got] = a.acquire(["0:0"])
    assert (got.area, got.fence, got.consumed, got.checkpoint) == ("0:0", "1", "0-0", "")
    assert b.acquire(["0:0"]) == []  # held
    assert a.scan(["0:0", "1:0"]).holders == {"0:0": "a", "1:0": ""}
    wait_expired(redis_server.client(), Keys("t").lease("0:0"))
    [again] = b.acquire(["0:0"])
    assert again.fence == "2"


def test_renewal_keeps_a_lease_past_its_term_and_reports_a_lost_one(redis_server):
    a, b = table(redis_server, "a", 300), table(redis_server, "b", 300)
    fence = a.acquire(["0:0"])[0].fence
    r = redis_server.client()
    for _ in range(4):  # 4 x 100 ms > one lease
        assert a.renew({"0:0": fence}).kept == ["0:0"]
        assert 0 < r.pttl(Keys("t").lease("0:0")) <= 300
        time.sleep(0.1)  # the lease's own wall-clock term is what is tested
    assert b.acquire(["0:0"]) == []
    wait_expired(r, Keys("t").lease("0:0"))
    assert a.renew({"0:0": fence}).kept == ["0:0"]  # expired, nobody took it: same token
    wait_expired(r, Keys("t").lease("0:0"))
    b.acquire(["0:0"])
    renewal = a.renew({"0:0": fence})
    assert renewal.lost == ["0:0"] and renewal.kept == []


def test_a_zombie_owner_cannot_write_once_another_node_took_its_area(redis_server):
    r = redis_server.client()
    keys = Keys("t")
    zombie, successor = table(redis_server, "zombie"), table(redis_server, "successor")
    old = zombie.acquire(["0:0"])[0].fence
    zbp, sbp = Backplane(r, keys, "zombie"), Backplane(r, keys, "successor")
    zbp.join("w")
    zbp.commit(Commit(fences={"0:0": old}, areas={"0:0": [["npc1", "state", "a"]]}))
    wait_expired(r, keys.lease("0:0"))  # the zombie is paused past its lease
    new = successor.acquire(["0:0"])[0].fence
    before = r.xlen(keys.changes)
    with pytest.raises(Fenced, match="taken over by another node"):
        zbp.commit(Commit(fences={"0:0": old}, areas={"0:0": [["npc1", "state", "zombie"]]},
                          cseq={"p1": 9}))
    assert r.xlen(keys.changes) == before and r.hget(keys.cseq, "p1") is None  # nothing
    assert zbp.checkpoint({"0:0": "{}"}, {"0:0": old})[1] == ["0:0"]
    assert r.hget(keys.checkpoints, "0:0") is None
    sbp.commit(Commit(fences={"0:0": new}, areas={"0:0": [["npc1", "state", "b"]]}))
    assert r.xlen(keys.changes) == before + 1


def test_a_node_whose_world_differs_is_refused_with_a_clear_error(redis_server):
    r = redis_server.client()
    Backplane(r, Keys("t"), "a").join("200 npcs, 16 areas, abc")
    with pytest.raises(ValueError, match="every node must run the same --world"):
        Backplane(r, Keys("t"), "b").join("300 npcs, 16 areas, def")


def test_rendezvous_hashing_splits_areas_and_moves_only_a_dead_nodes_share():
    areas = [area_of((x * 250.0, y * 250.0), 250.0) for x in range(8) for y in range(8)]
    three = {a: preferred(a, ["n0", "n1", "n2"]) for a in areas}
    assert all(10 < sum(o == n for o in three.values()) < 35 for n in ("n0", "n1", "n2"))
    two = {a: preferred(a, ["n0", "n2"]) for a in areas}
    assert all(two[a] == three[a] for a in areas if three[a] != "n1")
    assert preferred("0:0", []) is None
