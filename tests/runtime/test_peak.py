"""minitp.runtime.peak: the FLOP/s MFU divides by — a GPU's from the datasheet table, a CPU's
measured here."""

import pytest
import torch

from minitp.runtime import peak


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
