"""One Transformer family for every preset: Llama-style, GPT-2 style, MoE (with shared experts and
leading dense layers) and multi-head latent attention (DeepSeek-V3 style) decoders.

Attributes are fixed by the runtime/pipeline contract: ``tok_embeddings``, ``pos_embeddings``,
``layers`` (a ModuleDict keyed "0".."L-1", so deleting layers for a pipeline stage keeps the
parameter names stable, as in torchtitan), ``norm`` and ``output``; any of them but ``layers``
may be None on a pipeline stage. Build on the meta device, parallelise, then ``init_weights``.
"""

from __future__ import annotations

import torch
from torch import nn

from meshplan.errors import MeshplanError
from meshplan.runtime.models.init import init_parameters
from meshplan.runtime.models.layers import MLP, Attention, make_norm
from meshplan.runtime.models.mla import LatentAttention
from meshplan.runtime.models.moe import MoE
from meshplan.spec.model import Arch, ModelSpec, Position


class TransformerBlock(nn.Module):
    """Pre-norm block: h = x + attn(norm(x)); out = h + mlp(norm(h))."""

    def __init__(self, spec: ModelSpec, layer_id: int) -> None:
        super().__init__()
        self.attention_norm = make_norm(spec)
        self.attention = LatentAttention(spec) if spec.is_mla else Attention(spec)
        self.ffn_norm = make_norm(spec)
        if spec.is_moe and layer_id >= spec.moe_dense_layers:
            self.moe: MoE | None = MoE(spec)
            self.feed_forward: MLP | None = None
        else:
            self.moe = None
            self.feed_forward = MLP(spec.hidden_size, spec.ffn_hidden_size, spec.gated_mlp, spec.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        ffn = self.moe if self.moe is not None else self.feed_forward
        return h + ffn(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        if spec.arch != Arch.DECODER:
            raise MeshplanError(f"the runtime trains decoder models only; {spec.name} is {spec.arch.value}")
        self.spec = spec
        D = spec.hidden_size
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(spec.vocab_size, D)
        self.pos_embeddings: nn.Embedding | None = (
            nn.Embedding(spec.max_position, D) if spec.position == Position.LEARNED else None)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(spec, i) for i in range(spec.num_layers)})
        self.norm: nn.Module | None = make_norm(spec)
        self.output: nn.Linear | None = nn.Linear(D, spec.vocab_size, bias=False)
        if spec.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: token ids (B, S) if tok_embeddings else hidden (B, S, D) -> logits (B, S, V) or hidden."""
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        if self.pos_embeddings is not None:
            positions = torch.arange(h.shape[1], device=h.device)
            h = h + self.pos_embeddings(positions)  # (S, D) broadcast over B
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Deterministic: every parameter gets the values one process would give it, on any shard."""
        init_parameters(self, seed, tied_embeddings=self.spec.tied_embeddings)


def build_model(spec: ModelSpec, device: str | torch.device = "meta") -> Transformer:
    with torch.device(device):
        return Transformer(spec)
