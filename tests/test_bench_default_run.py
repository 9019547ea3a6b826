"""bench/default_run.py, the measurements docs/default-run.md's table comes from: it runs,
prints one row per setting (its day's run: helpers.BENCH_QUICK_RUNS rotates the benches'
quick runs), and its "(the default)" row is the CLI's default (every run)."""

import math
import re
import subprocess
import sys
from pathlib import Path

from helpers import BENCH_QUICK_RUNS, import_bench, on_its_day

from minitp import train

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "default_run.py"


@on_its_day("default_run", BENCH_QUICK_RUNS)
def test_the_table_is_printed_for_every_setting():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--steps", "3", "--no-ranks"],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = re.findall(r"^\| (.+) \| (\d+\.\d\d) \|$", proc.stdout, re.MULTILINE)
    assert len(rows) == 7, proc.stdout
    losses = [float(loss) for _, loss in rows]
    # 3 steps from ln(256) = 5.55: below it, and not absurdly far (the corpus is the running
    # Python's standard library: on 3.12 one setting reached 3.99 where 3.11's stay above 4.6)
    assert all(3.0 < loss < math.log(256) for loss in losses), losses


def test_the_default_row_is_the_cli_default():
    default_run = import_bench("default_run")
    (label, flags), = [s for s in default_run.SETTINGS if "(the default)" in s[0]]
    defaults = train.build_parser().parse_args([])
    assert flags == [] and label.startswith(f"batch {defaults.batch_size}, lr 2e-3")
    assert defaults.lr == 2e-3 and defaults.lr_schedule == "constant"
    assert (defaults.batch_size, defaults.microbatches) in default_run.COSTS
