"""Packed documents: several documents in one fixed-length row, each seeing only itself.

A packed batch is (x, y, positions), each (B, T) int64. ``positions`` is each token's
position in its document, restarting at 0 where a document starts; everything else
follows from it: the document index (`minitp.model.attention_core.document_ids`) and the
mask, query i sees key j if j ≤ i and both are in the same document. A target that would
cross into the next document (a document's last token predicting the next one's first) is
`IGNORE_INDEX`, and so is every padding target: neither is ever counted as a token.

The documents of the embedded corpus are its files (`minitp.data.text.corpus_files`), one
file's bytes a document. A batch draws them in an order seeded by (seed, step) alone, as
`minitp.data.text.get_batch` draws its windows (no loader state to save), starts at a seeded
offset into the first, and cuts the concatenation into rows of seq_len + 1 tokens.

A document longer than what is left of a row is split: its rest begins the next row, its
positions restarting at 0 there, as Megatron-LM's ``reset_position_ids`` does (position ids
count from 0 at every row start and after every end-of-document token:
``_get_ltor_masks_and_position_ids`` in ``megatron/core/datasets/gpt_dataset.py``). Continuing
them instead would make positions reach past seq_len, where learned positions have no row
and rotary ones were never trained; the cost is that the split document's second part does
not see its first, as in Megatron-LM.
"""

from __future__ import annotations

import torch

from ..rules import IGNORE_INDEX
from .text import HELD_OUT_FRACTION, MAX_CORPUS_BYTES, as_tokens, corpus_files

PAD = 0  # the padding token's id: never a target, never attended to by a real token


def corpus_documents(max_bytes: int = MAX_CORPUS_BYTES) -> list[torch.Tensor]:
    """The embedded corpus as documents: each file's bytes, a uint8 tensor, in file order."""
    documents = []
    for file in corpus_files(max_bytes):
        with open(file, "rb") as f:
            documents.append(as_tokens(f.read()))
    return documents


def row_positions(lengths: list[int]) -> torch.Tensor:
    """The positions of a row made of pieces of these lengths: 0..n−1 for each."""
    return torch.cat([torch.arange(n) for n in lengths])


def pack(documents: list[torch.Tensor], seq_len: int):
    """The documents, in order, cut into rows of seq_len + 1 tokens: (x, y, positions),
    each (rows, seq_len) int64. A document that does not fit what is left of a row goes on
    at the start of the next, its positions restarting (see the module); the last row, if
    the documents end before it does, is padded with `PAD` tokens, a document of their own
    whose targets are all `IGNORE_INDEX`."""
    width = seq_len + 1
    tokens, lengths, pads, used = [], [[]], [], 0  # lengths: each row's pieces
    for doc in documents:
        doc = doc.long()
        while len(doc):
            take = min(len(doc), width - used)
            tokens.append(doc[:take])
            lengths[-1].append(take)
            doc, used = doc[take:], used + take
            if used == width:
                lengths.append([])
                used = 0
    if used:  # the last row's padding
        tokens.append(torch.full((width - used,), PAD, dtype=torch.long))
        lengths[-1].append(width - used)
        pads.append(len(lengths) - 1)
    rows = torch.cat(tokens).view(-1, width) if tokens else torch.empty(0, width, dtype=torch.long)
    positions = torch.stack([row_positions(r) for r in lengths if r]) if tokens else rows
    x, y = rows[:, :-1], rows[:, 1:].clone()
    y[positions[:, 1:] == 0] = IGNORE_INDEX  # a target in the next document: not predicted
    for r in pads:  # every target of the padding, and the one that would predict it
        y[r, -lengths[r][-1]:] = IGNORE_INDEX
    return x, y, positions[:, :-1].contiguous()


def get_packed_batch(documents: list[torch.Tensor], step: int, batch_size: int, seq_len: int,
                     seed: int = 0):
    """The packed global batch of `step`: (x, y, positions), int64 (batch_size, seq_len).

    The documents in an order, and an offset into the first, drawn from a generator
    seeded by (seed, step) alone; then `pack`. The first row starts inside its document,
    so its positions start at 0 there, like every split document's rest."""
    if not any(len(d) for d in documents):  # the loop below would wait for tokens forever
        raise ValueError(f"nothing to pack: {len(documents)} documents, none with a token "
                         f"(an empty text file?)")
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    order = torch.randperm(len(documents), generator=generator).tolist()
    need = batch_size * (seq_len + 1)
    first = documents[order[0]]
    start = int(torch.randint(0, max(1, len(first) - 1), (1,), generator=generator))
    drawn, have = [first[start:]], len(first) - start
    while have < need:  # in the drawn order, round again if the corpus is short
        for i in order[1:] + order[:1]:
            drawn.append(documents[i])
            have += len(documents[i])
            if have >= need:
                break
    x, y, positions = pack(drawn, seq_len)
    return x[:batch_size], y[:batch_size], positions[:batch_size]


def split_documents(documents: list[torch.Tensor], held_out: float = HELD_OUT_FRACTION):
    """(train, held-out) documents: the concatenation cut where `minitp.data.text.split`
    cuts the same tokens, the document it falls in split in two."""
    total = sum(len(d) for d in documents)
    cut, seen = total - int(total * held_out), 0
    train, evaluation = [], []
    for doc in documents:
        inside = min(max(cut - seen, 0), len(doc))  # how much of it lies before the cut
        if inside:
            train.append(doc[:inside])
        if inside < len(doc):
            evaluation.append(doc[inside:])
        seen += len(doc)
    return train, evaluation


def eval_packed_batches(documents: list[torch.Tensor], count: int, batch_size: int,
                        seq_len: int, seed: int = 0):
    """`count` fixed packed batches of the held-out documents (the same at every evaluation)."""
    return [get_packed_batch(documents, i, batch_size, seq_len, seed) for i in range(count)]
