"""Tiny Hugging Face models and a tokenizer made locally (random init, save_pretrained): no hub."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = ("the cat sat on a mat while dogs ran in parks and birds sang over trees near rivers "
         "where fish swim under bridges built by people long ago").split()


def corpus_lines(n: int, seed: int = 0) -> list[str]:
    """``n`` runs of consecutive words of WORDS (cyclic) from random starts: the next word is
    predictable, so a few steps visibly lower the loss (deterministic)."""
    import random

    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        start, length = rng.randrange(len(WORDS)), rng.randint(6, 30)
        lines.append(" ".join(WORDS[(start + k) % len(WORDS)] for k in range(length)))
    return lines


def make_tokenizer(out: Path) -> int:
    """A word-level tokenizer trained on the corpus, saved as tokenizer.json; returns its vocab size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus_lines(200), trainers.WordLevelTrainer(special_tokens=["<unk>", "</s>"]))
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return tok.get_vocab_size()


def make_llama(out: Path, vocab: int = 64, *, shard_bytes: str = "20KB", seed: int = 0, **overrides) -> None:
    """A 2-layer Llama (4 q heads, 2 kv heads, head_dim 8) in fp32, saved in several safetensors shards."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
    kw.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**kw))
    model.save_pretrained(out, max_shard_size=shard_bytes)


def write_jsonl(path: Path, n: int, seed: int = 1) -> None:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus_lines(n, seed)))


def make_mixtral(out: Path, vocab: int = 64, seed: int = 0) -> None:
    """A 2-layer Mixtral (4 experts, top-2) shaped like make_llama's model, one safetensors file."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    MixtralForCausalLM(MixtralConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False, num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
    )).save_pretrained(out)
