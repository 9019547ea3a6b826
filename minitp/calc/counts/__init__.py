"""What the model holds and computes: parameter counts (`params`) and FLOPs, MFU, the
bubble and training time (`flops`)."""
