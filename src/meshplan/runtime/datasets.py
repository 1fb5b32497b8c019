"""Tokenised training data: documents from jsonl / parquet / text / a saved ``datasets`` directory,
a local Hugging Face tokenizer, packing, a held-out split, and a seeded, resumable order.

Packing (as GPT-style pre-training does, Radford et al. 2019, Sec. 2.3, and Brown et al. 2020,
App. B): every document's tokens followed by the EOS token are concatenated, then cut into
sequences of S+1 tokens (inputs and shifted targets); the tail shorter than S+1 is dropped. The
last ``eval_fraction`` of the sequences is held out for the eval loss.

Order: epoch e visits the training sequences in ``randperm(n)`` drawn from a generator seeded by
(seed, e). Step t (1-based) takes the global positions (t-1)*B .. t*B-1 of that endless order, so
the batch of a step depends on (seed, step) only: a resumed run reads exactly what the
uninterrupted one would. Every rank builds the same global batch and keeps its rows
(runtime/data.py local_microbatches: the data-parallel sharding).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from meshplan.errors import MeshplanError

TEXT_FIELD = "text"
"""Column / key holding a document's text (the convention of Hugging Face text datasets)."""
EPOCH_SEED_STRIDE = 1_000_003
"""Mixes (seed, epoch) into one generator seed; prime, as runtime/data.py's (seed, step)."""


def read_documents(path: str | Path) -> list[str]:
    """Documents of a .jsonl / .json (one object per line), .parquet, .txt file, or a directory
    written by ``datasets.Dataset.save_to_disk`` (Arrow stream files)."""
    p = Path(path)
    if p.is_dir():
        arrows = sorted(p.glob("*.arrow"))
        if not arrows:
            raise MeshplanError(f"{p}: no .arrow files (not a saved `datasets` directory)")
        import pyarrow as pa

        docs: list[str] = []
        for f in arrows:
            with pa.memory_map(str(f)) as src:
                docs.extend(_column(pa.ipc.open_stream(src).read_all(), f))
        return docs
    if not p.is_file():
        raise MeshplanError(f"{p}: no such data file or directory")
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return _jsonl(p)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return _column(pq.read_table(p, columns=None), p)
    if suffix in (".txt", ".text", ".md"):
        return [p.read_text(encoding="utf-8", errors="replace")]
    raise MeshplanError(f"{p}: unknown data format {suffix!r} (.jsonl, .parquet, .txt or a datasets directory)")


def _jsonl(p: Path) -> list[str]:
    docs = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise MeshplanError(f"{p}:{n}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get(TEXT_FIELD), str):
            raise MeshplanError(f"{p}:{n}: no string field {TEXT_FIELD!r}")
        docs.append(obj[TEXT_FIELD])
    return docs


def _column(table, where: Path) -> list[str]:
    if TEXT_FIELD not in table.column_names:
        raise MeshplanError(f"{where}: no column {TEXT_FIELD!r} (columns: {', '.join(table.column_names)})")
    return [t for t in table.column(TEXT_FIELD).to_pylist() if t is not None]


@dataclass(frozen=True, kw_only=True)
class Tokenizer:
    """A local ``tokenizer.json`` (the ``tokenizers`` library) and the id appended after each document."""

    path: Path
    eos_id: int | None

    @classmethod
    def load(cls, directory: str | Path) -> "Tokenizer":
        d = Path(directory)
        f = d / "tokenizer.json" if d.is_dir() else d
        if not f.is_file():
            raise MeshplanError(f"{directory}: no tokenizer.json")
        tok = _backend(f)
        eos = None
        cfg = d / "tokenizer_config.json" if d.is_dir() else None
        if cfg is not None and cfg.is_file():
            name = json.loads(cfg.read_text()).get("eos_token")
            name = name.get("content") if isinstance(name, dict) else name
            eos = tok.token_to_id(name) if name else None
        return cls(path=f, eos_id=eos)

    def encode(self, docs: list[str]) -> list[list[int]]:
        tok = _backend(self.path)
        return [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]


def _backend(path: Path):
    from tokenizers import Tokenizer as HFTokenizer

    try:
        return HFTokenizer.from_file(str(path))
    except Exception as exc:  # the Rust library raises its own exception type
        raise MeshplanError(f"{path}: not a tokenizers file ({str(exc).splitlines()[0]})") from None


def pack(token_lists: list[list[int]], seq_len: int, eos_id: int | None) -> torch.Tensor:
    """(n, seq_len + 1) sequences of the documents' tokens, each followed by ``eos_id``."""
    flat: list[int] = []
    for ids in token_lists:
        flat.extend(ids)
        if eos_id is not None:
            flat.append(eos_id)
    n = len(flat) // (seq_len + 1)
    return torch.tensor(flat[:n * (seq_len + 1)], dtype=torch.long).view(n, seq_len + 1)


@dataclass(frozen=True, kw_only=True)
class PackedSource:
    """Training and held-out sequences; ``batch(step)`` as runtime/data.py's BatchSource."""

    train: torch.Tensor
    """(n_train, S+1) packed sequences."""
    held_out: torch.Tensor
    """(n_eval, S+1) sequences never trained on."""
    global_batch: int
    seed: int

    def positions(self, step: int) -> list[tuple[int, int]]:
        """(epoch, index in that epoch) of the global batch of step ``step`` (1-based)."""
        n, B = self.train.shape[0], self.global_batch
        return [divmod(p, n) for p in range((step - 1) * B, step * B)]

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        perms: dict[int, torch.Tensor] = {}
        for epoch, i in self.positions(step):
            if epoch not in perms:
                g = torch.Generator().manual_seed(self.seed * EPOCH_SEED_STRIDE + epoch)
                perms[epoch] = torch.randperm(self.train.shape[0], generator=g)
            rows.append(self.train[perms[epoch][i]])
        seq = torch.stack(rows)
        return seq[:, :-1], seq[:, 1:]

    def eval_batches(self, max_batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Up to ``max_batches`` full global batches of held-out sequences, in order."""
        B = self.global_batch
        n = min(max_batches, self.held_out.shape[0] // B)
        return [(self.held_out[k * B:(k + 1) * B, :-1], self.held_out[k * B:(k + 1) * B, 1:]) for k in range(n)]


def load_packed(data: str | Path, tokenizer_dir: str | Path, *, seq_len: int, global_batch: int,
                vocab_size: int, seed: int, eval_fraction: float) -> PackedSource:
    """Read, tokenise, pack and split; refuses data too small for one batch or ids beyond the vocab."""
    if not 0.0 <= eval_fraction < 1.0:
        raise MeshplanError(f"--eval-fraction must be in [0, 1), got {eval_fraction}")
    tok = Tokenizer.load(tokenizer_dir)
    seqs = pack(tok.encode(read_documents(data)), seq_len, tok.eos_id)
    if seqs.numel() and int(seqs.max()) >= vocab_size:
        raise MeshplanError(f"{tokenizer_dir}: token id {int(seqs.max())} does not fit the model's "
                            f"vocabulary of {vocab_size}")
    n_eval = round(eval_fraction * seqs.shape[0])
    if eval_fraction > 0 and n_eval < global_batch:
        n_eval = global_batch  # at least one held-out batch when an eval split is asked for
    train = seqs[:seqs.shape[0] - n_eval]
    if train.shape[0] < global_batch:
        raise MeshplanError(f"{data}: {seqs.shape[0]} sequences of {seq_len + 1} tokens leave "
                            f"{train.shape[0]} to train on, fewer than one batch of {global_batch}")
    return PackedSource(train=train, held_out=seqs[train.shape[0]:], global_batch=global_batch, seed=seed)
