"""Images a vision-language model can learn from, made at run time from the corpus.

Nothing is downloaded. An image is a line of the embedded corpus (`minitp.data`)
drawn with the tiny bitmap font below: every printable ASCII byte has its own
3x5 glyph, every other byte (tab, newline, UTF-8 continuation bytes, …) one solid
"unknown" block. A glyph sits in a `CELL_W` x `CELL_H` = 4 x 8 character cell,
glyph at columns 0-2 and rows 1-5, the blank rest spacing characters and lines:

    column: 0123        'A' in its cell
    row 0   ....
    row 1   .#..
    row 2   #.#.
    row 3   ###.
    row 4   #.#.
    row 5   #.#.
    row 6   ....
    row 7   ....

The patch = one byte trick. A patch is `PATCH_W` x `PATCH_H` = 2 x 4 binary
pixels: 8 bits, exactly one byte, so a patch is a token id in 0..255 like a text
byte, and a character cell is 2 x 2 = `PATCHES_PER_CHAR` patches. A batch then
stays one int64 tensor of token ids, which every parallel layout (data, tensor,
pipeline, context, expert) already carries, splits and sends: the first
P = `image_tokens(chars)` ids of a sequence are the image's patches, the rest text
bytes. No new tensor has to travel beside the ids.

How the model reads patches: a byte id here means pixels, not a letter. A later
module unpacks each of the first P ids into its 8 pixels (the bit order is
`PATCH_BITS`) and embeds them with a linear map, as a ViT's patch embedding is a
linear map of a patch's pixels; the text ids go through the token embedding.

Batches are a pure function of (seed, step), as in `minitp.data.get_batch` (whose
window draw is reused): the same global batch at step k whatever the topology,
so runs compare step for step and a resumed run sees the batches it would have.
"""

from __future__ import annotations

import torch

from ..rules import CELL_H, CELL_W, IGNORE_INDEX, PATCH_H, PATCH_W, PATCHES_PER_CHAR
from .text import check_length, eval_batches, get_batch

GLYPH_W, GLYPH_H = 3, 5
# the cell (`minitp.rules.vision`: CELL_W x CELL_H) leaves one blank column after the glyph,
# rows above and below it
GLYPH_TOP = 1  # the glyph's first row in its cell
# Bit order, written once: byte = sum(pixel[r][c] << (7 - (r * PATCH_W + c))),
# r in 0..3, c in 0..1 — the most significant bit is the top-left pixel.
PATCH_BITS = torch.tensor([1 << (7 - i) for i in range(PATCH_H * PATCH_W)])

