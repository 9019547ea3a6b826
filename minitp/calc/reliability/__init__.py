"""How often to save: Young's and Daly's intervals from a failure rate (`checkpointing`)."""
