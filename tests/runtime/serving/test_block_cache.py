"""The server's block cache: hash chains, reference counts, LRU eviction and the three tiers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime.serving.block_cache import BlockCache, chain_hashes

SHAPE = (2, 2, 4)  # n_layer, n_head, head_dim
BT = 2


def block(value: float) -> torch.Tensor:
    return torch.full((SHAPE[0], 2, SHAPE[1], BT, SHAPE[2]), value)


def cache(tmp_path: Path | None = None, *, l1: int = 2, l2: int = 2, l3: int = 8) -> BlockCache:
    return BlockCache(block_tokens=BT, block_shape=SHAPE, dtype=torch.float32, l1_blocks=l1, l2_blocks=l2,
                      disk_dir=tmp_path, l3_blocks=l3, namespace="test")


def test_chain_hashes_name_full_blocks_and_cover_every_earlier_token():
    a = chain_hashes([1, 2, 3, 4, 5], 2)
    assert len(a) == 2  # the fifth token is a partial block: not named
    assert chain_hashes([1, 2, 3, 4, 9, 9], 2)[:2] == a  # shared prefix, shared names
    b = chain_hashes([7, 2, 3, 4], 2)
    assert b[0] != a[0] and b[1] != a[1]  # an earlier token changes every later name
    assert chain_hashes([1, 2], 2, "other") != chain_hashes([1, 2], 2, "model")


def test_acquire_returns_the_longest_cached_run_and_counts_l1_hits():
    c = cache(l1=4)
    hs = c.hashes([1, 2, 3, 4, 5, 6])
    c.release([c.insert(hs[0], block(1.0)), c.insert(hs[1], block(2.0))])
    got = c.acquire(hs)
    assert len(got) == 2
    assert torch.equal(c.pool[got[1]], block(2.0))
    assert c.stats.queried_tokens == 6 and c.stats.hits["l1"] == 4
    c.release(got)


def test_lru_eviction_demotes_to_host_and_a_hit_promotes_back(tmp_path):
    c = cache(l1=2, l2=2)
    hs = [c.hashes([i, i])[0] for i in range(3)]
    for i, h in enumerate(hs):
        c.release([c.insert(h, block(float(i)))])
    assert c.tier_of(hs[0]) == "l2" and c.tier_of(hs[2]) == "l1"  # oldest left L1 first
    got = c.acquire([hs[0]])
    assert c.stats.hits["l2"] == BT and c.stats.promotions == 1
    assert c.tier_of(hs[0]) == "l1" and torch.equal(c.pool[got[0]], block(0.0))
    assert c.tier_of(hs[1]) == "l2"  # made room by demoting the least recently used
    c.release(got)


def test_referenced_blocks_are_never_evicted():
    c = cache(l1=2)
    h = [c.hashes([i, i])[0] for i in range(3)]
    pinned = [c.insert(h[0], block(0.0)), c.insert(h[1], block(1.0))]
    assert c.insert(h[2], block(2.0)) is None  # everything pinned: nothing placed
    c.release(pinned[:1])
    assert c.insert(h[2], block(2.0)) is not None
    assert c.tier_of(h[1]) == "l1" and c.tier_of(h[0]) == "l2"


def test_blocks_fall_through_to_disk_and_come_back_from_it(tmp_path):
    c = cache(tmp_path, l1=1, l2=1)
    h = [c.hashes([i, i])[0] for i in range(3)]
    for i in range(3):
        c.release([c.insert(h[i], block(float(i)))])
    assert [c.tier_of(x) for x in h] == ["l3", "l2", "l1"]
    assert c.stats.evictions == {"l1": 2, "l2": 1, "l3": 0}
    got = c.acquire([h[0]])
    assert c.stats.hits["l3"] == BT and torch.equal(c.pool[got[0]], block(0.0))
    c.release(got)
    # the disk tier outlives the process's cache: a new cache finds the files
    c2 = cache(tmp_path, l1=1, l2=1)
    assert c2.tier_of(h[2]) is None
    assert all(c2.tier_of(x) == "l3" for x in [x for x in h if (tmp_path / f"{x.hex()}.pt").exists()])


def test_disk_tier_is_bounded_and_deletes_what_it_drops(tmp_path):
    c = cache(tmp_path, l1=1, l2=0, l3=2)
    for i in range(5):
        c.release([c.insert(c.hashes([i, i])[0], block(float(i)))])
    assert len(list(tmp_path.glob("*.pt"))) == 2
    assert c.stats.dropped == 2


def test_release_more_than_acquired_and_wrong_shapes_raise():
    c = cache()
    idx = c.insert(c.hashes([1, 1])[0], block(1.0))
    c.release([idx])
    with pytest.raises(ValueError, match="released more often"):
        c.release([idx])
    with pytest.raises(ValueError, match="block tensor shape"):
        c.insert(b"x" * 16, torch.zeros(3))


def test_insert_many_places_blocks_at_once_and_demotes_what_it_evicts():
    c = cache(l1=3, l2=4)
    h = [c.hashes([i, i])[0] for i in range(5)]
    c.release([i for i in c.insert_many(h[:3], torch.stack([block(0.0), block(1.0), block(2.0)])) if i is not None])
    placed = c.insert_many([h[3], h[4], h[3]], torch.stack([block(3.0), block(4.0), block(3.0)]))
    assert placed[0] == placed[2] and None not in placed
    assert [c.tier_of(x) for x in h] == ["l2", "l2", "l1", "l1", "l1"]
    c.release([i for i in placed if i is not None])
    got = c.acquire([h[0]])  # demoted data comes back intact
    assert torch.equal(c.pool[got[0]], block(0.0)) and c.stats.hits["l2"] == BT
    c.release(got)
