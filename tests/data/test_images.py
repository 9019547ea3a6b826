"""Rendered corpus images: every byte legible, patches are bytes, batches reproducible."""

import itertools

import pytest
import torch

from minitp import data
from minitp.data import images as vd
from minitp.rules import IGNORE_INDEX


def text_tokens(n=400):
    return torch.tensor(list(bytes(range(256)) * (n // 256 + 1))[:n], dtype=torch.uint8)


def test_every_printable_glyph_is_distinct_and_unlike_the_unknown_one():
    assert sorted(map(ord, vd.FONT)) == list(vd.PRINTABLE)
    cells = {b: vd.render(bytes([b])) for b in range(256)}
    printable = [cells[b] for b in vd.PRINTABLE]
    for a, b in itertools.combinations(printable, 2):
        assert not torch.equal(a, b)
    unknown = cells[0]
    assert all(not torch.equal(unknown, c) for c in printable)
    for b in [*range(32), 127, 128, 200, 255]:  # control bytes, DEL, UTF-8 bytes: one glyph
        assert torch.equal(cells[b], unknown)
    assert not cells[ord(" ")].any()
    # The glyph stays in columns 0-2 and rows 1-5 of its 4 x 8 cell: the rest is spacing.
    every = torch.stack(list(cells.values())).any(dim=0)
    assert every.shape == (vd.CELL_H, vd.CELL_W)
    assert not every[:, 3].any() and not every[0].any() and not every[6:].any()


def test_render_shape_and_inputs():
    image = vd.render(b"Hello")
    assert image.dtype == torch.bool and image.shape == (vd.CELL_H, vd.CELL_W * 5)
    assert torch.equal(image, vd.render(torch.tensor(list(b"Hello"), dtype=torch.int32)))
    assert torch.equal(image[:, 4:8], vd.render(b"e"))
    with pytest.raises(ValueError, match="byte values 0..255; got values in -1..300"):
        vd.render(torch.tensor([65, 300, -1]))
    with pytest.raises(ValueError, match="1-D integer tensor; got torch.float32"):
        vd.render(torch.tensor([65.0]))
    with pytest.raises(TypeError, match="encode a str first"):
        vd.render("Hello")


@pytest.mark.parametrize("text", [b"A", b"def f(x):", b"\tTabs & UTF-8 \xc3\xa9\n", b"~{|}`"])
def test_patches_round_trip(text):
    image = vd.render(text)
    patches = vd.to_patches(image)
    assert patches.dtype == torch.uint8 and len(patches) == vd.image_tokens(len(text))
    assert vd.image_tokens(len(text)) == 4 * len(text)
    assert torch.equal(vd.from_patches(patches, len(text)), image)
    assert torch.equal(vd.from_patches(patches.long(), len(text)), image)


def test_patch_bit_order_by_hand():
    # 'A' in its cell: rows 0-3 of columns 0-1 are  ..  .#  #.  ##  -> bits 00 01 10 11.
    patches = vd.to_patches(vd.render(b"A"))
    assert patches[0] == 0b00_01_10_11 == 27
    # Columns 2-3 of rows 0-3: .. .. #. #. ; rows 4-7 of both halves: #. #. .. ..
    assert patches.tolist() == [27, 0b00_00_10_10, 0b10_10_00_00, 0b10_10_00_00]
    # Row-major over the patch grid: for "AB" the top row of patches (A then B) comes first.
    ab = vd.to_patches(vd.render(b"AB")).tolist()
    b = vd.to_patches(vd.render(b"B")).tolist()
    assert ab == patches[:2].tolist() + b[:2] + patches[2:].tolist() + b[2:]
    # The most significant bit is the top-left pixel.
    image = torch.zeros(4, 2, dtype=torch.bool)
    image[0, 0] = True
    assert vd.to_patches(image).tolist() == [128]


def test_patch_sizes_are_checked():
    with pytest.raises(ValueError, match=r"multiple of 4 and W of 2; got shape \(6, 4\)"):
        vd.to_patches(torch.zeros(6, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"got shape \(8, 3\)"):
        vd.to_patches(torch.zeros(8, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="an image of 2 characters has 8 patches; got 7"):
        vd.from_patches(torch.zeros(7, dtype=torch.uint8), 2)
    with pytest.raises(ValueError, match="positive whole number of characters; got 0"):
        vd.image_tokens(0)


def test_vlm_batch_layout():
    tokens = data.load_tokens()
    batch, seq_len, chars = 3, 40, 6
    P, L = 4 * chars, 40 - 4 * chars
    x, y = vd.get_vlm_batch(tokens, 5, batch, seq_len, chars, seed=1)
    assert x.shape == y.shape == (batch, seq_len) and x.dtype == y.dtype == torch.int64
    assert (y[:, :P - 1] == IGNORE_INDEX).all()
    # The text: x[:, P:] are the window's first L bytes, y[:, P-1:] its first L + 1.
    assert torch.equal(y[:, P:], torch.cat([x[:, P + 1:], y[:, -1:]], dim=1))
    assert torch.equal(y[:, P - 1:-1], x[:, P:])
    # The windows are minitp.data's at seq_len L: same seeding, same draw.
    text_x, text_y = data.get_batch(tokens, 5, batch, L, seed=1)
    assert torch.equal(x[:, P:], text_x) and torch.equal(y[:, P:], text_y)
    # The image is the picture of the first image_chars text targets.
    assert (x[:, :P] >= 0).all() and (x[:, :P] <= 255).all()
    for b in range(batch):
        targets = y[b, P - 1:P - 1 + chars]
        assert torch.equal(vd.image_of(x[b], chars), vd.render(targets))
        assert torch.equal(vd.from_patches(x[b, :P], chars), vd.render(targets))


def test_vlm_batch_is_a_function_of_seed_and_step():
    tokens = text_tokens()
    first = vd.get_vlm_batch(tokens, 3, 4, 16, 2, seed=7)
    again = vd.get_vlm_batch(tokens, 3, 4, 16, 2, seed=7)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], vd.get_vlm_batch(tokens, 4, 4, 16, 2, seed=7)[0])
    assert not torch.equal(first[0], vd.get_vlm_batch(tokens, 3, 4, 16, 2, seed=8)[0])


def test_vlm_batch_uses_the_whole_corpus_and_no_more():
    # L + 1 = 9 bytes: exactly one window fits, so the start must be 0.
    tokens = text_tokens(9)
    x, y = vd.get_vlm_batch(tokens, 0, 2, 12, 1)
    assert torch.equal(y[:, 3:], tokens.long().expand(2, 9))


def test_vlm_batch_errors():
    tokens = text_tokens()
    with pytest.raises(ValueError, match="takes 16 image tokens; seq_len=16 must be more"):
        vd.get_vlm_batch(tokens, 0, 2, 16, 4)
    with pytest.raises(ValueError, match="positive whole number of characters; got 0"):
        vd.get_vlm_batch(tokens, 0, 2, 16, 0)
    with pytest.raises(ValueError, match="image_chars=5 but a window holds only 2 text bytes"):
        vd.get_vlm_batch(tokens, 0, 2, 21, 5)
    short = r"corpus \(for 9 text inputs .* has 9 tokens; seq_len=9 needs at least 10"
    with pytest.raises(ValueError, match=short):
        vd.get_vlm_batch(text_tokens(9), 0, 2, 13, 1)


def test_the_model_unpacks_each_patch_into_the_pixels_it_was_drawn_from():
    """`minitp.model.vision.patch_pixels` (the model's side) inverts `to_patches` (the data's): the
    same bit order, written once (`PATCH_BITS`). A flipped order would still train, so
    only this test would see it."""
    from minitp.model.vision import patch_pixels

    image = vd.render(b"Ab~")
    pixels = patch_pixels(vd.to_patches(image).long(), torch.float32)  # (P, 8)
    rows, cols = image.shape[0] // vd.PATCH_H, image.shape[1] // vd.PATCH_W
    grid = image.reshape(rows, vd.PATCH_H, cols, vd.PATCH_W).permute(0, 2, 1, 3).reshape(-1, 8)
    assert torch.equal(pixels, grid.float())
