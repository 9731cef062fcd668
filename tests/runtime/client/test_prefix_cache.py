"""PrefixCache: L1 LRU within a byte budget, per-domain TTL, L2 on disk across restarts."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.client.prefix_cache import PrefixCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def kv(fill: float, p: int = 3) -> list[np.ndarray]:
    """Two layers' k/v for a p-token prefix: 4 arrays of 1*2*p*4 float32 = 32*p bytes each."""
    return [np.full((1, 2, p, 4), fill + i, np.float32) for i in range(4)]


def test_a_hit_returns_the_stored_arrays_read_only_and_counts_tokens():
    cache = PrefixCache()
    assert cache.get([1, 2, 3]) is None
    cache.put([1, 2, 3], kv(1.0))
    got = cache.get([1, 2, 3])
    assert got is not None and np.array_equal(got[2], kv(1.0)[2])
    assert not got[0].flags.writeable
    assert (cache.stats.queries_tokens, cache.stats.hits_tokens) == (6, 3)
    assert (cache.stats.misses, cache.stats.l1_hits) == (1, 1)


def test_least_recently_used_entries_are_evicted_to_stay_within_the_byte_budget():
    one = sum(a.nbytes for a in kv(0.0))
    cache = PrefixCache(max_bytes=2 * one)
    cache.put([1], kv(1.0))
    cache.put([2], kv(2.0))
    assert cache.get([1]) is not None  # [2] is now least recently used
    cache.put([3], kv(3.0))
    assert cache.get([2]) is None and cache.get([1]) is not None and cache.get([3]) is not None
    assert cache.stats.bytes == 2 * one and cache.stats.evictions == 1
    cache.put([4], kv(4.0, p=100))  # larger than the whole budget: not kept, nothing evicted
    assert cache.get([4]) is None and len(cache) == 2


def test_entries_expire_after_their_domains_ttl():
    clock = Clock()
    cache = PrefixCache(default_ttl=10, ttl_seconds={"barks": 100, "forever": None}, clock=clock)
    cache.put([1], kv(1.0), "default")
    cache.put([2], kv(2.0), "barks")
    cache.put([3], kv(3.0), "forever")
    clock.now += 50
    assert cache.get([1]) is None
    assert cache.get([2], "barks") is not None
    clock.now += 60
    assert cache.get([2], "barks") is None
    assert cache.get([3], "forever") is not None
    assert cache.stats.expired == 2


def test_bad_settings_raise():
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixCache(max_bytes=-1)
    with pytest.raises(ValueError, match="domain 'barks'"):
        PrefixCache(ttl_seconds={"barks": 0})


def test_the_disk_tier_survives_a_restart_and_preloads(tmp_path):
    first = PrefixCache(disk_dir=tmp_path, fingerprint="m1")
    first.put([5, 6], kv(5.0, p=2), "barks")
    first.put([7, 8], kv(7.0, p=2))
    restarted = PrefixCache(disk_dir=tmp_path, fingerprint="m1")
    got = restarted.get([5, 6], "barks")
    assert got is not None and np.array_equal(got[3], kv(5.0, p=2)[3])
    assert restarted.stats.l2_hits == 1
    preloaded = PrefixCache(disk_dir=tmp_path, fingerprint="m1")
    assert preloaded.preload() == 2 and len(preloaded) == 2
    assert preloaded.get([7, 8]) is not None and preloaded.stats.l1_hits == 1


def test_the_disk_tier_ignores_other_models_stale_and_corrupt_entries(tmp_path):
    clock = Clock()
    PrefixCache(disk_dir=tmp_path, fingerprint="m1", clock=clock).put([1], kv(1.0))
    assert PrefixCache(disk_dir=tmp_path, fingerprint="m2").get([1]) is None
    short = PrefixCache(disk_dir=tmp_path, fingerprint="m1", default_ttl=5, clock=clock)
    clock.now += 10
    assert short.get([1]) is None and short.stats.expired == 1
    assert not list(tmp_path.glob("*.npz"))  # the stale file was removed
    PrefixCache(disk_dir=tmp_path, fingerprint="m1").put([2], kv(2.0))
    for f in tmp_path.glob("*.npz"):
        f.write_bytes(b"not a zip")
    fresh = PrefixCache(disk_dir=tmp_path, fingerprint="m1")
    assert fresh.get([2]) is None and fresh.preload() == 0


def test_get_or_compute_computes_once():
    cache = PrefixCache()
    calls = []

    def compute() -> list[np.ndarray]:
        calls.append(1)
        return kv(9.0)

    a, hit_a = cache.get_or_compute([9], compute)
    b, hit_b = cache.get_or_compute([9], compute)
    assert (hit_a, hit_b) == (False, True) and len(calls) == 1 and a[0] is b[0]
