"""Serving: prefill and decode's FLOPs, bytes read and time per token (`serving`); the KV
cache of multi-head latent attention beside GQA's and MHA's (`latent_cache`)."""
