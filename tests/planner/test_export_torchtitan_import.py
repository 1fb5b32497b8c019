"""torchtitan TOML -> Plan: a config in torchtitan's own layout, defaults, and bad input."""

import tomllib
from pathlib import Path

import pytest

from meshplan.errors import MeshplanError
from meshplan.export.import_torchtitan import flavor_preset, import_torchtitan, load_toml
from meshplan.plan import Recompute, Schedule
from meshplan.spec.training import Precision

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "torchtitan" / "llama3_8b.toml"


def test_llama3_8b_config():
    cfg = load_toml(FIXTURE)
    assert flavor_preset(cfg) == "llama3-8b"
    imp = import_torchtitan(cfg, num_gpus=64, num_layers=32)
    d = imp.plan.dims
    # data_parallel_shard_degree = -1 takes the ranks left after tp: 64 / 8 = 8
    assert (d.dp_replicate, d.dp_shard, d.tp, d.pp, d.cp) == (1, 8, 8, 1, 1)
    assert imp.plan.zero == 3 and imp.plan.sp
    assert imp.plan.recompute == Recompute.SELECTIVE
    # global_batch_size defaults to local_batch_size * dp = 1 * 8
    assert imp.training.global_batch == 8 and imp.training.seq_len == 8192
    assert imp.training.precision == Precision.BF16


def test_split_points_and_every_kth_layer():
    cfg = tomllib.loads("""
[training]
local_batch_size = 16
global_batch_size = 32
seq_len = 2048
[parallelism]
data_parallel_replicate_degree = 2
data_parallel_shard_degree = 1
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "interleaved1f1b"
pipeline_parallel_microbatch_size = 2
pipeline_parallel_split_points = ["layers.7", "layers.16", "layers.24"]
[activation_checkpoint]
mode = "selective"
selective_ac_option = "2"
""")
    imp = import_torchtitan(cfg, num_gpus=4, num_layers=32)
    p = imp.plan
    assert p.schedule == Schedule.INTERLEAVED_1F1B and p.vpp == 2
    assert p.stage_layers == (7, 9, 8, 8)
    assert p.recompute == Recompute.FULL and p.recompute_layers == (3, 4, 4, 4)  # every 2nd block
    assert p.micro_batch == 2 and p.zero == 0


@pytest.mark.parametrize("toml,msg", [
    ('[parallelism]\ntensor_parallel_degree = 3', "not divisible"),
    ('[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "DualPipeV"', "no meshplan equivalent"),
    ('[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_split_points = ["layers.40"]', "empty stage"),
    ('[parallelism]\ntensor_parallel_degree = "8"', "must be an integer"),
    ('[activation_checkpoint]\nmode = "sometimes"', "not understood"),
])
def test_bad_configs(toml, msg):
    with pytest.raises(MeshplanError, match=msg):
        import_torchtitan(tomllib.loads(toml), num_gpus=8, num_layers=32)


def test_not_toml(tmp_path):
    bad = tmp_path / "x.toml"
    bad.write_text("[parallelism\n")
    with pytest.raises(MeshplanError, match="not valid TOML"):
        load_toml(bad)


def _pp_config(extra: str) -> dict:
    return tomllib.loads(f"""
[training]
local_batch_size = 8
seq_len = 2048
[parallelism]
data_parallel_shard_degree = 1
pipeline_parallel_degree = 4
{extra}
""")


@pytest.mark.parametrize("extra,stages", [
    # torchtitan's own split (generate_llm_fqn_per_model_part): 32 layers + embedding + output =
    # 34 slots over 4 stages -> 9, 9, 8, 8 slots; the first and the last give one to the modules
    ('pipeline_parallel_schedule = "1F1B"', (8, 9, 8, 7)),
    # a multi-stage schedule with no split runs 2 stages per rank: 34 over 8 -> 5, 5, 4 x 6
    ('pipeline_parallel_schedule = "Interleaved1F1B"', (4, 5, 4, 4, 4, 4, 4, 3)),
    # layers_per_stage 3: ceil(34 / 3) = 12 stages (3 a rank); 34 over 12 -> 3 x 10, 2 x 2 slots
    ('pipeline_parallel_schedule = "Interleaved1F1B"\npipeline_parallel_layers_per_stage = 3',
     (2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2, 1)),
])
def test_torchtitan_default_split_when_none_is_given(extra, stages):
    p = import_torchtitan(_pp_config(extra), num_gpus=4, num_layers=32).plan
    assert p.stage_layers == stages and sum(stages) == 32
    assert p.vpp == len(stages) // 4
