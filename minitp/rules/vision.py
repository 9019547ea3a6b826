"""What a vision-language model (`minitp.model.vision`) may be split into: its encoder's layout
over tensor parallelism, and what it refuses; the image format it reads — written once, read by
`minitp.rules.check_parallel_config` and the CLI."""

from __future__ import annotations

from .heads import check_tp_widths

# How a vision-language model's encoder sits on a tensor-parallel group: "replicated" (whole on
# every rank, as lesson 15's source suggests for a small encoder) or "tensor" (its blocks
# split like the decoder's): `minitp.tensor_parallel.vision`.
VISION_LAYOUTS = ("replicated", "tensor")

# The image format. A patch is 2 wide × 4 tall binary pixels, 8 bits, so exactly one byte id
# (`minitp.data.images` draws them, `minitp.model.vision` reads them, `minitp.calc` counts
# them); a character's cell in the font is 4 × 8 pixels, so 2 × 2 = 4 patches.
PATCH_W, PATCH_H = 2, 4
CELL_W, CELL_H = 4, 8
PATCHES_PER_CHAR = (CELL_W // PATCH_W) * (CELL_H // PATCH_H)


def default_vision_patches(seq_len: int) -> int:
    """A vision-language model's image by default: half the sequence, in whole characters
    (`PATCHES_PER_CHAR` patches each)."""
    return seq_len // 2 // PATCHES_PER_CHAR * PATCHES_PER_CHAR


def check_vision_layout(cfg, layout: str, tp: int, cp: int = 1) -> None:
    """A vision encoder's layout over tp, and what a vision-language model refuses."""
    if layout not in VISION_LAYOUTS:
        raise ValueError(f"vision_layout must be one of {VISION_LAYOUTS}, got {layout!r}")
    if not getattr(cfg, "vision_patches", 0):
        if layout != "replicated":
            raise ValueError(f"vision_layout={layout!r} needs a vision-language model (this "
                             "one reads no image: vision_patches=0)")
        return
    if cp > 1:
        raise ValueError(f"cp={cp} with a vision-language model: not built (the encoder needs "
                         "the whole image on a rank, which the load-balanced split cuts up)")
    if layout == "tensor":
        try:
            check_tp_widths(cfg.vision_config, tp)
        except ValueError as err:
            raise ValueError(f"vision_layout='tensor': the vision encoder's {err}") from None
