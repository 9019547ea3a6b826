"""bench/gpu_figures.py records lessons 01, 07 and 16's figures, run for real here; and
minitp.course.labs.gpu_figures reads back only what ran on a GPU, labelled with where and when."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minitp.course.labs import gpu_figures

ROOT = Path(__file__).resolve().parents[3]  # tests/course/labs/ -> the checkout
SCRIPT = ROOT / "bench" / "gpu_figures.py"
HEADER = {"script", "command", "date", "device_kind", "device_name", "gpus", "cpus", "quick",
          "torch", "cuda", "nccl", "python", "figures"}


def _quick_run(tmp_path) -> dict:
    out = tmp_path / "figures-quick.json"  # a name the reader globs, so it could be shown
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("[01]") and proc.stdout.count("[07]") and proc.stdout.count("[16]")
    return json.loads(out.read_text())


def _check_rows(rec: dict) -> None:
    figures = rec["figures"]
    assert set(figures) == {"01", "07", "16"} and all(figures.values())
    for rows in figures.values():
        for row in rows:
            assert row["backend"] in ("gloo", "nccl")
            assert row["device"].split(":")[0] == ("cuda" if row["backend"] == "nccl" else "cpu")
    for row in figures["01"]:
        assert row["world"] >= 2 and len(row["seconds"]) == len(row["bytes"])
        assert all(t > 0 for t in row["seconds"])  # measured
        # the fit of those times; on a busy CPU β may come out ≤ 0 (the doctor says so too)
        assert all(math.isfinite(v) for v in (row["alpha_s"], row["beta_s_per_byte"]))
    for row in figures["07"] + figures["16"]:
        assert row["seconds"] > 0 and all(t > 0 for t in row["all_seconds"])
    assert {r["setting"] for r in figures["07"] if r["tp"] == 1} == {
        "no recompute", "selective", "full recompute"}
    assert [r["tp"] for r in figures["16"]] == sorted({r["tp"] for r in figures["16"]})
    assert any(r["tp"] == 1 for r in figures["16"])


def test_the_quick_run_records_every_figure_measured_with_its_device(tmp_path):
    rec = _quick_run(tmp_path)
    assert set(rec) == HEADER and rec["quick"] is True
    assert rec["torch"] == torch.__version__ and rec["date"].endswith("+00:00")
    assert rec["device_kind"] in ("cpu", "cuda") and rec["device_name"]
    _check_rows(rec)
    assert gpu_figures.runs(tmp_path) == [rec]
    # never a CPU figure passed off as a GPU one, nor a --quick check as figures
    assert gpu_figures.newest_gpu_run(tmp_path) is None


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device here: the GPU path of bench/gpu_figures.py needs one")
def test_on_a_gpu_the_one_rank_figures_run_on_cuda(tmp_path):
    rec = _quick_run(tmp_path)
    assert rec["device_kind"] == "cuda" and rec["nccl"] and rec["cuda"]
    assert rec["device_name"] == torch.cuda.get_device_name(0)
    _check_rows(rec)
    for lesson in ("07", "16"):  # one rank always fits a GPU
        assert all(r["device"] == "cuda:0" for r in rec["figures"][lesson] if r["tp"] == 1)
    assert gpu_figures.newest_gpu_run(tmp_path) is None  # a --quick check is not figures
    (tmp_path / "figures-full.json").write_text(json.dumps({**rec, "quick": False}))
    assert gpu_figures.newest_gpu_run(tmp_path)["date"] == rec["date"]


# --------------------------------------------------------------------------- the reader
def _write(folder: Path, name: str, kind: str, date: str, device: str,
           quick: bool = False) -> None:
    row = {"backend": "nccl" if device.startswith("cuda") else "gloo", "device": device}
    figures = {
        "01": [{**row, "world": 2, "alpha_s": 2e-5, "beta_s_per_byte": 1 / 200e9}],
        "07": [{**row, "tp": 1, "setting": "full recompute", "seconds": 0.004}],
        "16": [{**row, "tp": 1, "d_model": 128, "n_layer": 5, "seconds": 0.01, "comm_share": 0.0},
               {**row, "device": "cpu", "backend": "gloo", "tp": 2, "d_model": 160,
                "n_layer": 7, "seconds": 0.2, "comm_share": 0.3}],
    }
    (folder / f"figures-{name}.json").write_text(json.dumps(
        {"date": date, "device_kind": kind, "device_name": name, "quick": quick,
         "figures": figures}))


def test_the_reader_shows_the_newest_gpu_run_and_only_what_ran_on_a_gpu(tmp_path):
    assert gpu_figures.lines("01", "a source", tmp_path) == [gpu_figures.not_recorded("a source")]
    _write(tmp_path, "cpu-laptop", "cpu", "2030-01-01T00:00:00+00:00", "cpu")
    assert gpu_figures.newest_gpu_run(tmp_path) is None
    _write(tmp_path, "A100", "cuda", "2026-01-01T00:00:00+00:00", "cuda:0")
    _write(tmp_path, "H100", "cuda", "2026-06-01T00:00:00+00:00", "cuda:0")
    _write(tmp_path, "H200-quick", "cuda", "2026-07-01T00:00:00+00:00", "cuda:0", quick=True)
    shown = gpu_figures.lines("16", "a source", tmp_path)
    assert shown[0] == "GPU, recorded 2026-06-01 on H100 by bench/gpu_figures.py:"
    assert len(shown) == 2 and "t = 1" in shown[1]  # the t = 2 row ran on the CPU
    assert "1/β = 200.0 GB/s" in gpu_figures.lines("01", "x", tmp_path)[1]
    assert "full recompute" in gpu_figures.lines("07", "x", tmp_path)[1]
    with pytest.raises(ValueError):
        gpu_figures.gpu_rows(gpu_figures.newest_gpu_run(tmp_path), "05")
