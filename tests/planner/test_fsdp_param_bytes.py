"""torch FSDP keeps the fp32 parameter as the shard (Calibration.params_are_master): 4 + 4 + 8
bytes per sharded parameter with fp32 gradients and Adam, where a bf16 shard beside an fp32
master (Megatron's distributed optimizer, DeepSpeed ZeRO) is 2 + 4 + 12.

By hand on tt-1 (torchtitan Llama 3.1 8B, FSDP over 8 GPUs, no TP / PP): a layer holds
q 4096^2 + k, v 2 x 4096 x 1024 + o 4096^2 + MLP 3 x 4096 x 14336 + 2 norms x 4096
= 218,112,000 parameters; 32 layers + embedding and output 2 x 128256 x 4096 + the final norm
4096 = 8,030,261,248. Per GPU: parameters 4 x P / 8 (fp32 shard) against 2 x P / 8, Adam 8 x P / 8
against 12 x P / 8 (moments + master); gathered, two layers in bf16, all of it beyond the fp32
shard (2 x 218,112,000 x 2 = 872,448,000 B) against 7/8 of it beside a bf16 shard (763,392,000 B).
FSDP2's reduce-scatter (Calibration.fsdp_reduce_scatter_bytes_per_param): one layer's fp32
input + its bf16 gradients, 6 x 218,112,000 = 1,308,672,000 B more.
"""

from pathlib import Path

import pytest

from meshplan.calib.validate import load_runs, setting_calibration
from meshplan.cost.calibration import Calibration, calibration_for
from meshplan.cost.layer import optimizer_state_bytes_per_param, param_bytes_per_param, state_bytes
from meshplan.cost.step import estimate
from meshplan.spec.frameworks import framework_defaults
from meshplan.spec.training import TrainingSpec

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "bench" / "data" / "runs_heldout.csv"
P = 8_030_261_248
LAYER_P = 218_112_000


def _memory(flag: bool, rs_bytes: float = 0.0):
    run = next(r for r in load_runs(HELDOUT)[0] if r.row_id == "tt-1")
    calib = setting_calibration(run, None, {**run.settings, **run.release_values}).replace_fields(
        params_are_master=flag, fsdp_reduce_scatter_bytes_per_param=rs_bytes)
    return estimate(run.model, run.cluster, run.training, run.plan, calib).memory


def test_fsdp_holds_the_fp32_parameter_as_its_shard():
    m = _memory(True)
    assert m.parameters_bytes == pytest.approx(4 * P / 8)
    assert m.optimizer_bytes == pytest.approx(8 * P / 8)
    assert m.gradients_bytes == pytest.approx(4 * P / 8)
    assert m.gathered_weight_bytes == pytest.approx(2 * LAYER_P * 2)


def test_a_bf16_shard_beside_the_fp32_master():
    m = _memory(False)
    assert m.parameters_bytes == pytest.approx(2 * P / 8)
    assert m.optimizer_bytes == pytest.approx(12 * P / 8)
    assert m.gathered_weight_bytes == pytest.approx(2 * LAYER_P * 2 * 7 / 8)


def test_the_reduce_scatter_holds_one_layer_in_fp32_beside_its_bf16_gradients():
    # torchtitan's stack: + 6 x 218,112,000 = 1,308,672,000 B (1.22 GiB) beyond the gathered layers
    assert _memory(True, 6.0).gathered_weight_bytes == pytest.approx(2 * LAYER_P * 2 + 6 * LAYER_P)
    assert framework_defaults("torchtitan").settings["fsdp_reduce_scatter_bytes_per_param"] == 6.0


def test_states_per_parameter():
    bf16_shard, fsdp = Calibration(), Calibration(params_are_master=True)
    training = TrainingSpec(seq_len=8192, global_batch=16)
    assert param_bytes_per_param(fsdp) + optimizer_state_bytes_per_param(fsdp, training) == 12.0
    assert param_bytes_per_param(bf16_shard) + optimizer_state_bytes_per_param(bf16_shard, training) == 14.0
    # ZeRO-3 over 8: (4 + 4 + 8) / 8 = 2 B against (2 + 4 + 12) / 8 = 2.25 B a parameter
    assert state_bytes(fsdp, training, 1e9, 3, 8) == pytest.approx(2.0e9)
    assert state_bytes(bf16_shard, training, 1e9, 3, 8) == pytest.approx(2.25e9)


def test_only_the_torch_fsdp_stacks_keep_the_fp32_parameter():
    for name in ("torchtitan", "torchtitan-compile", "llm-foundry", "pytorch-fsdp"):
        assert framework_defaults(name).settings["params_are_master"] is True
    for name in ("megatron-core", "megatron-lm", "deepspeed", "unstated"):
        assert not framework_defaults(name).settings.get("params_are_master", False)


def test_the_torchtitan_stack_record_carries_fsdp2s_bytes():
    # the stack's own record (spec/presets/calibration_fitted.json 'stacks'), what calibration_for
    # gives any caller without the framework's settings: tt-1 by hand as above, 4 x P / 8 and 8 x P / 8
    run = next(r for r in load_runs(HELDOUT)[0] if r.row_id == "tt-1")
    calib = calibration_for(run.cluster.gpu, "torchtitan")
    assert calib.params_are_master and calib.fp8_tp_all_gather
    assert calib.fsdp_reduce_scatter_bytes_per_param == 6.0
    m = estimate(run.model, run.cluster, run.training, run.plan, calib).memory
    assert m.parameters_bytes == pytest.approx(4 * P / 8)
    assert m.optimizer_bytes == pytest.approx(8 * P / 8)
    assert m.gathered_weight_bytes == pytest.approx(2 * LAYER_P * 2 + 6 * LAYER_P)


def test_torch_fsdp_frameworks_on_the_torchtitan_stack_keep_their_own_reduce_dtype():
    # llm-foundry's mixed_precision PURE reduces in bf16; plain FSDP scripts state no reduce dtype
    for name in ("llm-foundry", "pytorch-fsdp"):
        settings = framework_defaults(name).settings
        assert settings["fsdp_reduce_scatter_bytes_per_param"] == 0.0
        assert settings["fp8_tp_all_gather"] is False
