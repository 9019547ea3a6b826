"""Bytes a GPU holds: model states and activations (`memory`), the loss's (`loss`), a
context-parallel attention core's (`cp_core_memory`), FP8's with its scales (`fp8`) and Muon's
states (`muon`; the last two also price what they send)."""
