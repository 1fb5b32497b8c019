"""The loss's memory as each stack holds it: bytes per logit kept for the loss and alive around its
backward (Calibration.logits_bytes_per_element, loss_transient_bytes_per_element; cost/memory.py
rank_activations). llm-foundry's MPT keeps bf16 logits and flash-attn's fused cross entropy writes
a bf16 gradient (frameworks.json's source: llmfoundry/models/mpt/modeling_mpt.py@0085285), where
torchtitan casts its logits to fp32 and torch's cross entropy holds an fp32 upcast and gradient."""

import dataclasses

from meshplan.cost.calibration import Calibration, calibration_for
from meshplan.cost.step import estimate
from meshplan.plan import ParallelDims, Plan
from meshplan.spec.cluster import system_preset
from meshplan.spec.frameworks import framework_defaults
from meshplan.spec.presets import model_preset
from meshplan.spec.training import Precision, TrainingSpec

FIELDS = {f.name for f in dataclasses.fields(Calibration)}


def _framework_calibration(name: str, gpu) -> Calibration:
    fw = framework_defaults(name)
    return dataclasses.replace(calibration_for(gpu, fw.stack),
                               **{k: v for k, v in fw.settings.items() if k in FIELDS})


def test_llm_foundry_keeps_bf16_logits_and_a_bf16_gradient():
    settings = framework_defaults("llm-foundry").settings
    assert (settings["logits_bytes_per_element"], settings["loss_transient_bytes_per_element"]) == (2.0, 2.0)


def test_logits_bytes_by_hand_per_stack():
    # llama3-8b, b 2 x s 4096 = 8192 tokens per micro-batch, V 128256 (a multiple of 128: no
    # padding), tp 1 pp 1: 8192 x 128256 = 1,050,673,152 logits on the one rank.
    # llm-foundry: 2 kept + 2 gradient = 4 B -> 4,202,692,608 B; torchtitan: 4 + 8 = 12 B.
    cluster = system_preset("dgx-h100", 1)
    model = model_preset("llama3-8b")
    training = TrainingSpec(seq_len=4096, global_batch=64, precision=Precision.BF16)
    plan = Plan(dims=ParallelDims(dp_shard=8), zero=3, micro_batch=2)
    logits = 2 * 4096 * 128256
    assert logits == 1_050_673_152
    lf = estimate(model, cluster, training, plan, _framework_calibration("llm-foundry", cluster.gpu))
    tt = estimate(model, cluster, training, plan, _framework_calibration("torchtitan", cluster.gpu))
    assert lf.memory.logits_bytes == 4 * logits == 4_202_692_608
    assert tt.memory.logits_bytes == 12 * logits
    # the 8 B per logit less is all the two estimates differ in on the device (the reserve scales with it)
    assert tt.memory.activations_bytes - lf.memory.activations_bytes == 8 * logits
