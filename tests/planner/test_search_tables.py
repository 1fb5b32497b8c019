"""The bridge to the cost model: shared layer costs, rank-total to virtual-stage splits, exact
re-scoring of uneven splits."""

from dataclasses import fields

import numpy as np
import pytest

from meshplan.cost import calibration_for, estimate
from meshplan.cost.layer import LayerCost, layer_cost
from meshplan.export.common import search_options_for
from meshplan.search.space import enumerate_space
from meshplan.search.split_scoring import chunk_split, score_splits
from meshplan.search.tables import CostContext, shared_layer_cost
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec


@pytest.mark.parametrize("name,gpus,target", [("llama2-7b", 16, None), ("mixtral-8x7b", 16, None),
                                              ("mixtral-8x7b", 16, "megatron")])  # + recompute modules
def test_shared_layer_cost_equals_layer_cost(name, gpus, target):
    model = model_preset(name)
    cluster = system_preset("dgx-h100", num_nodes=gpus // 8)
    training = TrainingSpec(seq_len=4096, global_batch=64)
    plans = enumerate_space(model, training, gpus, *([search_options_for(target)] if target else []))
    ctx = CostContext(model, cluster, training, calibration_for(cluster.gpu, target))
    idx = np.random.default_rng(1).choice(len(plans), 3000, replace=False)
    sub = plans.take(idx)
    shared, direct = shared_layer_cost(ctx, sub).take(slice(None)), layer_cost(model, cluster, training, sub, ctx.calib)
    for f in fields(LayerCost):
        np.testing.assert_allclose(np.broadcast_to(getattr(shared, f.name), (idx.size,)),
                                   np.broadcast_to(getattr(direct, f.name), (idx.size,)), rtol=1e-12,
                                   err_msg=f.name)


def test_chunk_split_round_trip():
    layers, rec = chunk_split(np.array([7, 5, 6]), np.array([3, 0, 6]), 2)
    # a rank's remainder on its last chunk (chunk 0 is held most under interleaving); recomputed
    # layers fill from chunk 0
    assert layers == (3, 2, 3, 4, 3, 3) and rec == (3, 0, 3, 0, 0, 3)
    pp = 3
    assert [sum(layers[i::pp]) for i in range(pp)] == [7, 5, 6]
    assert [sum(rec[i::pp]) for i in range(pp)] == [3, 0, 6]
    assert all(r <= n for r, n in zip(rec, layers))


def test_score_splits_matches_estimate_for_interleaved_uneven_chunks():
    """The search's exact re-scoring charges the interleaved schedule's chunk weights as
    ``estimate`` does (cost/chunk_inflight.py): chunks of unequal size change the held activations."""
    model = model_preset("llama2-13b")  # 40 layers
    cluster = system_preset("dgx-a100", num_nodes=2)
    training = TrainingSpec(seq_len=4096, global_batch=32)
    space = enumerate_space(model, training, 16)
    pick = np.flatnonzero((space.pp == 4) & (space.vpp == 3) & (space.schedule == 2))[:4]
    assert pick.size
    ctx = CostContext(model, cluster, training, calibration_for(cluster.gpu))
    n = np.array([[8, 11, 11, 10]] * pick.size)  # chunks (2, 3, 3), (3, 4, 4), (3, 3, 4) per rank
    r = np.zeros_like(n)
    got = score_splits(ctx, space.take(pick), n, r)
    for j, i in enumerate(pick):
        layers, rec = chunk_split(n[j], r[j], int(space.vpp[i]))
        est = estimate(model, cluster, training, space.plan(int(i), layers, rec))
        assert got.peak_memory_bytes[j] == pytest.approx(est.fit_memory_gib * 2**30, rel=1e-12)


def test_score_splits_matches_estimate_for_uneven_splits():
    model = model_preset("llama2-13b")
    cluster = system_preset("dgx-a100", num_nodes=2)
    training = TrainingSpec(seq_len=4096, global_batch=32)
    space = enumerate_space(model, training, 16)
    pick = np.flatnonzero((space.pp == 4) & (space.recompute == 2))[:5]
    ctx = CostContext(model, cluster, training, calibration_for(cluster.gpu))
    n = np.array([[8, 11, 11, 10]] * pick.size)
    r = np.array([[8, 3, 0, 1]] * pick.size)
    got = score_splits(ctx, space.take(pick), n, r)
    for j, i in enumerate(pick):
        layers, rec = chunk_split(n[j], r[j], int(space.vpp[i]))
        est = estimate(model, cluster, training, space.plan(int(i), layers, rec))
        assert got.step_time_s[j] == pytest.approx(est.step_time_s, rel=1e-12)
        assert got.peak_memory_bytes[j] == pytest.approx(est.fit_memory_gib * 2**30, rel=1e-12)


def test_chunk_weights_equal_the_per_row_rule():
    """The re-scoring's chunk weights (computed once per distinct rank layer count, rank and
    micro-batch count) equal ``layout_chunk_weight`` of each row's own ``chunk_split`` layout."""
    from meshplan.cost.batch import num_microbatches
    from meshplan.cost.chunk_inflight import layout_chunk_weight
    from meshplan.search.split_scoring import _chunk_weights

    model = model_preset("llama2-13b")  # 40 layers
    training = TrainingSpec(seq_len=4096, global_batch=64)
    space = enumerate_space(model, training, 16)
    rng = np.random.default_rng(3)
    for pp in (2, 4):
        rows = np.flatnonzero(space.pp == pp)
        sub = space.take(rng.choice(rows, min(rows.size, 400), replace=False))
        v = sub.vpp[:, None]
        # random splits with n >= v per rank summing to 40, even ones among them
        n = v + rng.multinomial(40 - pp * int(v.max()), np.ones(pp) / pp, size=len(sub))
        n[:, -1] += 40 - n.sum(axis=1)
        n[::5] = 40 // pp
        r = np.minimum(n, rng.integers(0, 3, size=n.shape))
        got = _chunk_weights(training, sub, n, r)
        m = np.broadcast_to(num_microbatches(training, sub), (len(sub),))
        interleaved = (sub.schedule == 2) & (sub.vpp > 1)
        assert interleaved.any() and (got != 1.0).any()
        for i in range(len(sub)):
            layers, _ = chunk_split(n[i], r[i], int(sub.vpp[i]))
            for rnk in range(pp):
                want = (layout_chunk_weight(layers, pp, int(sub.vpp[i]), rnk, int(m[i]))
                        if interleaved[i] else 1.0)
                assert got[i, rnk] == want


def test_take_column_keeps_repeated_values_as_views():
    # tables._take_column: a column that is one value repeated (stride 0) is gathered as a
    # read-only view of the result's length; any other column (or a mask) as a copy; the values
    # are those of plain indexing either way.
    from meshplan.search.tables import _take_column

    idx = np.array([3, 0, 3, 1])
    same = np.broadcast_to(np.asarray(2.5), (5,))
    got = _take_column(same, idx)
    assert got.shape == (4,) and got.strides == (0,) and np.array_equal(got, same[idx])
    assert not got.flags.writeable
    varied = np.arange(5.0)
    assert np.array_equal(_take_column(varied, idx), varied[idx])
    mask = np.array([True, False, True, False, True])
    assert np.array_equal(_take_column(same, mask), same[mask])
    assert np.array_equal(_take_column(same, slice(1, 3)), same[1:3])


@pytest.mark.parametrize("name", ["llama2-7b", "deepseek-v3"])  # deepseek-v3: leading dense layers (lead)
def test_stage_probes_are_rank_cost_at_each_probe(name, monkeypatch):
    # Each probe stage_table reads is rank_cost at its (rank, layers, recomputed, embedding, head,
    # lead), bit for bit, though stage_probes costs each distinct row once and in calls of
    # PROBE_CHUNK_PLANS plans (here 7: many calls).
    from meshplan.cost.batch import rank_cost
    from meshplan.search import tables
    from meshplan.search.tables import rank_fit_bytes, stage_probes

    model = model_preset(name)
    gpus = 64 if name == "deepseek-v3" else 16
    cluster = system_preset("dgx-h100", num_nodes=gpus // 8)
    training = TrainingSpec(seq_len=4096, global_batch=128)
    plans = enumerate_space(model, training, gpus)
    ctx = CostContext(model, cluster, training, calibration_for(cluster.gpu))
    sub = plans.take(np.sort(np.random.default_rng(2).choice(len(plans), 60, replace=False)))
    shared = shared_layer_cost(ctx, sub)
    monkeypatch.setattr(tables, "PROBE_CHUNK_PLANS", 7)
    got = stage_probes(ctx, sub, shared=shared)
    layer, stack = shared.take(slice(None)), shared.stack
    d = stack.lead_layers if stack is not None else 0
    last, one = sub.pp - 1, sub.pp == 1
    for n0, rows in ((1, (0, 1, 2, 6, 7)), (tables.MEMORY_PROBE_LAYERS, range(8))):
        probes = ((0, n0, 0, False, False, 0), (0, n0 + 1, 0, False, False, 0), (0, n0 + 1, 1, False, False, 0),
                  (0, n0 + 1, 2, False, False, 0), (last, n0, 0, False, False, 0),
                  (last, n0 + 1, 0, False, False, 0), (0, n0 + d, 0, True, one, d),
                  (last, np.where(one, n0 + d, n0), 0, one, True, np.where(one, d, 0)))
        for j in rows:
            rk, n, r, emb, head, lead = (np.broadcast_to(np.asarray(x), (len(sub),)) for x in probes[j])
            mix = {} if stack is None else {"stack": shared.take_stack(slice(None)), "lead": lead.astype(float)}
            rc = rank_cost(model, cluster, training, sub, ctx.calib, layer, rank=rk.astype(np.int64),
                           layers=n.astype(np.int64), recomputed=r.astype(np.int64), has_embedding=emb.astype(bool),
                           has_head=head.astype(bool), totals=False, **mix)
            full = lambda x: np.broadcast_to(np.asarray(x, dtype=float), (len(sub),))  # noqa: E731
            if n0 == 1:
                assert np.array_equal(got.time_s[j], full(rc.microbatch_s)), (name, j)
                assert np.array_equal(got.extra_s[j], full(rc.step_extra_s)), (name, j)
            else:
                assert np.array_equal(got.memory_bytes[j], full(rank_fit_bytes(rc, sub, ctx.calib))), (name, j)


def test_shared_layer_cost_in_slices_is_one_call(monkeypatch):
    # shared_layer_cost passes layer_cost LAYER_CHUNK_ROWS rows at a time: the same values, bit
    # for bit, as one call over every row (here slices of 53 rows over ~2000 distinct rows).
    from meshplan.search import tables

    model = model_preset("mixtral-8x7b")
    cluster = system_preset("dgx-h100", num_nodes=4)
    training = TrainingSpec(seq_len=4096, global_batch=64)
    plans = enumerate_space(model, training, 32, search_options_for("megatron"))
    ctx = CostContext(model, cluster, training, calibration_for(cluster.gpu, "megatron"))
    sub = plans.take(np.sort(np.random.default_rng(3).choice(len(plans), 4000, replace=False)))
    whole = shared_layer_cost(ctx, sub)
    monkeypatch.setattr(tables, "LAYER_CHUNK_ROWS", 53)
    sliced = shared_layer_cost(ctx, sub)
    assert whole.unique.fwd_compute_s.size > 53 and np.array_equal(whole.row, sliced.row)
    for f in fields(LayerCost):
        assert np.array_equal(getattr(whole.unique, f.name), getattr(sliced.unique, f.name)), f.name
