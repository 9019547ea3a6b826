"""Does the vision-language model read its images? Record the answer for lesson 15.

    python bench/vlm_reads.py                 # -> bench/results/vlm-reads.json (~1.5 min, CPU)
    python bench/vlm_reads.py --steps 10 --out /tmp/x.json   # a check that it runs

One process trains lesson 15's small VLM (`minitp.course.labs.vision_language.READING_CFG`)
twice from the same start on the same rendered batches: shown the images, and shown a blank
picture. Both are scored on held-out batches at the targets the image shows (the first
characters of the text) and at the rest (`vision_language.reading`). If the model reads,
the first loss is lower with the image than without, and the second about the same. The
lesson prints the committed record (`vision_language.show_reading`), with its date and
device: two minutes of training is more than a notebook cell should take.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
from pathlib import Path

import torch
from gpu_figures import cpu_model, versions  # bench/ is on the path: this script's folder
from tqdm import tqdm

import minitp as mt
from minitp.course.labs import vision_language


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--out", type=Path, default=vision_language.RECORDED)
    args = parser.parse_args(argv[1:])
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    started = time.perf_counter()
    with tqdm(total=2 * args.steps, desc="image, then blank", unit="step",
              mininterval=0.5, dynamic_ncols=True) as bar:
        result = vision_language.reading(steps=args.steps, progress=bar.update)
    seconds = time.perf_counter() - started
    device = mt.device()
    rec = {"script": "bench/vlm_reads.py", "command": shlex.join(["python", *argv]),
           "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                           else cpu_model()),
           "seconds": round(seconds, 1), **versions(), **result}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}", flush=True)
    vision_language.show_reading(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
