"""minitp.runtime.peak: the FLOP/s MFU divides by — a GPU's from the datasheet table, a CPU's
measured here, by one thread's CPU clock so that a busy machine cannot lower it."""

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

import minitp as mt
from minitp.runtime import peak
from minitp.train import cli


@pytest.mark.parametrize("name, dtype, flops", [
    ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989e12),
    ("NVIDIA H100 80GB HBM3", torch.float32, 67e12),
    ("NVIDIA A100-SXM4-80GB", torch.float16, 312e12),
    ("Tesla V100-SXM2-32GB", torch.float32, 15.7e12),
    ("Tesla V100-SXM2-32GB", torch.bfloat16, None),  # V100 has no bf16 tensor cores
    ("NVIDIA GeForce RTX 4090", torch.bfloat16, None),  # not tabled: no guess
])
def test_datasheet_peaks(name, dtype, flops):
    assert peak.gpu_peak(name, dtype) == flops


def test_a_gpu_run_counts_one_peak_per_rank_and_says_it_is_the_datasheet(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    found = peak.peak(True, 8, torch.bfloat16)
    assert found.total == 8 * 989e12 and found.source.startswith("datasheet: NVIDIA H100")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Mystery GPU")
    assert peak.peak(True, 8, torch.bfloat16) is None


def test_a_cpu_peak_is_measured_once_for_the_machine():
    found = peak.peak(False, 8, torch.float32)
    assert found.devices == 1 and found.source.startswith("measured here")
    # a real matmul: between a slow core's 1 GFLOP/s and far beyond any CPU's 100 TFLOP/s
    assert 1e8 < found.flops < 1e14
    assert found.flops == pytest.approx(float(found.source.split(" GFLOP/s")[0].split()[-1])
                                        * 1e9 * peak.cpu_cores(), rel=1e-3)


def test_a_busy_machine_does_not_lower_the_cpu_peak():
    """Both cores held by busy loops (the old wall-clock peak fell 5-10x so, and runs
    reported an MFU above 1): the peak stays within 2x of the one measured without them,
    or, where the loops make the trials disagree (`peak.MOST_SPREAD`), is not given at all
    and says why: never a lower number."""
    idle = peak.peak(False, 2, torch.float32).flops
    assert idle is not None
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(max(2, round(peak.cpu_cores())))]
    try:
        time.sleep(0.3)  # both loops running
        measured = peak.peak(False, 2, torch.float32)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    busy = measured.flops
    if busy is None:  # refused, with its reason (MFU then prints null)
        assert measured.source.startswith("not measured: the trials disagree"), measured
    else:
        assert idle / 2 < busy < 2 * idle, (idle, busy)


@pytest.mark.parametrize("seconds, tick, why", [
    ([0.005] * 8, 1e-9, None),
    ([0.005] * 4 + [0.006] * 4, 1e-9, None),
    ([0.005] + [0.009] * 7, 1e-9, "the trials disagree"),  # the median 1.8x the best
    ([0.005] * 8, 0.0156, "too coarse"),  # a 15.6 ms tick cannot time 5 ms
    ([0.0] * 8, 1e-9, "too coarse"),
])
def test_a_cpu_peak_is_believed_only_when_its_trials_agree(seconds, tick, why):
    found = peak.disagreement(seconds, tick)
    assert found is None if why is None else why in found


def test_a_peak_that_cannot_be_measured_gives_no_mfu_and_says_why(monkeypatch):
    monkeypatch.setattr(peak, "measure_core_flops", lambda dtype: (None, "the trials disagree"))
    found = peak.peak(False, 4, torch.float32)
    assert found.total is None and found.source == "not measured: the trials disagree"
    cfg = mt.GPTConfig(vocab_size=64, seq_len=16, n_layer=2, n_head=4, d_model=32)
    args = SimpleNamespace(batch_size=8, dp=1, pp=1, cp=1, tp=4)
    out = cli._utilisation(cfg, args, {"losses": [1.0], "seconds": 1.0}, found)
    assert out["mfu"] is None and out["peak_source"] == "not measured: the trials disagree"
