"""ex27's run on each rank: the library's tensor-parallel plan of a latent-attention GPT at
tp = 2, with the learner's answer deciding which latent-attention gradients the step sums
over tp, trained one AdamW step beside one device (`minitp.course.labs.modern_transformer`'s
loop). Returns the largest loss and parameter differences and how far the two ranks'
copies of layer 0's W^KR drifted apart."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...model.config import GPTConfig
from ..labs.modern_transformer import side_by_side
from ..labs.zero_bubble import random_batch

CFG = GPTConfig.mla(vocab_size=32, seq_len=8, n_layer=2, n_head=4, d_model=16,
                    q_lora_rank=8, kv_lora_rank=8, rope_dim=4)


def in_rank(summed: list[str]) -> dict:
    def spoil(model):
        for name, p in model.named_parameters():
            parts = name.split(".")
            if "attn" in parts and parts[parts.index("attn") + 1] != "core":
                p.grad_partial_over_tp = parts[parts.index("attn") + 1] in summed

    run = side_by_side(dict(tp=2), {}, CFG, spoil=spoil, batches=[random_batch(CFG, 2, seed=0)])
    weight = run["model"].blocks[0].attn.k_rope.weight.detach().contiguous()
    copies = [torch.zeros_like(weight) for _ in range(2)]
    dist.all_gather(copies, weight, group=run["mesh"].tp.group)
    return dict(loss_gap=run["loss_gap"], param_gap=run["param_gap"],
                copies_apart=(copies[0] - copies[1]).abs().max().item())
