import pytest

from lrukit import LRUCache


def test_evicts_oldest_insert():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert "a" not in cache and len(cache) == 2


def test_put_updates_value():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("a", 5)
    assert cache.get("a") == 5
    assert cache.get("zzz", "none") == "none"


def test_capacity_validated():
    with pytest.raises(ValueError):
        LRUCache(0)
