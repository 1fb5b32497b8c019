"""Impossible sizes fail fast (session 8): a model of 10^8 layers, 10^7 micro-batches, a 10^12
vocabulary, hidden size 10^9, 10^6 GPUs, sequences of 10^9 tokens, through the real entry point.
Each case either answers within TIME_LIMIT_S or exits 2 with one ``error:`` line, never a traceback
(harness: _fuzz_harness.py). Before session 8 ``estimate`` looped over every layer
(spec/layers.layer_kind_counts) and hung at 10^8 layers; ``plan`` hung at 10^4 (the stage walk's
grids), and the torchtitan export built 10^8 module names."""

from __future__ import annotations

import json
import time

import pytest
from _fuzz_harness import FUZZ, assert_clean, write
from hypothesis import given
from hypothesis import strategies as st

from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import resolve_model
from meshplan.spec.training import TrainingSpec

pytestmark = pytest.mark.usefixtures("no_processes")  # no case starts a process (conftest.py)

TIME_LIMIT_S = 2.0
"""What an impossible size may cost before its answer (the brief of session 8)."""

HUGE = [10**6, 10**8, 2**31 - 1, 10**9, 10**12]
MODELS = ["llama3-8b", "deepseek-v3", "nemotron-3-nano", "gpt-oss-20b", "mixtral-8x7b"]
MODEL_FIELDS = ["num_layers", "hidden_size", "vocab_size", "ffn_hidden_size", "num_heads", "moe_num_experts",
                "moe_ffn_hidden_size", "mtp_num_layers", "moe_dense_layers", "max_position", "sliding_window",
                "head_dim", "moe_shared_experts"]
