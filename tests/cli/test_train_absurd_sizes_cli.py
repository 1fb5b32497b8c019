"""``meshplan train`` refuses, on one line and before any process starts, a model its ranks could
not build (more than MAX_RUNTIME_LAYERS layers: 10^8 hung the workers) or a CPU run whose ranks
together need more memory than the machine has (the cost model's peak per rank). Through the real
entry point; the launcher is a tripwire (a case that reaches it exits 0 here)."""

from __future__ import annotations

import pytest
from _fuzz_harness import assert_clean, cpu_job

import meshplan.cli.train_cmd as train_cmd
from meshplan.plan import Job
from meshplan.runtime.support import MAX_RUNTIME_LAYERS

pytestmark = pytest.mark.usefixtures("no_processes")

GIB = 2**30


def _saved(tmp_path, **overrides) -> str:
    job = cpu_job()
    job = Job(model=job.model.with_overrides(overrides), training=job.training, cluster=job.cluster, plan=job.plan)
    path = tmp_path / "job.json"
    job.save(path)
    return str(path)


@pytest.mark.parametrize("layers, refused", [(10**8, True), (MAX_RUNTIME_LAYERS + 1, True),
                                             (MAX_RUNTIME_LAYERS, False)])
def test_layers_the_runtime_cannot_build(layers, refused, tmp_path):
    code, err = assert_clean(["train", "--plan", _saved(tmp_path, num_layers=layers), "--steps", "1"])
    assert (code == 2) == refused, err
    if refused:
        assert f"{layers:,} layers" in err and f"at most {MAX_RUNTIME_LAYERS:,}" in err


def test_a_cpu_run_larger_than_the_machine(tmp_path, monkeypatch):
    """hidden 16384 and a 65536 MLP: two fp32 layers with AdamW per rank are far past 8 GiB, the toy
    model far below it."""
    monkeypatch.setattr(train_cmd, "host_memory_bytes", lambda: 8 * GIB)
    wide = _saved(tmp_path, hidden_size=16384, ffn_hidden_size=65536, num_heads=128)
    code, err = assert_clean(["train", "--plan", wide, "--steps", "1"])
    assert code == 2 and "this machine has 8.0 GiB" in err and "2 CPU processes" in err
    code, err = assert_clean(["train", "--plan", _saved(tmp_path), "--steps", "1"])
    assert code == 0, err  # reached the launcher (the tripwire)


def test_the_dry_run_layout_of_what_train_refuses(tmp_path, monkeypatch):
    """The layout still answers (and says why the runtime would not run it)."""
    monkeypatch.setattr(train_cmd, "host_memory_bytes", lambda: 8 * GIB)
    code, err = assert_clean(["train", "--plan", _saved(tmp_path, num_layers=10**8), "--dry-run"])
    assert code == 0, err
