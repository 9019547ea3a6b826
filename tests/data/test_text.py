"""The embedded corpus is the same bytes every time; batches are a function of (seed, step)."""

import os
import sysconfig

import pytest
import torch

from minitp import data


def test_corpus_is_sorted_stdlib_modules_capped():
    files = data.corpus_files()
    stdlib = sysconfig.get_paths()["stdlib"]
    names = [os.path.basename(f) for f in files]
    assert names == sorted(names) and names[0] == "abc.py"
    assert all(os.path.dirname(f) == stdlib for f in files)
    assert all(n[0].islower() for n in names)  # no _sysconfigdata_*: build-specific
    sizes = [os.path.getsize(f) for f in files]
    # The cap: the files before the last one are under it, all of them reach it.
    assert sum(sizes[:-1]) < data.MAX_CORPUS_BYTES <= sum(sizes)


def test_corpus_bytes_are_the_files_bytes_and_repeat():
    tokens = data.load_tokens()
    assert tokens.dtype == torch.uint8 and len(tokens) == data.MAX_CORPUS_BYTES
    expected = b"".join(open(f, "rb").read() for f in data.corpus_files())
    assert bytes(tokens.tolist()) == expected[: data.MAX_CORPUS_BYTES]
    assert torch.equal(tokens, data.load_tokens())


def test_own_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("héllo, world\n" * 3)
    tokens = data.load_tokens(str(path))
    assert bytes(tokens.tolist()) == path.read_bytes()
    assert data.decode(data.encode("héllo")) == "héllo"


def test_split_holds_out_the_last_five_percent():
    tokens = torch.arange(1000) % 256
    train, held_out = data.split(tokens)
    assert len(held_out) == 50 and torch.equal(torch.cat([train, held_out]), tokens)
    assert torch.equal(held_out, tokens[-50:])


def test_batches_are_windows_and_depend_only_on_seed_and_step():
    tokens = torch.arange(256, dtype=torch.uint8)  # token i sits at offset i
    x, y = data.get_batch(tokens, step=3, batch_size=5, seq_len=7, seed=1)
    assert x.shape == y.shape == (5, 7) and x.dtype == y.dtype == torch.int64
    for row_x, row_y in zip(x, y, strict=True):
        start = int(row_x[0])
        assert torch.equal(row_x, torch.arange(start, start + 7))
        assert torch.equal(row_y, row_x + 1)  # the next-token targets
    again = data.get_batch(tokens, step=3, batch_size=5, seq_len=7, seed=1)
    assert torch.equal(x, again[0]) and torch.equal(y, again[1])
    assert not torch.equal(x, data.get_batch(tokens, 4, 5, 7, seed=1)[0])
    assert not torch.equal(x, data.get_batch(tokens, 3, 5, 7, seed=2)[0])


def test_eval_batches_are_fixed():
    tokens = torch.arange(256, dtype=torch.uint8)
    a = data.eval_batches(tokens, 3, 2, 5, seed=0)
    b = data.eval_batches(tokens, 3, 2, 5, seed=0)
    assert len(a) == 3 and all(torch.equal(p[0], q[0]) for p, q in zip(a, b, strict=True))


def test_too_short_text_is_a_clear_error():
    with pytest.raises(ValueError, match="seq_len=8 needs at least 9"):
        data.get_batch(torch.zeros(8, dtype=torch.uint8), 0, 1, 8)


def test_an_empty_file_is_no_tokens(tmp_path):
    """torch.frombuffer refuses b"": an empty --data file was a ValueError traceback."""
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert data.load_tokens(str(empty)).shape == (0,)