# Each glyph as its 5 rows, top to bottom, '#' a set pixel. Letters, digits and
# punctuation that look alike elsewhere (O and 0, l and 1 and I, …) differ here:
# the model must tell every byte apart from the pixels alone.
FONT = {
    " ": "... ... ... ... ...", "!": ".#. .#. .#. ... .#.", '"': "#.# #.# ... ... ...",
    "#": "#.# ### #.# ### #.#", "$": ".## ##. .#. .## ##.", "%": "#.# ..# .#. #.. #.#",
    "&": ".#. #.# .#. #.# .##", "'": ".#. .#. ... ... ...", "(": "..# .#. .#. .#. ..#",
    ")": "#.. .#. .#. .#. #..", "*": "... #.# .#. #.# ...", "+": "... .#. ### .#. ...",
    ",": "... ... ... .#. #..", "-": "... ... ### ... ...", ".": "... ... ... ... .#.",
    "/": "..# ..# .#. #.. #..", "0": "### #.# #.# #.# ###", "1": ".#. ##. .#. .#. ###",
    "2": "##. ..# .#. #.. ###", "3": "##. ..# .#. ..# ##.", "4": "#.# #.# ### ..# ..#",
    "5": "### #.. ##. ..# ##.", "6": ".## #.. ### #.# ###", "7": "### ..# .#. .#. .#.",
    "8": "### #.# ### #.# ###", "9": "### #.# ### ..# ##.", ":": "... .#. ... .#. ...",
    ";": "... .#. ... .#. #..", "<": "..# .#. #.. .#. ..#", "=": "... ### ... ### ...",
    ">": "#.. .#. ..# .#. #..", "?": "##. ..# .#. ... .#.", "@": ".#. #.# ### #.. .##",
    "A": ".#. #.# ### #.# #.#", "B": "##. #.# ##. #.# ##.", "C": ".## #.. #.. #.. .##",
    "D": "##. #.# #.# #.# ##.", "E": "### #.. ### #.. ###", "F": "### #.. ### #.. #..",
    "G": ".## #.. #.# #.# .##", "H": "#.# #.# ### #.# #.#", "I": "### .#. .#. .#. ###",
    "J": "..# ..# ..# #.# .#.", "K": "#.# #.# ##. #.# #.#", "L": "#.. #.. #.. #.. ###",
    "M": "#.# ### ### #.# #.#", "N": "##. #.# #.# #.# #.#", "O": ".#. #.# #.# #.# .#.",
    "P": "##. #.# ##. #.. #..", "Q": ".#. #.# #.# ##. .##", "R": "##. #.# ##. #.# #.#",
    "S": ".## #.. .#. ..# ##.", "T": "### .#. .#. .#. .#.", "U": "#.# #.# #.# #.# ###",
    "V": "#.# #.# #.# .#. .#.", "W": "#.# #.# ### ### #.#", "X": "#.# #.# .#. #.# #.#",
    "Y": "#.# #.# .#. .#. .#.", "Z": "### ..# .#. #.. ###", "[": "##. #.. #.. #.. ##.",
    "\\": "#.. #.. .#. ..# ..#", "]": ".## ..# ..# ..# .##", "^": ".#. #.# ... ... ...",
    "_": "... ... ... ... ###", "`": "#.. .#. ... ... ...", "a": "... ##. .## #.# ###",
    "b": "#.. #.. ##. #.# ##.", "c": "... ... .## #.. .##", "d": "..# ..# .## #.# .##",
    "e": "... .#. ### #.. .##", "f": ".## #.. ### #.. #..", "g": "... .## #.# .## ###",
    "h": "#.. #.. ##. #.# #.#", "i": ".#. ... .#. .#. .#.", "j": "..# ... ..# #.# .#.",
    "k": "#.. #.# ##. ##. #.#", "l": "##. .#. .#. .#. ###", "m": "... ... ### ### #.#",
    "n": "... ... ##. #.# #.#", "o": "... ... .#. #.# .#.", "p": "... ##. #.# ##. #..",
    "q": "... .## #.# .## ..#", "r": "... ... .## #.. #..", "s": "... ... .## .#. ##.",
    "t": ".#. ### .#. .#. .##", "u": "... ... #.# #.# .##", "v": "... ... #.# #.# .#.",
    "w": "... ... #.# ### ###", "x": "... ... #.# .#. #.#", "y": "... #.# .## ..# ##.",
    "z": "... ... ##. .#. .##", "{": ".## .#. ##. .#. .##", "|": ".#. .#. .#. .#. .#.",
    "}": "##. .#. .## .#. ##.", "~": "... ##. .## ... ...",
}
UNKNOWN = "### ### ### ### ###"  # any byte outside 32..126: a solid block, like no glyph above
PRINTABLE = range(32, 127)


def _glyph(rows: str) -> torch.Tensor:
    """'#.# ...' -> (GLYPH_H, GLYPH_W) bool."""
    grid = [[pixel == "#" for pixel in row] for row in rows.split()]
    if len(grid) != GLYPH_H or any(len(row) != GLYPH_W for row in grid):
        raise ValueError(f"a glyph is {GLYPH_H} rows of {GLYPH_W}; got {rows!r}")
    return torch.tensor(grid)


