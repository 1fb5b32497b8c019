"""Layer kinds counted per run of the pattern (spec/layers.layer_kind_counts), against the layers
one by one (layer_kind), over any slice of any stack: plain, MoE with dense-first layers, sliding
windows with or without a full-attention period, hybrid patterns; and a stack of 10^9 layers is
counted at once (a per-layer loop hung ``estimate`` at 10^8, session 7)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.spec.layers import Ffn, LayerKind, Mixer, layer_kind, layer_kind_counts
from meshplan.spec.presets import model_preset


def _one_by_one(model, start, stop):
    return tuple(sorted(Counter(layer_kind(model, i) for i in range(start, stop)).items()))


@st.composite
def _slices(draw, num_layers):
    start = draw(st.integers(min_value=0, max_value=num_layers))
    return start, draw(st.integers(min_value=start, max_value=num_layers))


@settings(max_examples=200, deadline=None)
@given(data=st.data(), L=st.integers(min_value=1, max_value=40), moe=st.booleans(),
       dense_first=st.integers(min_value=0, max_value=39), window=st.sampled_from([0, 128]),
       period=st.integers(min_value=0, max_value=7))
def test_plain_stack_counts_equal_layer_by_layer(data, L, moe, dense_first, window, period):
    base = model_preset("deepseek-v3" if moe else "llama3-8b")
    m = replace(base, num_layers=L, moe_dense_layers=min(dense_first, L - 1) if moe else 0, sliding_window=window,
                full_attention_period=period if window else 0, mtp_num_layers=0)
    start, stop = data.draw(_slices(L))
    assert layer_kind_counts(m, start, stop) == _one_by_one(m, start, stop)
    assert layer_kind_counts(m) == _one_by_one(m, 0, L)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), pattern=st.text(alphabet="M*-E", min_size=1, max_size=30),
       window=st.sampled_from([0, 64]), period=st.integers(min_value=0, max_value=5))
def test_hybrid_counts_equal_layer_by_layer(data, pattern, window, period):
    m = replace(model_preset("nemotron-3-nano"), num_layers=len(pattern), hybrid_pattern=pattern,
                sliding_window=window, full_attention_period=period if window else 0)
    start, stop = data.draw(_slices(len(pattern)))
    assert layer_kind_counts(m, start, stop) == _one_by_one(m, start, stop)


def test_gpt_oss_alternation_by_hand():
    """GPT-OSS: period 2, sliding first: of layers 0..23, 12 sliding and 12 full; of 3..8, layers
    3, 5, 7 full and 4, 6, 8 sliding."""
    m = model_preset("gpt-oss-20b")
    moe = (LayerKind(Mixer.ATTENTION, Ffn.MOE, False), LayerKind(Mixer.ATTENTION, Ffn.MOE, True))
    assert layer_kind_counts(m) == ((moe[0], 12), (moe[1], 12))
    assert layer_kind_counts(m, 3, 9) == ((moe[0], 3), (moe[1], 3))


def test_a_billion_layers_count_at_once():
    m = replace(model_preset("deepseek-v3"), num_layers=10**9, sliding_window=4096, full_attention_period=3)
    t0 = time.perf_counter()
    counts = dict(layer_kind_counts(m))
    assert time.perf_counter() - t0 < 0.1
    assert sum(counts.values()) == 10**9
    assert counts[LayerKind(Mixer.ATTENTION, Ffn.DENSE, False)] == 1  # layers 0-2: layer 2 is full
    assert counts[LayerKind(Mixer.ATTENTION, Ffn.MOE, False)] == 10**9 // 3 - 1
