"""Reference Transformers built from the planner's ModelSpec (Llama-style, GPT-2 style, MoE)."""

from meshplan.runtime.models.transformer import Transformer, build_model

__all__ = ["Transformer", "build_model"]
