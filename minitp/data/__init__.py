"""What the models read, made or found on this machine (nothing is downloaded).

* `text`: the embedded corpus (the standard library's own source) and its batches;
  its names are this package's too (`mt.data.load_tokens`, `mt.data.get_batch`, ...);
* `images`: corpus lines rendered in a 3×5 bitmap font, one-byte patches, the
  vision-language batches;
* `packing`: the corpus's files as documents packed into rows, (x, y, positions)
  (`mt.data.packing.get_packed_batch`).
"""

from . import images, packing
from .text import (
    HELD_OUT_FRACTION,
    MAX_CORPUS_BYTES,
    VOCAB_SIZE,
    check_length,
    corpus_files,
    decode,
    encode,
    eval_batches,
    get_batch,
    load_tokens,
    split,
)

__all__ = ["HELD_OUT_FRACTION", "MAX_CORPUS_BYTES", "VOCAB_SIZE", "check_length", "corpus_files",
           "decode", "encode", "eval_batches", "get_batch", "images", "load_tokens", "packing",
           "split"]