def _cell_table() -> torch.Tensor:
    """(256, CELL_H, CELL_W) bool: the character cell of every byte value."""
    cells = torch.zeros(256, CELL_H, CELL_W, dtype=torch.bool)
    for byte in range(256):
        rows = FONT[chr(byte)] if byte in PRINTABLE else UNKNOWN
        cells[byte, GLYPH_TOP:GLYPH_TOP + GLYPH_H, :GLYPH_W] = _glyph(rows)
    return cells


_CELLS = _cell_table()  # built once: rendering is then one index


def _as_bytes(text, what: str = "text") -> torch.Tensor:
    """bytes or a 1-D integer tensor of byte values -> 1-D int64 tensor."""
    if isinstance(text, (bytes, bytearray)):
        return torch.tensor(list(text), dtype=torch.long)
    if not isinstance(text, torch.Tensor):
        raise TypeError(f"the {what} must be bytes or a 1-D integer tensor; got "
                        f"{type(text).__name__} (encode a str first)")
    if text.dim() != 1 or text.dtype.is_floating_point or text.dtype.is_complex \
            or text.dtype == torch.bool:
        raise ValueError(f"the {what} must be a 1-D integer tensor; got {text.dtype} of "
                         f"shape {tuple(text.shape)}")
    text = text.long().cpu()  # images are drawn on the CPU, as the batches are made
    if len(text) and (text.min() < 0 or text.max() > 255):
        raise ValueError(f"the {what} must hold byte values 0..255; got values in "
                         f"{int(text.min())}..{int(text.max())}")
    return text


def render(text) -> torch.Tensor:
    """The bool image (CELL_H, CELL_W * len(text)) of `text`, one cell per byte."""
    cells = _CELLS[_as_bytes(text)]  # (n, CELL_H, CELL_W)
    return cells.permute(1, 0, 2).reshape(CELL_H, CELL_W * len(cells))


