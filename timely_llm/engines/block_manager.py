"""KV blocks with prefix caching, as the simulator models them.

Every full block is identified by a hash chained over the blocks up to its end, so
two contexts sharing a prefix share its blocks. A block nobody uses keeps its hash
and stays cached until a new allocation takes it (least recently freed first):
that is how a suspended generation finds its KV again on resume, or pays to
recompute what memory pressure evicted.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable

CHAIN_CACHE = 4096
"""Token sequences whose block hashes ``blocks_to_allocate`` remembers (prompts recur)."""


class OutOfBlocks(Exception):
    pass


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref = [0] * num_blocks
        self._hash_of: list[int | None] = [None] * num_blocks
        self._block_of_hash: dict[int, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.tables: dict[str, list[int]] = {}
        self._lengths: dict[str, int] = {}
        self._last_hash: dict[str, int] = {}
        """Hash of the owner's last full block (0 before the first)."""
        self._partial: dict[str, list[int]] = {}
        """Tokens of the owner's block being filled."""
        self._chains: OrderedDict[tuple[int, ...], list[int]] = OrderedDict()

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self, owner: str, token_ids: list[int]) -> int:
        """Give ``owner`` blocks for ``token_ids``; return how many tokens were cache hits."""
        if owner in self.tables:
            raise ValueError(f"{owner} already holds blocks")
        hits = self._cached_prefix(token_ids)
        if self.blocks_for(len(token_ids)) - len(hits) > len(self._free) - self._free_among(hits):
            raise OutOfBlocks(owner)
        table: list[int] = []
        for block in hits:
            self._take(block)
            table.append(block)
        self.tables[owner] = table
        self._lengths[owner] = len(hits) * self.block_size
        self._last_hash[owner] = (self._hash_of[hits[-1]] or 0) if hits else 0  # a hit block has its hash
        self._partial[owner] = []
        self.append(owner, token_ids[len(hits) * self.block_size:])
        return len(hits) * self.block_size

    def append(self, owner: str, token_ids: list[int]) -> None:
        """Extend ``owner``'s context; registers each block's hash as it fills. Raises OutOfBlocks, with nothing
        appended, when the free blocks are too few for all of ``token_ids``."""
        table = self.tables[owner]
        if self.blocks_for(self._lengths[owner] + len(token_ids)) - len(table) > len(self._free):
            raise OutOfBlocks(owner)
        for token in token_ids:
            length = self._lengths[owner]
            if length % self.block_size == 0:
                if not self._free:
                    raise OutOfBlocks(owner)
                block = next(iter(self._free))
                self._evict(block)
                self._take(block)
                table.append(block)
            partial = self._partial[owner]
            partial.append(token)
            self._lengths[owner] = length + 1
            if len(partial) == self.block_size:
                self._last_hash[owner] = hash((self._last_hash[owner], tuple(partial)))
                partial.clear()
                self._register(table[-1], self._last_hash[owner])

    def blocks_to_allocate(self, token_ids: list[int], freed: frozenset[int] = frozenset()) -> int:
        """Free blocks ``allocate`` would take for ``token_ids`` now (cached idle blocks count, held ones not),
        or once the blocks ``freed`` are free."""
        hits = []
        for h in self._chain(token_ids):
            block = self._block_of_hash.get(h)
            if block is None or self._hash_of[block] != h:
                break
            hits.append(block)
        return self.blocks_for(len(token_ids)) - len(hits) + sum(1 for b in hits if b in self._free or b in freed)

    def _chain(self, token_ids: list[int]) -> list[int]:
        """The chained hashes of ``token_ids``' full blocks, remembered for the sequences seen last."""
        key = tuple(token_ids)
        chain = self._chains.get(key)
        if chain is None:
            chain, h = [], 0
            for start in range(0, len(key) - self.block_size + 1, self.block_size):
                h = hash((h, key[start:start + self.block_size]))
                chain.append(h)
            self._chains[key] = chain
            if len(self._chains) > CHAIN_CACHE:
                self._chains.popitem(last=False)
        return chain

    def held(self, owner: str) -> int:
        """Blocks only ``owner`` holds: what releasing it would free."""
        return sum(1 for block in self.tables.get(owner, []) if self._ref[block] == 1)

    def free_after(self, released: Iterable[str], counted: Iterable[str]) -> tuple[int, frozenset[int]]:
        """Once ``released`` are released: the free blocks plus those only one of ``counted`` then holds,
        and the blocks the release frees."""
        dropped = Counter(block for owner in released for block in self.tables.get(owner, []))
        freed = frozenset(block for block, n in dropped.items() if self._ref[block] == n)
        held = sum(1 for owner in counted for block in self.tables.get(owner, [])
                   if self._ref[block] - dropped[block] == 1)
        return len(self._free) + len(freed) + held, freed

    def release(self, owner: str) -> None:
        for block in self.tables.pop(owner, []):
            self._ref[block] -= 1
            if self._ref[block] == 0:
                self._free[block] = None  # most recently freed: evicted last
        self._lengths.pop(owner, None)
        self._last_hash.pop(owner, None)
        self._partial.pop(owner, None)

    def _cached_prefix(self, token_ids: list[int]) -> list[int]:
        hits, h = [], 0
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            h = hash((h, tuple(token_ids[start:start + self.block_size])))
            block = self._block_of_hash.get(h)
            if block is None or self._hash_of[block] != h:
                break
            hits.append(block)
        return hits

    def _free_among(self, blocks: list[int]) -> int:
        return sum(1 for b in blocks if b in self._free)

    def _take(self, block: int) -> None:
        self._free.pop(block, None)
        self._ref[block] += 1

    def _evict(self, block: int) -> None:
        old = self._hash_of[block]
        if old is not None and self._block_of_hash.get(old) == block:
            del self._block_of_hash[old]
        self._hash_of[block] = None

    def _register(self, block: int, h: int) -> None:
        self._hash_of[block] = h
        self._block_of_hash.setdefault(h, block)
