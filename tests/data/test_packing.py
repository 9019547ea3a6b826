"""Packed batches (`minitp.data.packing`): positions restart at every document and at every
row's start, no target crosses into the next document, padding is never a target, and a
batch is a function of (seed, step) alone."""

from __future__ import annotations

import pytest
import torch

from minitp.data.packing import PAD, corpus_documents, get_packed_batch, pack
from minitp.model.attention_core import document_ids
from minitp.rules import IGNORE_INDEX

DOCS = [torch.arange(1, 6), torch.arange(10, 13), torch.arange(20, 29)]  # 5 + 3 + 9 tokens


def test_positions_restart_at_each_document_and_each_row():
    x, y, positions = pack(DOCS, seq_len=7)  # rows of 8 tokens: [5, 3], [8], [1, 7 pad]
    assert positions.tolist() == [[0, 1, 2, 3, 4, 0, 1],
                                  [0, 1, 2, 3, 4, 5, 6],
                                  [0, 0, 1, 2, 3, 4, 5]]
    assert document_ids(positions).tolist()[0] == [1, 1, 1, 1, 1, 2, 2]


def test_no_target_crosses_into_the_next_document():
    x, y, _ = pack(DOCS, seq_len=7)
    assert y[0].tolist() == [2, 3, 4, 5, IGNORE_INDEX, 11, 12]  # 5 does not predict 10
    assert x[0].tolist() == [1, 2, 3, 4, 5, 10, 11]


def test_padding_is_never_a_target():
    x, y, _ = pack(DOCS, seq_len=7)
    assert x[2].tolist() == [28, PAD, PAD, PAD, PAD, PAD, PAD]
    assert (y[2] == IGNORE_INDEX).all()  # 28 would predict a pad; the pads predict pads
    assert int((y != IGNORE_INDEX).sum()) == 4 + 2 + 7  # each document's n − 1, the split
    # document's two parts each one fewer: 9 tokens over rows 1 and 2 give 7 + 0


def test_a_batch_is_a_function_of_seed_and_step():
    docs = corpus_documents(max_bytes=200_000)
    a = get_packed_batch(docs, step=3, batch_size=4, seq_len=64, seed=1)
    b = get_packed_batch(docs, step=3, batch_size=4, seq_len=64, seed=1)
    c = get_packed_batch(docs, step=4, batch_size=4, seq_len=64, seed=1)
    assert all(torch.equal(s, t) for s, t in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    assert all(t.shape == (4, 64) and t.dtype == torch.int64 for t in a)


def test_a_corpus_batch_keeps_its_documents_apart():
    """Every document boundary in a corpus batch: its target ignored, its position 0."""
    docs = corpus_documents(max_bytes=200_000)
    lengths = {len(d) for d in docs}
    x, y, positions = get_packed_batch(docs, step=0, batch_size=64, seq_len=1024, seed=0)
    starts = positions[:, 1:] == 0
    assert starts.any(), "no document boundary drawn: the test would check nothing"
    assert (y[:, :-1][starts] == IGNORE_INDEX).all()
    assert int(positions.max()) < 1024 and min(lengths) > 0


def test_documents_without_a_token_are_refused_not_waited_on():
    """get_packed_batch drew documents until it had a batch's tokens: from empty ones, forever."""
    for documents in ([], [torch.zeros(0, dtype=torch.uint8)] * 2):
        with pytest.raises(ValueError, match="nothing to pack"):
            get_packed_batch(documents, 0, 2, 8)
