"""bench/moe_layer.py runs and prints its tables (a quick run, on its day:
helpers.BENCH_QUICK_RUNS rotates the benches' quick runs; no timing is asserted), and
imports (every run)."""

import re
import subprocess
import sys
from pathlib import Path

from helpers import BENCH_QUICK_RUNS, import_bench, on_its_day

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "moe_layer.py"


def test_the_bench_imports_and_has_its_presets():
    moe_layer = import_bench("moe_layer")
    assert set(moe_layer.PRESETS) == {"cpu", "gpu", "quick"} and callable(moe_layer.main)


@on_its_day("moe_layer", BENCH_QUICK_RUNS)
def test_the_tables_are_printed():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True,
                          text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    layer_rows = re.findall(r"^\| (\d+) \| [\d.]+ ms \| [\d.]+ ms \| ([\d.]+) \|", proc.stdout,
                            re.MULTILINE)
    assert [e for e, _ in layer_rows] == ["4"], proc.stdout  # the quick preset: E = 4
    rank_rows = re.findall(r"^\| (\d) \| [\d.]+ ms \| [\d.]+ ms \|.*\| (\d+) \| [\d.]+ kB \|",
                           proc.stdout, re.MULTILINE)
    # 2 MoE layers: counts, dispatch, combine forward; dispatch, combine backward
    assert rank_rows == [(str(r), "10") for r in range(4)], proc.stdout
    assert proc.stdout.count("minitp / peer: time") == 1, proc.stdout