ESTIMATE = ["estimate", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096", "--global-batch", "64", "--json"]


def timed(argv: list[str]) -> tuple[int | str, str, float]:
    t0 = time.perf_counter()
    code, err = assert_clean(argv)
    return code, err, time.perf_counter() - t0


def fast_or_refused(argv: list[str]) -> tuple[int | str, str]:
    code, err, took = timed(argv)
    assert code == 2 or took < TIME_LIMIT_S, f"meshplan {' '.join(argv)}: exit {code} after {took:.1f} s"
    return code, err


@FUZZ
@given(model=st.sampled_from(MODELS), field=st.sampled_from(MODEL_FIELDS), value=st.sampled_from(HUGE))
def test_estimate_a_huge_model_field(model, field, value):
    fast_or_refused(ESTIMATE + ["--model", model, "--override", f"{field}={value}"])


@pytest.mark.parametrize("model", ["llama3-8b", "deepseek-v3", "gpt-oss-20b"])
def test_a_hundred_million_layers_estimate_at_once(model):
    code, _ = fast_or_refused(ESTIMATE + ["--model", model, "--override", f"num_layers={10**8}"])
    assert code == 0


@pytest.mark.parametrize("extra", [
    ["--seq-len", str(10**9)], ["--global-batch", str(10**9)], ["--gpus", str(10**6)], ["--nodes", str(10**6)],
    ["--pp", "4", "--global-batch", str(10**7), "--micro-batch", "1"], ["--pp", "2", "--vpp", str(10**6)],
    ["--micro-batch", str(10**9)], ["--seq-len", str(2**31 - 1)]])
def test_estimate_huge_training_sizes(extra):
    argv = list(ESTIMATE) + ["--model", "llama3-8b"]
    for flag, value in zip(extra[::2], extra[1::2]):  # a flag given here replaces the default's
        if flag in argv:
            del argv[argv.index(flag):argv.index(flag) + 2]
        argv += [flag, value]
    if "--nodes" in argv:
        del argv[argv.index("--gpus"):argv.index("--gpus") + 2]
    fast_or_refused(argv)


@pytest.mark.parametrize("argv, says", [
    (["--override", f"num_layers={10**8}"], "the search takes at most"),
    (["--override", "num_layers=4096"], "the search takes at most"),
    (["--gpus", str(10**6)], "no legal plan"),
    (["--gpus", "8", "--seq-len", str(10**9)], "no plan fits"),
])
def test_plan_refuses_what_it_cannot_search(argv, says):
    base = ["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--seq-len", "4096", "--global-batch", "64", "--json"]
    if "--gpus" not in argv:
        base += ["--gpus", "64"]
    for flag, value in zip(argv[::2], argv[1::2]):
        if flag in base:
            del base[base.index(flag):base.index(flag) + 2]
        base += [flag, value]
    code, err = fast_or_refused(base)
    assert code == 2 and says in err


def _deep_job(tmp_path, *, model=None, training=None, plan=None):
    """A Job file of a 4-stage Llama-3-8B with some fields replaced (no stage split written, so the
    readers fill the even one for the model's own depth)."""
    job = Job(model=resolve_model("llama3-8b", {}), training=TrainingSpec(seq_len=4096, global_batch=64),
              cluster=resolve_cluster("dgx-h100", nodes=1), plan=Plan(dims=ParallelDims(dp_replicate=2, pp=4)))
    d = job.to_dict()
    d["model"].update(model or {})
    d["training"].update(training or {})
    d["plan"].update(plan or {})
    return write(tmp_path, "job.json", json.dumps(d))


READERS = [["explain"], ["estimate", "--json", "--plan"], ["export", "--to", "megatron"],
           ["export", "--to", "megatron-bridge"], ["export", "--to", "deepspeed"], ["export", "--to", "torchtitan"],
           ["export", "--to", "torchtitan", "--target-version", "0.2"]]


@FUZZ
@given(reader=st.sampled_from(READERS), field=st.sampled_from(["model.num_layers", "training.global_batch",
                                                                 "training.seq_len", "model.vocab_size"]),
       value=st.sampled_from(HUGE))
def test_every_job_reader_answers_a_huge_job(reader, field, value, tmp_path_factory):
    section, name = field.split(".")
    path = _deep_job(tmp_path_factory.mktemp("job"), **{section: {name: value}})
    fast_or_refused([*reader, str(path)])


def test_torchtitan_refuses_a_stage_it_cannot_name(tmp_path):
    """torchtitan 0.3 names every block of a stage in one command-line word: 2.5 * 10^7 blocks
    cannot be one (Linux MAX_ARG_STRLEN)."""
    path = _deep_job(tmp_path, model={"num_layers": 10**8})
    code, err = fast_or_refused(["export", str(path), "--to", "torchtitan"])
    assert code == 2 and "MAX_ARG_STRLEN" in err


@pytest.mark.parametrize("top, says", [({"meshplan_plan_version": 99}, "not supported"),
                                       ({"bogus": 1}, "unknown plan file field"),
                                       ({"plan": {"bogus": 1}}, "unknown plan field")])
def test_a_plan_file_from_elsewhere_is_refused(tmp_path, top, says):
    path = _deep_job(tmp_path)
    d = json.loads(path.read_text())
    for key, value in top.items():
        d[key] = {**d[key], **value} if isinstance(value, dict) else value
    path.write_text(json.dumps(d))
    for reader in READERS[:3]:
        code, err = fast_or_refused([*reader, str(path)])
        assert code == 2 and says in err


@pytest.mark.parametrize("family", ["llama3-8b", "deepseek-v3", "gpt-oss-20b"])
@pytest.mark.parametrize("field, value", [("num_hidden_layers", 10**8), ("vocab_size", 10**12),
                                          ("hidden_size", 10**9), ("num_hidden_layers", "many"),
                                          ("num_hidden_layers", -3), ("num_hidden_layers", None)])
def test_a_huge_or_wrong_hugging_face_config(family, field, value, tmp_path):
    """A config.json with an impossible size or a wrong type: answered at once or refused."""
    from _fuzz_harness import FIXTURES

    good = json.loads((FIXTURES / "hf" / family / "config.json").read_text())
    path = write(tmp_path, "config.json", json.dumps({**good, field: value}))
    code, _ = fast_or_refused(ESTIMATE + ["--model", str(path)])
    if field == "num_hidden_layers" and value == 10**8:
        assert code == 0  # estimated, at once


def test_a_report_of_ten_million_micro_batches_leaves_the_timeline_out(tmp_path):
    """The report's timeline draws every micro-batch; 5 * 10^6 of them (global batch 10^7 over dp 2)
    hung it. Past TIMELINE_MAX_MICROBATCHES the section says why it is not drawn."""
    from meshplan.report.html import TIMELINE_MAX_MICROBATCHES

    path = _deep_job(tmp_path, training={"global_batch": 10**7})
    out = tmp_path / "r.html"
    code, _ = assert_clean(["report", "--plan", str(path), "--out", str(out)])
    assert code == 0
    text = out.read_text()
    assert "timeline-left-out" in text and f"{TIMELINE_MAX_MICROBATCHES:,}" in text and "timeline-chart" not in text
