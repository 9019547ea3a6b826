"""A step's time and the search for the fastest configuration: `timing` (`step_time`),
`plan` (enumerate, fit, rank), `search` (every configuration, by brute force) and
`pipeline_layout` (the layers over stages whose slowest stage is fastest)."""
