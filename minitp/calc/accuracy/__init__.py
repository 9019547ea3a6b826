"""mt.calc beside published runs: `report` sets the model's predictions beside the rows of
`rows` (each names its source) and writes docs/calc-accuracy.md. Not re-exported by
`minitp.calc`; run it as ``python -m minitp.calc.accuracy``."""
