"""``python -m minitp.calc.accuracy [PATH]``: writes docs/calc-accuracy.md (or PATH)."""

from .report import main

main()
