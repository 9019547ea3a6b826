"""Serving: prefill and decode's FLOPs, bytes read and time per token (`serving`)."""
