"""The in-process engine's KV storage: one row per slot (`KVCache`), or a pool of fixed-size
blocks read through per-row block tables (`PagedKVCache`).

The decoder only asks ``locate`` and ``keys``, so one forward pass runs over either layout; a
paged row reads bit-for-bit the keys the slot layout holds. Who holds which blocks: kv_plan.py.
Design: docs/engine.md#the-kv-cache-prefix-reuse-grpo-groups-the-paged-pool
"""

from __future__ import annotations

import torch


class KVCache:
    """Per-slot storage, ``k[layer]: [slots, kv_heads, capacity, head_dim]``; grows on CPU, is
    allocated once on CUDA. One tensor per layer: under torch.compile, a write through a view
    of an input copies the whole input."""

    table: torch.Tensor | None = None  # slots: row r IS storage row r

    def __init__(
        self, n_layers: int, n_kv: int, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self._n_kv, self._head_dim = n_kv, head_dim
        self.dtype, self.device = dtype, device
        self.k = [self._zeros(0, 0) for _ in range(n_layers)]
        self.v = [self._zeros(0, 0) for _ in range(n_layers)]

    def _zeros(self, slots: int, capacity: int) -> torch.Tensor:
        shape = (slots, self._n_kv, capacity, self._head_dim)
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    @property
    def slots(self) -> int:
        return self.k[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def token_bytes(self) -> int:
        """Bytes of one position's keys and values over all layers."""
        return 2 * len(self.k) * self._n_kv * self._head_dim * torch.finfo(self.dtype).bits // 8

    def grow(self, slots: int, capacity: int) -> None:
        """Make room for at least `slots` rows of `capacity` positions; keeps the contents."""
        slots, capacity = max(slots, self.slots), max(capacity, self.capacity)
        if (slots, capacity) == (self.slots, self.capacity):
            return
        for store in (self.k, self.v):
            for i, old in enumerate(store):
                new = self._zeros(slots, capacity)
                # the old scratch cell holds garbage; copying it is harmless (never read)
                new[: old.shape[0], :, : old.shape[2]] = old
                store[i] = new

    def locate(self, rows: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(storage row, cell) of each token at ``pos`` in ``rows`` (broadcast together)."""
        return rows, pos

    def keys(self, store: torch.Tensor, rows: slice | torch.Tensor, kv_len: int) -> torch.Tensor:
        """Positions ``[0, kv_len)`` of ``rows`` of one layer's ``store`` (a view for a slice)."""
        return store[rows, :, :kv_len]

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Slot `dst`'s first `n` positions become slot `src`'s (a group sibling's prompt)."""
        for store in (self.k, self.v):
            for t in store:
                t[dst, :, :n] = t[src, :, :n]

    def sync_table(self) -> None:
        """Nothing to upload: slots have no table."""


class PagedKVCache(KVCache):
    """A pool of ``blocks`` blocks of ``block`` positions per layer, read through ``table``;
    allocated in full on CUDA (graphs need fixed addresses), doubled as needed on CPU."""

    def __init__(
        self,
        n_layers: int,
        n_kv: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        *,
        rows: int,
        max_len: int,
        blocks: int,
        block: int,
    ) -> None:
        super().__init__(n_layers, n_kv, head_dim, dtype, device)
        if block < 1 or blocks < 2:
            raise ValueError(
                f"a paged cache needs block >= 1 and blocks >= 2, got {block}, {blocks}"
            )
        self.block, self.blocks, self.max_len = block, blocks, max_len
        width = max_len // block + 1  # covers the scratch position max_len
        self.host_table = torch.zeros(rows, width, dtype=torch.int32)
        self.rows_table = self.host_table if device.type == "cpu" else self.host_table.to(device)
        self.table = self.rows_table
        self._dirty = False
        # CUDA uploads go through two pinned buffers in turn (see sync_table)
        self._stages: list[tuple[torch.Tensor, torch.cuda.Event]] = []
        start = blocks if device.type == "cuda" else min(blocks, 64)
        self.k = [self._zeros(start, block) for _ in range(n_layers)]
        self.v = [self._zeros(start, block) for _ in range(n_layers)]

    @property
    def slots(self) -> int:
        return self.host_table.shape[0]  # rows of the decode batch

    @property
    def capacity(self) -> int:
        return self.max_len + 1  # per row; the last position is the scratch position

    def grow(self, slots: int, capacity: int) -> None:
        """Rows and capacity are fixed at construction (the pool grows in `set_row`)."""

    def set_row(self, row: int, blocks: list[int]) -> None:
        """Row `row`'s table becomes `blocks`, then the scratch block (a CPU pool grows to fit)."""
        if blocks and max(blocks) >= self.k[0].shape[0]:
            self._grow_pool(max(blocks) + 1)
        line = self.host_table[row]
        line.zero_()
        if blocks:
            line[: len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        self._dirty = True

    def _grow_pool(self, need: int) -> None:
        n = self.k[0].shape[0]
        while n < need:
            n *= 2
        n = min(n, self.blocks)
        for store in (self.k, self.v):
            for i, old in enumerate(store):
                new = self._zeros(n, self.block)
                new[: old.shape[0]] = old
                store[i] = new

    def sync_table(self) -> None:
        """Upload the host table's edits in stream order, through one of two pinned buffers (a
        pageable copy could wait for the device, stalling the replay launched ahead)."""
        if not self._dirty or self.rows_table is self.host_table:
            self._dirty = False
            return
        if len(self._stages) < 2:
            self._stages.append(
                (torch.empty_like(self.host_table).pin_memory(), torch.cuda.Event())
            )
        stage, done = self._stages.pop(0)
        done.synchronize()  # two uploads ago: long done by now (a no-op before its first record)
        stage.copy_(self.host_table)
        self.rows_table.copy_(stage, non_blocking=True)
        done.record()
        self._stages.append((stage, done))
        self._dirty = False

    def locate(self, rows: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rows_table[rows, pos // self.block].long(), pos % self.block

    def keys(self, store: torch.Tensor, rows: slice | torch.Tensor, kv_len: int) -> torch.Tensor:
        n_blocks = -(-kv_len // self.block)
        table = self.rows_table[rows, :n_blocks].long()
        return gather_blocks(store, table, kv_len)

    def copy_block(self, src: int, dst: int) -> None:
        """Block `dst` becomes a copy of block `src` (copy-on-write of a shared partial block)."""
        if dst >= self.k[0].shape[0]:
            self._grow_pool(dst + 1)
        for store in (self.k, self.v):
            for t in store:
                t[dst] = t[src]

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        raise NotImplementedError("paged rows share blocks (kv_plan.PagedKV), they never copy rows")


def gather_blocks(store: torch.Tensor, table_N_B: torch.Tensor, kv_len: int) -> torch.Tensor:
    """``[n, kv_heads, kv_len, head_dim]`` from the blocks ``table_N_B`` of ``store``, in order."""
    n, nb = table_N_B.shape
    _, heads, block, dim = store.shape
    got = store[table_N_B]  # [n, nb, heads, block, dim]
    return got.transpose(1, 2).reshape(n, heads, nb * block, dim)[:, :, :kv_len]
