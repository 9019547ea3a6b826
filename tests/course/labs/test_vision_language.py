"""bench/vlm_reads.py runs and writes the record lesson 15 prints (`show_reading`; the
lesson's checked cell asserts what the committed record shows)."""

import subprocess
import sys
from pathlib import Path

from minitp.course.labs import vision_language

ROOT = Path(__file__).resolve().parents[3]


def test_a_short_run_writes_a_record_the_lesson_can_show(tmp_path, capsys):
    out = tmp_path / "reads.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "vlm_reads.py"), "--steps", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=240,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = vision_language.show_reading(out)
    assert rec["steps"] == 2 and rec["command"].endswith(f"--steps 2 --out {out}")
    for shown in ("image", "blank"):
        assert set(rec[shown]) == {"read", "rest"} and all(v > 0 for v in rec[shown].values())
    assert "loss where the image shows the text" in capsys.readouterr().out


def test_no_record_is_said_plainly(tmp_path, capsys):
    assert vision_language.show_reading(tmp_path / "none.json") is None
    assert "No run of bench/vlm_reads.py is recorded" in capsys.readouterr().out
