"""Training data: synthetic tokens or a local text file through a byte-level tokenizer.

Every rank draws the same global batch for a step (a generator seeded by (seed, step)) and keeps
its share: rows by data-parallel rank, then micro-batches, then (with context parallel) a
contiguous chunk of the sequence. One process and any layout therefore see the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from meshplan.errors import MeshplanError

BYTE_VOCAB = 256
"""Byte-level tokenizer: token id = UTF-8 byte value."""


def encode_bytes(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


def load_text_tokens(path: str | Path, vocab_size: int, seq_len: int) -> torch.Tensor:
    """The whole file as byte tokens (1-D long tensor); refuses a vocab or file that cannot fit."""
    if vocab_size < BYTE_VOCAB:
        raise MeshplanError(f"--data needs vocab_size >= {BYTE_VOCAB} (byte tokenizer), got {vocab_size}")
    p = Path(path)
    try:
        tokens = encode_bytes(p.read_text(encoding="utf-8", errors="replace"))
    except FileNotFoundError:
        raise MeshplanError(f"{p}: no such data file") from None
    if tokens.numel() < seq_len + 2:
        raise MeshplanError(f"{p}: {tokens.numel()} bytes is shorter than one sequence of {seq_len + 1}")
    return tokens


@dataclass(frozen=True, kw_only=True)
class BatchSource:
    seq_len: int
    global_batch: int
    vocab_size: int
    seed: int
    text: torch.Tensor | None = None
    """Byte tokens of the data file, or None for synthetic uniform tokens."""

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets of the global batch, each (B, S)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        B, S = self.global_batch, self.seq_len
        if self.text is None:
            seq = torch.randint(0, self.vocab_size, (B, S + 1), generator=g)
        else:
            starts = torch.randint(0, self.text.numel() - S - 1, (B,), generator=g)
            seq = torch.stack([self.text[s:s + S + 1] for s in starts.tolist()])
        return seq[:, :-1], seq[:, 1:]


def local_microbatches(tokens: torch.Tensor, targets: torch.Tensor, *, dp_rank: int, dp: int,
                       micro_batch: int, cp_rank: int, cp: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's micro-batches: rows [dp_rank*B/dp, ...), split into micro_batch rows each,
    columns [cp_rank*S/cp, ...) of the sequence."""
    B, S = tokens.shape
    rows = B // dp
    s = S // cp
    x = tokens[dp_rank * rows:(dp_rank + 1) * rows, cp_rank * s:(cp_rank + 1) * s]
    y = targets[dp_rank * rows:(dp_rank + 1) * rows, cp_rank * s:(cp_rank + 1) * s]
    return list(zip(x.split(micro_batch), y.split(micro_batch)))
