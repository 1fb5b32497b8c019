"""``meshplan export-weights CKPT --to hf OUT``: a sharded training checkpoint -> a Hugging Face
model directory (config.json, safetensors shards and their index) that ``transformers`` loads.

The checkpoint's model tensors are read in one process (DCP ``no_dist``: every chunk each rank
wrote, assembled to full tensors), renamed and re-laid out by the table in meshplan/hf_names.py
(the inverse of --init-from), and written in shards of at most ``max_shard_bytes``.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from meshplan import ckpt_meta
from meshplan.errors import MeshplanError
from meshplan.hf_names import Source, family_of, name_map, rope_row
from meshplan.runtime.hf_weights import INDEX_FILE
from meshplan.runtime.models.layers import NORM_EPS, ROPE_THETA
from meshplan.spec.model import ModelSpec

MODEL_PREFIX = "model."
"""Group of the model's tensors in a checkpoint's state dict (runtime/checkpoint.py)."""
DEFAULT_SHARD_BYTES = 5 * 1024**3
"""transformers' own default max_shard_size ("5GB")."""
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM", "gpt2": "GPT2LMHeadModel"}


def read_model_tensors(ckpt: Path) -> dict[str, torch.Tensor]:
    """Canonical name -> full tensor of every model tensor in checkpoint ``ckpt``, in one process."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        reader = dcp.FileSystemReader(ckpt)
        meta = reader.read_metadata().state_dict_metadata
        want = {k[len(MODEL_PREFIX):]: torch.empty(m.size, dtype=m.properties.dtype)
                for k, m in meta.items() if k.startswith(MODEL_PREFIX) and isinstance(m, TensorStorageMetadata)}
        state = {"model": want}
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, storage_reader=reader, no_dist=True)
    except Exception as exc:  # noqa: BLE001 - DCP's unpickler and readers raise many types on a damaged file
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise MeshplanError(f"{ckpt}: cannot read the checkpoint's tensors (damaged or not a DCP checkpoint: "
                            f"{type(exc).__name__}{': ' + detail if detail else ''})") from None
    return state["model"]


def to_hf_tensors(canonical: dict[str, torch.Tensor], spec: ModelSpec, family: str) -> dict[str, torch.Tensor]:
    """HF name -> tensor, inverting each Source of the mapping table."""
    sources = name_map(spec, family)
    fused: dict[str, list[tuple[int, Source, torch.Tensor]]] = {}
    out: dict[str, torch.Tensor] = {}
    for name, src in sources.items():
        if name not in canonical:
            raise MeshplanError(f"the checkpoint has no tensor {name}")
        t = canonical[name]
        if src.rope_head_dim:  # canonical row r is HF row rope_row(r)
            inv = torch.empty(t.shape[0], dtype=torch.long)
            inv[torch.tensor([rope_row(r, src.rope_head_dim) for r in range(t.shape[0])])] = torch.arange(t.shape[0])
            t = t[inv]
        if src.num_experts:
            for e in range(src.num_experts):
                out[src.key.format(e=e)] = (t[e].T if src.transpose else t[e]).contiguous()
            continue
        if src.transpose:
            t = t.T
        fused.setdefault(src.key, []).append((src.out_offset, src, t.contiguous()))
    for key, parts in fused.items():
        parts.sort(key=lambda x: x[0])
        dim = 1 if parts[0][1].transpose else 0  # the HF output dimension
        out[key] = torch.cat([p[2] for p in parts], dim=dim) if len(parts) > 1 else parts[0][2]
    return out


def hf_config(spec: ModelSpec, family: str, dtype: torch.dtype) -> dict:
    """config.json for ``spec`` in ``family``'s field names (the runtime's fixed numerics included)."""
    dtype_name = str(dtype).removeprefix("torch.")
    if family == "gpt2":
        return {"architectures": [_ARCHITECTURES[family]], "model_type": "gpt2", "n_embd": spec.hidden_size,
                "n_layer": spec.num_layers, "n_head": spec.num_heads, "n_inner": spec.ffn_hidden_size,
                "n_positions": spec.max_position, "vocab_size": spec.vocab_size,
                "layer_norm_epsilon": NORM_EPS, "activation_function": "gelu_new",
                "tie_word_embeddings": spec.tied_embeddings, "dtype": dtype_name}
    cfg = {"architectures": [_ARCHITECTURES[family]], "model_type": family, "hidden_size": spec.hidden_size,
           "intermediate_size": spec.ffn_hidden_size, "num_hidden_layers": spec.num_layers,
           "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
           "head_dim": spec.head_dim, "vocab_size": spec.vocab_size,
           "max_position_embeddings": spec.max_position, "rms_norm_eps": NORM_EPS, "rope_theta": ROPE_THETA,
           "hidden_act": "silu", "tie_word_embeddings": spec.tied_embeddings, "dtype": dtype_name}
    if family in ("llama",):
        cfg.update(attention_bias=spec.attn_bias, mlp_bias=spec.mlp_bias)
    if family == "mixtral":
        cfg.update(num_local_experts=spec.moe_num_experts, num_experts_per_tok=spec.moe_top_k)
    if family in ("mistral", "mixtral", "qwen2", "qwen3"):
        cfg.update(sliding_window=None, use_sliding_window=False)
    return cfg


def write_hf_dir(tensors: dict[str, torch.Tensor], config: dict, out: Path, max_shard_bytes: int) -> int:
    """Write config.json, the shards and (for more than one) the index; returns the shard count."""
    from safetensors.torch import save_file

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key in sorted(tensors):
        nbytes = tensors[key].numel() * tensors[key].element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensors[key]
        size += nbytes
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    n = len(shards)
    if n == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        return 1
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        fname = f"model-{i:05d}-of-{n:05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (out / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                             indent=2) + "\n")
    return n


def export_hf(ckpt_dir: str | Path, out: str | Path, *, family: str | None = None,
              max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> dict:
    """Export the checkpoint (or the latest under a root) to ``out``; returns what was written."""
    ckpt, meta = ckpt_meta.load_meta(ckpt_dir)
    spec = meta.job.model
    fam = family_of(spec, family)
    canonical = read_model_tensors(ckpt)
    tensors = to_hf_tensors(canonical, spec, fam)
    dtype = next(iter(tensors.values())).dtype
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise MeshplanError(f"{out}: exists and is not empty")
    shards = write_hf_dir(tensors, hf_config(spec, fam, dtype), out, max_shard_bytes)
    return {"checkpoint": str(ckpt), "step": meta.step, "family": fam, "out": str(out),
            "tensors": len(tensors), "shards": shards,
            "bytes": sum(t.numel() * t.element_size() for t in tensors.values())}
