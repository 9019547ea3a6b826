"""Lesson 27: latent attention and folded experts.

Not checked: none."""

import re

from answers_common import asked, close

NOT_CHECKED = set()


def test_27_cache_per_rank():
    # DeepSeek-V2 §2.1.4: (d_c + d_h^R)·l elements a token, on every tp rank (the latent is
    # read whole by every head, so tp does not divide it).
    for _, p, right in asked("27.cache-per-rank"):
        assert close(right, (p["d_c"] + p["r"]) * p["layers"] * p["bytes"] * p["B"] * p["T"] / 1e9)


def test_27_duplicated_rows():
    # Without SP every tp rank of a dp rank routes the same tokens through whole experts.
    for _, p, right in asked("27.duplicated-rows"):
        assert right == p["dp"] * p["tp"] * p["tokens"] * p["k"]


def test_27_ep_layout():
    # The one layout with ep over every rank (ep = dp·tp), its tokens sequence-parallel.
    for q, p, right in asked("27.ep-layout"):
        options = dict(re.findall(r"\(([a-d])\) ([^;]+)", q.text(p)))
        assert options[right].startswith(f"ep = {p['dp'] * p['tp']}:"), options
        assert "sequence-parallel" in options[right]
