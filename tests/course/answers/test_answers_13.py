"""Lesson 13: vision-language models.

Not checked: 13.encoder-sum, 13.split-bytes, 13.which-layout, whose numbers exist only in
`mt.calc.vision`'s model (the question calls it; there is no second source to compare with)."""

NOT_CHECKED = {"13.encoder-sum", "13.split-bytes", "13.which-layout"}
