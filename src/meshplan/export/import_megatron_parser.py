"""The argument parser behind ``import_megatron``: which Megatron-LM (and torchrun launcher)
arguments are read, and the shell words of a command line. Every other argument is left to the
caller's ``ignored`` list (argparse's parse_known_args)."""

from __future__ import annotations

import argparse
import shlex

from meshplan.errors import MeshplanError
from meshplan.spec.training import MoeDispatcher

LEGACY_FLAGS = ("--checkpoint-activations", "--model-parallel-size", "--distribute-checkpointed-activations")
"""Spellings of Megatron-LM before Megatron-Core (2020-22: examples/sc21's scripts for Narayanan et
al. 2021) that later releases renamed (--recompute-granularity/--recompute-method, --tensor-model-
parallel-size, --distribute-saved-activations): a command line with one describes a run of that
era, which ``meshplan validate`` estimates with the ``megatron-lm`` framework's settings
(spec/presets/frameworks.json), not today's Megatron-Core's."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print usage and exit
        raise MeshplanError(f"Megatron arguments: {message}")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(add_help=False, allow_abbrev=False)
    add = p.add_argument
    for name in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
                 "--expert-model-parallel-size", "--expert-tensor-parallel-size",
                 "--num-layers-per-virtual-pipeline-stage",
                 "--num-virtual-stages-per-pipeline-rank", "--decoder-first-pipeline-num-layers",
                 "--decoder-last-pipeline-num-layers", "--micro-batch-size", "--global-batch-size",
                 "--seq-length", "--recompute-num-layers", "--num-distributed-optimizer-instances",
                 "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
                 "--num-query-groups", "--kv-channels", "--max-position-embeddings", "--vocab-size",
                 "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
                 "--moe-shared-expert-intermediate-size", "--model-parallel-size",
                 "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim",
                 "--mtp-num-layers", "--moe-latent-size", "--mamba-num-heads", "--mamba-head-dim",
                 "--mamba-state-dim", "--mamba-num-groups", "--cpu-offloading-num-layers",
                 # launcher (torchrun) options
                 "--nnodes", "--nproc-per-node", "--nproc_per_node"):
        add(name, type=int, default=None)
    for name in ("--sequence-parallel", "--use-distributed-optimizer", "--use-torch-fsdp2",
                 "--recompute-activations", "--checkpoint-activations", "--group-query-attention",
                 "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
                 "--add-qkv-bias", "--bf16", "--fp16", "--multi-latent-attention", "--qk-layernorm",
                 "--optimizer-cpu-offload", "--cpu-offloading", "--moe-enable-deepep",
                 "--moe-pad-expert-input-to-capacity", "--account-for-embedding-in-pipeline-split",
                 "--account-for-loss-in-pipeline-split", "--overlap-grad-reduce", "--overlap-param-gather"):
        add(name, action="store_true")
    add("--moe-token-dispatcher-type", choices=[d.value for d in MoeDispatcher], default=None)
    add("--moe-expert-capacity-factor", type=float, default=None)
    add("--optimizer-offload-fraction", type=float, default=None)
    add("--recompute-granularity", choices=["full", "selective"], default=None)
    add("--recompute-method", choices=["uniform", "block"], default=None)
    add("--recompute-modules", nargs="*", default=None)
    add("--cp-comm-type", nargs="+", default=None)
    add("--position-embedding-type", default=None)
    add("--normalization", default=None)
    add("--fp8-format", default=None)
    add("--fp8-recipe", default=None)
    add("--fp4-format", default=None)
    add("--fp4-recipe", default=None)
    add("--moe-layer-freq", default=None)
    add("--pipeline-model-parallel-layout", default=None)
    add("--activation-func-clamp-value", type=float, default=None)
    for name in ("--window-size", "--window-attn-skip-freq", "--softmax-type", "--hybrid-override-pattern"):
        add(name, default=None)
    return p


def split_command(text: str) -> list[str]:
    """Shell words of a (possibly multi-line, commented) Megatron command line."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    try:
        return shlex.split(text, comments=True)
    except ValueError as exc:
        raise MeshplanError(f"cannot split the Megatron command line: {exc}") from None


def launcher_size(text: str) -> tuple[int | None, int | None]:
    """(total GPUs, GPUs per node) from a torchrun prefix's --nnodes/--nproc-per-node, if present."""
    a, _ = _parser().parse_known_args(split_command(text))
    if a.nnodes and a.nproc_per_node:
        return a.nnodes * a.nproc_per_node, a.nproc_per_node
    return None, None


def legacy_flags(words: list[str]) -> tuple[str, ...]:
    """The LEGACY_FLAGS among a command line's shell words (``--flag`` or ``--flag=value``), in order."""
    given = [w.split("=", 1)[0] for w in words]
    return tuple(f for f in LEGACY_FLAGS if f in given)
