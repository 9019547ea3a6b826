"""The text a `python -m minitp.train` run trains and evaluates on: the corpus (or
``--data``) split into a training part and a held-out part, as documents with ``--pack``,
each checked long enough for one sequence. Run in the parent, before any process starts."""

from __future__ import annotations

import torch

from .. import data
from ..data import packing
from ..rules import check_packing


def split_corpus(args, cfg) -> tuple:
    """(train_tokens, eval_tokens); a ValueError whose text is the one-line refusal."""
    if args.pack:
        try:
            check_packing(cfg.vision_patches)
        except ValueError as exc:
            raise ValueError(f"--pack: {exc}") from None
        documents = ([data.load_tokens(args.data)] if args.data
                     else packing.corpus_documents())
        train_tokens, eval_tokens = packing.split_documents(documents)
        whole = [torch.cat(docs) if docs else torch.zeros(0) for docs in (train_tokens,
                                                                           eval_tokens)]
    else:
        train_tokens, eval_tokens = data.split(data.load_tokens(args.data))
        whole = [train_tokens, eval_tokens]
    try:
        data.check_length(whole[0], cfg.seq_len, "training split")
        data.check_length(whole[1], cfg.seq_len, "held-out split (the last 5%)")
    except ValueError as exc:
        raise ValueError(f"{args.data or 'the corpus'}: {exc}") from None
    return train_tokens, eval_tokens