def to_patches(image: torch.Tensor) -> torch.Tensor:
    """An (H, W) bool image -> its (P,) uint8 patches, row-major over the patch grid."""
    if image.dim() != 2 or image.shape[0] % PATCH_H or image.shape[1] % PATCH_W:
        raise ValueError(f"an image must be (H, W) with H a multiple of {PATCH_H} and W of "
                         f"{PATCH_W}; got shape {tuple(image.shape)}")
    height, width = image.shape
    # (rows of patches, pixel row, columns of patches, pixel column) -> patch-major.
    grid = image.bool().reshape(height // PATCH_H, PATCH_H, width // PATCH_W, PATCH_W)
    pixels = grid.permute(0, 2, 1, 3).reshape(-1, PATCH_H * PATCH_W)  # (P, 8)
    return (pixels.long() * PATCH_BITS.to(image.device)).sum(dim=1).to(torch.uint8)


def from_patches(patches: torch.Tensor, chars: int) -> torch.Tensor:
    """The inverse of `to_patches` for an image of `chars` characters: (CELL_H, CELL_W * chars)."""
    patches = _as_bytes(patches, "patches")
    if len(patches) != image_tokens(chars):
        raise ValueError(f"an image of {chars} characters has {image_tokens(chars)} patches; "
                         f"got {len(patches)}")
    pixels = (patches[:, None] & PATCH_BITS) != 0  # (P, 8)
    grid = pixels.reshape(CELL_H // PATCH_H, CELL_W * chars // PATCH_W, PATCH_H, PATCH_W)
    return grid.permute(0, 2, 1, 3).reshape(CELL_H, CELL_W * chars)


def image_tokens(chars: int) -> int:
    """P: how many patch tokens an image of `chars` characters takes."""
    if not isinstance(chars, int) or isinstance(chars, bool) or chars < 1:
        raise ValueError(f"an image holds a positive whole number of characters; got {chars!r}")
    return PATCHES_PER_CHAR * chars


def get_vlm_batch(tokens: torch.Tensor, step: int, batch_size: int, seq_len: int,
                  image_chars: int, seed: int = 0):
    """The global batch of `step`: (x, y), int64 (batch_size, seq_len), image then text.

    With P = image_tokens(image_chars) and L = seq_len - P, each row is a window
    s of L + 1 corpus bytes: x = (patches of render(s[:image_chars]), s[:L]) and
    y = (P - 1 times IGNORE_INDEX, s[:L + 1]). The last patch position predicts
    s[0], so the first image_chars text bytes are predicted from the picture of
    them. The windows are `minitp.data.get_batch`'s at seq_len L: same seeding,
    same draw, starts in [0, len(tokens) - (L + 1)].
    """
    patches = image_tokens(image_chars)
    if patches >= seq_len:
        raise ValueError(f"image_chars={image_chars} takes {patches} image tokens; seq_len="
                         f"{seq_len} must be more, to leave at least one text input")
    text_len = seq_len - patches
    if image_chars > text_len + 1:
        raise ValueError(f"image_chars={image_chars} but a window holds only {text_len + 1} "
                         f"text bytes (seq_len={seq_len} less {patches} image tokens, plus one)")
    check_length(tokens, text_len, f"corpus (for {text_len} text inputs after {patches} "
                                   f"image tokens)")
    text_x, text_y = get_batch(tokens, step, batch_size, text_len, seed)
    windows = torch.cat([text_x[:, :1], text_y], dim=1)  # (B, L + 1): s
    images = torch.stack([to_patches(render(s[:image_chars])) for s in windows]).long()
    ignored = torch.full((batch_size, patches - 1), IGNORE_INDEX, dtype=torch.long)
    return torch.cat([images, text_x], dim=1), torch.cat([ignored, windows], dim=1)


def image_of(x_row: torch.Tensor, image_chars: int) -> torch.Tensor:
    """The bool image a row of `get_vlm_batch`'s x starts with: what the model saw."""
    return from_patches(x_row[:image_tokens(image_chars)], image_chars)


def image_chars_of(cfg) -> int:
    """The characters an image of `cfg` (a GPTConfig with ``vision_patches``) shows."""
    if cfg.vision_patches % PATCHES_PER_CHAR:
        raise ValueError(f"vision_patches={cfg.vision_patches}: the rendered images are whole "
                         f"characters of {PATCHES_PER_CHAR} patches each")
    return cfg.vision_patches // PATCHES_PER_CHAR


def batch_for(cfg, tokens: torch.Tensor, step: int, batch_size: int, seed: int = 0):
    """The global batch of `step` for `cfg`'s model: text (`minitp.data.get_batch`), or for
    a vision-language model an image of the text's first characters, then the text."""
    if not cfg.vision_patches:
        return get_batch(tokens, step, batch_size, cfg.seq_len, seed)
    return get_vlm_batch(tokens, step, batch_size, cfg.seq_len, image_chars_of(cfg), seed)


def eval_batches_for(cfg, tokens: torch.Tensor, count: int, batch_size: int, seed: int = 0):
    """`count` fixed batches for `cfg`'s model, as `minitp.data.eval_batches` draws them."""
    if not cfg.vision_patches:
        return eval_batches(tokens, count, batch_size, cfg.seq_len, seed)
    return [batch_for(cfg, tokens, i, batch_size, seed) for i in range(count)]


def prompt_image(cfg, prompt: bytes) -> torch.Tensor:
    """(1, P) patch ids: the picture a vision-language model is shown before `prompt` — its
    first characters, as in training; spaces where the prompt is shorter than the picture
    (a blank there: nothing the model must read) — or (1, 0) for a text model."""
    if not cfg.vision_patches:
        return torch.zeros(1, 0, dtype=torch.long)
    chars = image_chars_of(cfg)
    shown = bytes(prompt[:chars]).ljust(chars, b" ")
    return to_patches(render(shown)).long()[None]
