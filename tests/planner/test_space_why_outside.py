"""``why_outside`` names the rule a plan outside the search space breaks (bench/bench_experts.py
reports it for published plans), and agrees with ``in_space``."""

from meshplan.plan import ParallelDims, Plan, Schedule
from meshplan.search.space import SearchOptions
from meshplan.search.space_membership import in_space, why_outside
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

MODEL = model_preset("llama3-8b")  # 32 heads, 8 KV heads, 32 layers
TRAINING = TrainingSpec(seq_len=4096, global_batch=64)


def test_inside_is_none_and_agrees_with_in_space():
    plan = Plan(dims=ParallelDims(dp_shard=4, tp=2), zero=1, sp=True)
    assert in_space(MODEL, TRAINING, 8, plan) and why_outside(MODEL, TRAINING, 8, plan) is None


def test_each_rule_is_named():
    cases = [
        (Plan(dims=ParallelDims(dp_shard=2, tp=3), zero=1), 6, "tp must divide"),
        (Plan(dims=ParallelDims(dp_shard=4, cp=2), zero=1), 8, "context parallel is not available"),
        (Plan(dims=ParallelDims(dp_replicate=2, pp=4), schedule=Schedule.INTERLEAVED_1F1B, vpp=2, micro_batch=16),
         8, "multiple of pp"),
        (Plan(dims=ParallelDims(dp_shard=8), zero=1), 16, "the job 16"),
    ]
    opts = SearchOptions(max_cp=1)
    for plan, gpus, words in cases:
        why = why_outside(MODEL, TRAINING, gpus, plan, opts)
        assert why is not None and words in why, (plan.notation(), why)
        assert not in_space(MODEL, TRAINING, gpus, plan, opts)
