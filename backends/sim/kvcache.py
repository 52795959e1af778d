"""The simulated engine's KV memory: fixed-size blocks, and a prefix cache over them, as in
vLLM V1's ``KVCacheManager`` with automatic prefix caching.

Memory is ``num_blocks`` blocks of ``block_size`` tokens. A running sequence holds the blocks
its computed tokens (and the tokens it is about to compute) need; nothing else may take them.
A block filled with computed tokens gets its *block hash*, a chain over the sequence's
content where each block's hash includes its parent's (``backends/sim/prefix.py``), and is
kept in the cache under it: a later sequence whose content starts the same way finds the
longest chain of its block hashes that is cached, holds those blocks too (one physical block,
several holders) and skips computing their tokens. A finished or preempted sequence releases
its blocks: a hashed block that nobody holds any more stays cached but becomes *free*, in a
least-recently-released order (a sequence's blocks are released last first, so its prefix
outlives its tail); a new block is taken from empty memory first and then by evicting the
oldest free cached block. Only free blocks are evicted: blocks that running sequences hold
never are.

``KVCache`` is pure bookkeeping on counts and hashes, with no knowledge of time; the
scheduler (``backends/sim/engine.py``) decides when to look a prefix up, grow a sequence and
release it, and what to do when memory runs short (wait, or preempt).

Statistics as vLLM counts them: ``queries`` and ``hits`` in tokens, one query per lookup of a
sequence that is about to start (or restart after a preemption); ``usage`` is the share of
blocks not free (vLLM's ``kv_cache_usage_perc``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from backends.sim.config import DEFAULT_BLOCK_SIZE


@dataclass(slots=True, eq=False)
class BlockTable:
    """The blocks one sequence holds: ``held`` in all, of which ``shared`` are hashed (in
    the order they were taken: the sequence's prefix first). ``hashes`` is the chain of its
    content's block hashes, known in advance; ``registered`` how many of them it has walked
    (found cached or filled and hashed itself)."""

    hashes: tuple[int, ...] = ()
    held: int = 0
    shared: list[int] = field(default_factory=list)
    registered: int = 0


@dataclass(slots=True)
class CacheStats:
    """Cumulative prefix-cache counts, in tokens, and preemptions."""

    queries: int = 0
    hits: int = 0
    preemptions: int = 0


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that ``tokens`` tokens fill, the last one partly."""
    return -(-tokens // block_size)


class KVCache:
    """KV memory of ``num_blocks`` blocks of ``block_size`` tokens, with a prefix cache when
    ``caching`` (see the module docstring)."""

    def __init__(
        self, num_blocks: int, *, block_size: int = DEFAULT_BLOCK_SIZE, caching: bool = True
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be at least 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.stats = CacheStats()
        self._held: dict[int, int] = {}  # hashed blocks some sequence holds -> holders
        self._free: OrderedDict[int, None] = OrderedDict()  # free cached blocks, oldest first
        self._private = 0  # held blocks without a hash (partly filled, or caching off)

    @property
    def used_blocks(self) -> int:
        """Blocks running sequences hold."""
        return self._private + len(self._held)

    @property
    def free_blocks(self) -> int:
        """Blocks a sequence could take: empty ones and free cached ones (evictable)."""
        return self.num_blocks - self.used_blocks

    @property
    def cached_blocks(self) -> int:
        """Blocks that hold a hashed prefix, held or free."""
        return len(self._held) + len(self._free)

    @property
    def usage(self) -> float:
        """Share of the blocks that running sequences hold, 0..1."""
        return self.used_blocks / self.num_blocks

    def cached_prefix(self, hashes: tuple[int, ...], tokens: int) -> int:
        """Tokens of a sequence of ``tokens`` tokens whose blocks are cached now, in whole
        blocks: the longest cached chain of ``hashes``, short of its last token (that one is
        always computed, so that the step has a token to sample from). Changes nothing."""
        return self._hit_blocks(hashes, tokens)[0] * self.block_size

    def _hit_blocks(self, hashes: tuple[int, ...], tokens: int) -> tuple[int, int]:
        """Cached leading blocks of ``hashes`` and how many of those are free."""
        if not self.caching:
            return 0, 0
        limit = min(len(hashes), (tokens - 1) // self.block_size)
        hits = free = 0
        for h in hashes[:limit]:
            if h in self._held:
                hits += 1
            elif h in self._free:
                hits += 1
                free += 1
            else:
                break
        return hits, free

    def start(
        self, table: BlockTable, tokens: int, budget: int | None, *, count: bool = True
    ) -> int | None:
        """Start (or restart) a sequence of ``tokens`` tokens whose first step computes up to
        ``budget`` of them after its cached prefix (None: all): take its cached blocks and
        the blocks that step needs. Returns the cached tokens, or None (nothing taken) when
        memory is short. Counts one query of ``tokens`` tokens and its hits, as vLLM does,
        when it starts and ``count`` (vLLM keeps a preempted request's restart out of them).
        """
        hits, free_hits = self._hit_blocks(table.hashes, tokens)
        cached = hits * self.block_size
        first = tokens - cached if budget is None else min(tokens - cached, budget)
        need = blocks_for(cached + first, self.block_size) - hits
        if need + free_hits > self.free_blocks:
            return None
        if self.caching and count:
            self.stats.queries += tokens
            self.stats.hits += cached
        for h in table.hashes[:hits]:
            self._take(h)
            table.shared.append(h)
        table.held = hits
        table.registered = hits
        self._allocate(table, need)
        return cached

    def grow(self, table: BlockTable, tokens: int) -> bool:
        """Make ``table`` hold the blocks ``tokens`` tokens need; False (nothing taken)
        when memory is short."""
        need = blocks_for(tokens, self.block_size) - table.held
        if need <= 0:
            return True
        if need > self.free_blocks:
            return False
        self._allocate(table, need)
        return True

    def commit(self, table: BlockTable, computed: int) -> None:
        """``computed`` tokens of the sequence are in its blocks: hash the blocks they fill.

        A block whose hash another holder registered first stays private (vLLM keeps the
        duplicate out of the cache)."""
        if not self.caching:
            return
        full = min(computed // self.block_size, len(table.hashes), table.held)
        while table.registered < full:
            h = table.hashes[table.registered]
            table.registered += 1
            if h in self._held:
                continue
            self._free.pop(h, None)  # an older copy nobody held: this one replaces it
            self._held[h] = 1
            self._private -= 1
            table.shared.append(h)

    def release(self, table: BlockTable) -> None:
        """Give back every block of ``table``: hashed ones stay cached, free, last block
        first (so the prefix is evicted last)."""
        self._private -= table.held - len(table.shared)
        for h in reversed(table.shared):
            holders = self._held[h] - 1
            if holders:
                self._held[h] = holders
            else:
                del self._held[h]
                self._free[h] = None
        table.shared.clear()
        table.held = 0
        table.registered = 0

    def _take(self, h: int) -> None:
        if h in self._held:
            self._held[h] += 1
        else:
            del self._free[h]
            self._held[h] = 1

    def _allocate(self, table: BlockTable, need: int) -> None:
        """Take ``need`` blocks: empty ones first, then by evicting the oldest free cached."""
        empty = self.free_blocks - len(self._free)
        for _ in range(max(need - empty, 0)):
            self._free.popitem(last=False)
        self._private += need
        table.held += need
