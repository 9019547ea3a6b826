"""The embedded corpus and the batches drawn from it.

Nothing is downloaded. The default text is the Python standard library's own
source: the top-level modules of ``sysconfig.get_paths()["stdlib"]`` whose
names start with a lower-case letter (``abc.py``, ``argparse.py``, ``ast.py``,
…), in sorted order, concatenated until `MAX_CORPUS_BYTES`. Names starting with
``_`` are left out because some of them are written at build time
(``_sysconfigdata_*.py`` holds the build's paths), so the same Python version
gives the same bytes on every machine. `corpus_files()` says exactly which
files were read.

Tokens are bytes (vocabulary 256): any text is already tokenised. The last
`HELD_OUT_FRACTION` of the tokens is held out for evaluation.

Batches are a pure function of (seed, step): the same global batch at step k
whatever the topology, so runs at different (dp, pp, tp) compare step for step,
and a run resumed at step k sees exactly the batches the uninterrupted run saw.
"""

from __future__ import annotations

import os
import sysconfig

import torch

MAX_CORPUS_BYTES = 2_000_000  # ~20 modules: plenty for a small model, read in milliseconds
HELD_OUT_FRACTION = 0.05
VOCAB_SIZE = 256


def corpus_files(max_bytes: int = MAX_CORPUS_BYTES) -> list[str]:
    """The standard-library files the embedded corpus is made of, in order."""
    stdlib = sysconfig.get_paths()["stdlib"]
    names = sorted(n for n in os.listdir(stdlib) if n.endswith(".py") and n[0].islower())
    files, total = [], 0
    for name in names:
        if total >= max_bytes:
            break
        path = os.path.join(stdlib, name)
        files.append(path)
        total += os.path.getsize(path)
    return files


def load_tokens(path: str | None = None, max_bytes: int = MAX_CORPUS_BYTES) -> torch.Tensor:
    """The corpus as a uint8 tensor of byte tokens: the embedded one, or the file at `path`.

    A file is read whole (no cap: it is the user's choice of text); the embedded
    corpus is cut at exactly `max_bytes`.
    """
    if path is not None:
        with open(path, "rb") as f:
            data = f.read()
    else:
        chunks = []
        for file in corpus_files(max_bytes):
            with open(file, "rb") as f:
                chunks.append(f.read())
        data = b"".join(chunks)[:max_bytes]
    return as_tokens(data)


def as_tokens(data: bytes) -> torch.Tensor:
    """Bytes as a uint8 tensor; an empty file's too (`torch.frombuffer` refuses b"")."""
    if not data:
        return torch.zeros(0, dtype=torch.uint8)
    # bytearray: torch.frombuffer wants a writable buffer.
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def split(tokens: torch.Tensor, held_out: float = HELD_OUT_FRACTION):
    """(train, held_out): the held-out part is the last `held_out` fraction of the tokens."""
    cut = len(tokens) - int(len(tokens) * held_out)
    return tokens[:cut], tokens[cut:]


def check_length(tokens: torch.Tensor, seq_len: int, what: str = "text") -> None:
    """A batch needs seq_len + 1 consecutive tokens (inputs and their next-token targets)."""
    if len(tokens) < seq_len + 1:
        raise ValueError(f"the {what} has {len(tokens)} tokens; seq_len={seq_len} needs at "
                         f"least {seq_len + 1}")


def get_batch(tokens: torch.Tensor, step: int, batch_size: int, seq_len: int, seed: int = 0):
    """The global batch of `step`: (x, y), int64 (batch_size, seq_len), y = x shifted by one.

    Windows start at offsets drawn from a generator seeded by (seed, step) alone,
    so no data-loader state needs saving to resume.
    """
    check_length(tokens, seq_len)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(tokens) - seq_len, (batch_size,), generator=generator)
    windows = torch.stack([tokens[s:s + seq_len + 1] for s in starts.tolist()]).long()
    return windows[:, :-1], windows[:, 1:]  # (B, T) each


def eval_batches(tokens: torch.Tensor, count: int, batch_size: int, seq_len: int, seed: int = 0):
    """`count` fixed batches of the held-out tokens (the same at every evaluation)."""
    return [get_batch(tokens, i, batch_size, seq_len, seed) for i in range(count)]


def decode(tokens) -> str:
    """Bytes back to text (invalid UTF-8, e.g. a character cut in half, shown as �)."""
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


def encode(text: str) -> torch.Tensor:
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)
