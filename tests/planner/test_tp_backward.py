"""The backward's tensor-parallel collectives (cost/tp_backward.py), by hand on a 100 GB/s link
without latency: an 80 MB activation over 8 ranks all-gathers or reduce-scatters in
7/8 x 80e6 / 100e9 = 0.7 ms and all-reduces in 1.4 ms; two sub-blocks per layer."""

import numpy as np
import pytest

from meshplan.calib.fit import shared_settings
from meshplan.calib.validate import load_runs
from meshplan.cost.calibration import Calibration
from meshplan.cost.comms import Link
from meshplan.cost.tp_backward import tp_backward
from meshplan.data.published import runs_csv
from meshplan.spec.frameworks import framework_defaults

MSG_BYTES = 80e6
RING_S = 7 / 8 * MSG_BYTES / 100e9  # 0.7 ms
MS = 1e-3


def _tp_bwd(calib: Calibration, sp: bool, gemm_s: float, bwd_device_s: float = 50 * MS):
    calib = calib.replace_fields(comm_half_message_bytes=0.0)
    link = Link(bandwidth_bytes_per_s=np.array([100e9]), latency_s=np.array([0.0]), calib=calib)
    assert calib.collective_factors("tp_all_gather") == (1.0, 1.0)
    return tp_backward(calib, sp=np.array([sp]), parts=2.0, act_msg_bytes=np.array([MSG_BYTES]),
                       tp=np.array([8.0]), tp_link=link, bwd_device_s=np.array([bwd_device_s]),
                       gemm_s=np.array([gemm_s]))


def test_synchronous_backward_pays_every_collective():
    no_sp = _tp_bwd(Calibration(), sp=False, gemm_s=10 * MS)
    assert no_sp.total_s[0] == pytest.approx(2 * 2 * RING_S)  # f's all-reduce per sub-block
    assert no_sp.exposed_s[0] == pytest.approx(no_sp.total_s[0])


def test_sequence_parallel_backward_gathers_the_saved_shard_again():
    # Korthikanti et al. 2022 Sec. 4.2.2: gradient all-gather + reduce-scatter + the input re-gather
    megatron = _tp_bwd(Calibration(), sp=True, gemm_s=10 * MS)
    assert megatron.total_s[0] == pytest.approx(2 * 3 * RING_S)
    assert megatron.exposed_s[0] == pytest.approx(2 * 3 * RING_S)
    dtensor = _tp_bwd(Calibration(sp_saves_gathered_inputs=True), sp=True, gemm_s=10 * MS)
    assert dtensor.total_s[0] == pytest.approx(2 * 2 * RING_S)


def test_async_backward_hides_the_input_gradient_reduction_and_the_regather_behind_gemms():
    calib = Calibration(tp_backward_async=True)
    assert _tp_bwd(calib, sp=False, gemm_s=10 * MS).exposed_s[0] == pytest.approx(0.0)
    # under SP the output-gradient all-gather stays synchronous: 2 x 0.7 ms
    assert _tp_bwd(calib, sp=True, gemm_s=10 * MS).exposed_s[0] == pytest.approx(2 * RING_S)
    # a GEMM window of 1 ms hides 1 ms of each asynchronous group
    assert _tp_bwd(calib, sp=False, gemm_s=1 * MS).exposed_s[0] == pytest.approx(2.8 * MS - 1 * MS)
    assert _tp_bwd(calib, sp=True, gemm_s=1 * MS).exposed_s[0] == pytest.approx(1.4 * MS + 2 * (1.4 * MS - 1 * MS))
    # the total is what moves, hidden or not
    assert _tp_bwd(calib, sp=True, gemm_s=10 * MS).total_s[0] == pytest.approx(2 * 3 * RING_S)


def test_tp_overlap_still_hides_the_synchronous_part():
    full = _tp_bwd(Calibration(tp_overlap=1.0), sp=True, gemm_s=0.0, bwd_device_s=50 * MS)
    assert full.exposed_s[0] == pytest.approx(0.0)


def test_only_megatron_lm_2022_runs_the_backward_asynchronously():
    assert framework_defaults("megatron-lm-2022").settings["tp_backward_async"] is True
    for name in ("megatron-lm", "megatron-deepspeed", "unstated"):
        assert not framework_defaults(name).settings.get("tp_backward_async", False)


def test_rows_of_both_megatron_releases_fit_together():
    runs = [r for r in load_runs(runs_csv("calibration"))[0] if r.stack == "megatron"]
    asyncs = {bool(r.settings.get("tp_backward_async", False)) for r in runs}
    assert asyncs == {True, False}
    assert "tp_backward_async" not in shared_settings(runs, {})
