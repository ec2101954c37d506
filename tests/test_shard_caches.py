"""Shards kept by content (``protocol.content_cache``): the pure index every client follows, and the
tab's ``ShardStore`` over real MNIST shards: verified on use, bounded, kept across page loads."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from browser_peer.shard_store import INDEX_KEY, ShardStore
from lab.browser_host import NativeBridge
from protocol.content_cache import CacheIndex
from protocol.manifests import FetchManifest, ShardEntry


def test_the_index_keeps_the_most_recently_used_within_its_byte_capacity() -> None:
    index = CacheIndex(10)
    assert index.admit("a", 4) == [] and index.admit("b", 4) == []
    assert index.touch("a") and not index.touch("z")  # a is now the most recently used
    assert index.admit("c", 4) == ["b"]  # the least recently used goes first
    assert index.keys() == ["a", "c"] and index.held == 8
    assert index.admit("big", 11) == ["big"] and "big" not in index  # larger than the whole capacity
    assert index.admit("c", 7) == ["a"] and index.held == 7  # admitted again at its new size
    index.discard("c")
    assert len(index) == 0 and index.held == 0
    with pytest.raises(ValueError):
        index.admit("negative", -1)


@pytest.mark.parametrize(
    "saved", [None, b"", b"not json", b"{}", b"7", b'[["a", "4"]]', b'[["a", -1]]', b"[[1, 2]]", b'[["a", 1, 2]]']
)
def test_a_missing_or_damaged_index_reads_as_empty(saved: bytes | None) -> None:
    assert len(CacheIndex.decode(100, saved)) == 0


def test_an_index_read_back_keeps_its_order_and_no_more_than_its_capacity() -> None:
    index = CacheIndex(100)
    for key in "abc":
        index.admit(key, 30)
    index.touch("a")
    assert CacheIndex.decode(100, index.encode()).keys() == ["b", "c", "a"]
    assert CacheIndex.decode(60, index.encode()).keys() == ["c", "a"]  # a smaller cap drops the oldest


def _shards(train_manifest: FetchManifest, dataset_root: Path, count: int) -> list[tuple[ShardEntry, bytes]]:
    return [
        (entry, (dataset_root / "mnist/train" / entry.locator).read_bytes()) for entry in train_manifest.shards[:count]
    ]


def test_a_tab_keeps_shards_by_content_verified_bounded_and_across_page_loads(
    train_manifest: FetchManifest, dataset_root: Path
) -> None:
    (a, a_bytes), (b, b_bytes), (c, c_bytes) = _shards(train_manifest, dataset_root, 3)
    storage: dict[str, bytes] = {}
    stored: dict[str, bytes] = {}  # one profile's IndexedDB stores, across page loads
    capacity = 2 * a.size_bytes + a.size_bytes // 2  # room for two shards

    async def first_load() -> None:
        store = ShardStore(NativeBridge(storage, shards=stored), capacity)
        await store.open()
        assert await store.get(a) is None
        for entry, data in ((a, a_bytes), (b, b_bytes)):
            await store.keep(entry, data)
        assert await store.get(a) == a_bytes  # a is now more recent than b
        await store.keep(c, c_bytes)  # b goes: least recently used
        assert set(stored) == {a.sha256, c.sha256} and await store.get(b) is None
        await store.save()

    async def second_load() -> None:
        stored["left-over"] = b"a shard the index does not name"
        stored[c.sha256] = c_bytes[:-1] + bytes([c_bytes[-1] ^ 1])  # damaged on disk
        store = ShardStore(NativeBridge(storage, shards=stored), capacity)
        await store.open()
        assert "left-over" not in stored  # the storage holds no more than the index counts
        assert await store.get(a) == a_bytes  # kept across the reload, verified
        assert await store.get(c) is None and c.sha256 not in stored  # damaged: dropped, never used
        assert store.index.keys() == [a.sha256]

    asyncio.run(first_load())
    assert INDEX_KEY in storage
    asyncio.run(second_load())


def test_a_shard_the_storage_refuses_is_not_counted_as_kept(train_manifest: FetchManifest, dataset_root: Path) -> None:
    class FullStorage(NativeBridge):
        async def shard_put(self, key: str, data: bytes) -> bool:
            return False  # IndexedDB's quota spent and no memory left

    ((a, a_bytes),) = _shards(train_manifest, dataset_root, 1)

    async def keep() -> ShardStore:
        store = ShardStore(FullStorage(), 10 * a.size_bytes)
        await store.keep(a, a_bytes)
        return store

    store = asyncio.run(keep())
    assert a.sha256 not in store.index and store.index.held == 0
