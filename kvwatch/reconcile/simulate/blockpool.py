"""vLLM's KV block pool with prefix-cache hashes, reference counts and the LRU free queue.

Modelled on vllm/v1/core/block_pool.py (0.32.0): ``BlockPool.get_new_blocks`` pops the head of the
free queue and evicts the block's hash if it had one (``_maybe_evict_cached_block``);
``BlockPool.free_blocks`` puts blocks whose reference count reaches 0 back: unhashed ones at the
head (evicted first), hashed ones at the tail (evicted last, so the queue is the LRU order);
``BlockPool.touch`` takes a hit block held by nobody out of the free queue. Block 0 is the null
block (``BlockPool.__init__``: ``self.null_block = self.free_block_queue.popleft()``), never free.

A block's hash stands for vLLM's chained hash of (parent hash, the block's token ids): two blocks
have the same key exactly when every token up to the block's end is the same, so the simulator
names a key by what decides that (a shared-prefix group and block index, or a request and index).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Sequence

# A free-queue entry is (stamp << _SHIFT) | block: taking a block out of the middle of the queue
# (touch) only makes its entry stale, so every queue operation is O(1) (vLLM uses a doubly linked
# list, FreeKVCacheBlockQueue, for the same reason); stale entries are dropped when met or compacted.
_SHIFT = 32
_MASK = (1 << _SHIFT) - 1


class BlockPool:
    """Free queue, hash table and reference counts of ``num_blocks`` blocks (block 0 is the null block)."""

    __slots__ = ("cached", "caching", "in_free", "key", "nfree", "num_blocks", "queue", "ref", "releases", "stamp")

    def __init__(self, num_blocks: int, caching: bool) -> None:
        if num_blocks < 2:
            raise ValueError(f"a pool needs at least 2 blocks (one is vLLM's null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.caching = caching
        self.releases = 0  # bumped whenever blocks come back: a refused admission can only change then
        self.ref = [0] * num_blocks
        self.key: list[Hashable | None] = [None] * num_blocks
        self.cached: dict[Hashable, int] = {}
        self.stamp = [0] * num_blocks
        self.in_free = [True] * num_blocks
        self.in_free[0] = False
        self.queue: deque[int] = deque(range(1, num_blocks))
        self.nfree = num_blocks - 1

    def num_free(self) -> int:
        """Free blocks, including cached blocks nobody holds (they are evictable): get_num_free_blocks."""
        return self.nfree

    def usage(self) -> float:
        """vLLM's kv_cache_usage_perc: 1 - free / (num_gpu_blocks - 1) (block_pool.py get_usage)."""
        return 1.0 - self.nfree / (self.num_blocks - 1)

    def free_order(self) -> list[int]:
        """The free queue from head (evicted first) to tail."""
        stamp, in_free = self.stamp, self.in_free
        return [e & _MASK for e in self.queue if in_free[e & _MASK] and stamp[e & _MASK] == e >> _SHIFT]

    def take(self, n: int) -> list[int]:
        """``n`` blocks from the head of the free queue, their old hashes evicted (get_new_blocks)."""
        queue, stamp, in_free, key, ref, cached = self.queue, self.stamp, self.in_free, self.key, self.ref, self.cached
        popleft = queue.popleft
        out: list[int] = []
        append = out.append
        left = n
        while left:
            e = popleft()
            b = e & _MASK
            if not in_free[b] or stamp[b] != e >> _SHIFT:
                continue  # a stale entry (the block was touched, or queued again since)
            in_free[b] = False
            k = key[b]
            if k is not None:
                # key[b] is set only for the block that owns the entry (set_key), so this is it.
                del cached[k]
                key[b] = None
            ref[b] = 1
            append(b)
            left -= 1
        self.nfree -= n
        return out

    def touch(self, blocks: Sequence[int]) -> None:
        """A prefix hit: take blocks nobody holds out of the free queue, count one more holder."""
        ref, in_free = self.ref, self.in_free
        for b in blocks:
            if ref[b] == 0:
                in_free[b] = False
                self.nfree -= 1
            ref[b] += 1

    def release(self, blocks_in_eviction_order: Iterable[int]) -> None:
        """free_blocks: unhashed blocks to the head (evicted first), hashed to the tail (LRU)."""
        self.releases += 1
        queue, ref, key, stamp, in_free = self.queue, self.ref, self.key, self.stamp, self.in_free
        caching = self.caching
        append = queue.append
        first: list[int] = []
        freed = 0
        for b in blocks_in_eviction_order:
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                freed += 1
                in_free[b] = True
                st = stamp[b] + 1
                stamp[b] = st
                if key[b] is None or not caching:
                    first.append(b)
                else:
                    append((st << _SHIFT) | b)
        self.nfree += freed
        # FreeKVCacheBlockQueue.prepend_n keeps the list's order at the front.
        for b in reversed(first):
            queue.appendleft((stamp[b] << _SHIFT) | b)
        if len(queue) > 2 * self.nfree + 4096:
            self.queue = deque(e for e in queue if in_free[e & _MASK] and stamp[e & _MASK] == e >> _SHIFT)

    def lookup(self, keys: Iterable[Hashable]) -> list[int]:
        """The longest chain of cached blocks for ``keys`` (find_longest_cache_hit), in order."""
        hit: list[int] = []
        cached = self.cached
        for k in keys:
            b = cached.get(k)
            if b is None:
                break
            hit.append(b)
        return hit

    def evictable(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` sit in the free queue (a hit on them still uses a free block)."""
        ref = self.ref
        return sum(1 for b in blocks if ref[b] == 0)

    def set_key(self, block: int, k: Hashable) -> None:
        """cache_full_blocks: a full block gets its hash.

        When another block already holds the same hash (a request that recomputed a block whose
        chain was cut earlier), vLLM keeps both in its table; here the newcomer stays unhashed, so it
        is evicted first instead of last: the cached copy serves every later hit either way.
        """
        if not self.caching or k in self.cached:
            return
        self.key[block] = k
        self.cached[k] = block
