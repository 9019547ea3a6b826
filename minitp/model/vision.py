"""The vision half of a vision-language model: an image's patches read by a small
encoder and put where the sequence's first tokens were.

A sequence of a vision-language model is one int tensor, as every other: its first
P ids are an image's patches (2×4 binary pixels, exactly one byte each:
`minitp.data.images`), the rest text bytes. The model step `vision` (between the
token embedding and the positions, so a pipeline's first stage holds it and later
stages pass through) runs the encoder on the P patch ids — each byte unpacked into
its 8 pixels, a linear patch embedding (a ViT's), learned positions, GPT-2 blocks
whose attention sees the whole image (not causal), a LayerNorm — and a linear
projector into the decoder's width (LLaVA's first projector), then places the P
results before the text's embeddings: the decoder reads the image, then the text.

Placement is its own module (`PlacePrefix`), so that a parallel plan can swap it
without touching the encoder: under sequence parallelism each tensor-parallel rank
holds a slice of the sequence and places only the image tokens inside its slice
(`minitp.tensor_parallel.vision`). No parallel code here.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..data.images import PATCH_BITS

PATCH_PIXELS = len(PATCH_BITS)  # a patch is one byte: 2 wide × 4 tall binary pixels


def patch_pixels(ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Patch ids (..., P) -> their pixels (..., P, 8), 0 or 1, in `minitp.data.images`'s
    order (`PATCH_BITS`, written there once)."""
    return ((ids.unsqueeze(-1) & PATCH_BITS.to(ids.device)) != 0).to(dtype)


class PlacePrefix(nn.Module):
    """The image tokens (B, P, C) in place of the first P of the text's embeddings."""

    def forward(self, image, x):  # (B, P, C), (B, T, C) -> (B, T, C)
        return torch.cat([image, x[:, image.shape[1]:]], dim=1)


class VisionPrefix(nn.Module):
    """The model step `vision`: encodes the first P ids as an image and places it."""

    def __init__(self, cfg, make_block):
        super().__init__()
        enc = cfg.vision_config
        self.patches = cfg.vision_patches
        self.patch = nn.Linear(PATCH_PIXELS, enc.d_model)  # a ViT's patch embedding
        self.wpe = nn.Embedding(self.patches, enc.d_model)  # a learned position per patch
        self.blocks = nn.ModuleList(make_block(enc) for _ in range(enc.n_layer))
        self.ln = nn.LayerNorm(enc.d_model)
        self.proj = nn.Linear(enc.d_model, cfg.d_model)  # into the decoder's width
        self.place = PlacePrefix()

    def encode(self, ids):  # (B, P) patch ids -> (B, P, C) image tokens in the decoder's width
        x = self.patch(patch_pixels(ids, self.patch.weight.dtype)) + self.wpe.weight
        for block in self.blocks:
            x = block(x)
        return self.proj(self.ln(x))

    def forward(self, x, inputs):  # token embeddings (B, T', C), the ids (B, T)
        if inputs.shape[1] < self.patches:
            raise ValueError(f"a sequence of {inputs.shape[1]} ids is shorter than the image "
                             f"it must start with ({self.patches} patches)")
        return self.place(self.encode(inputs[:, :self.patches]), x)


class NoVision(nn.Module):
    """A text model's `vision` step: the embeddings as they are."""

    def forward(self, x, *_):
        return x
