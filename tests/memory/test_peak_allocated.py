"""`peak_allocated` reads the most bytes alive at once, temporaries included."""

import torch

from minitp.memory import peak_allocated

MB4 = 1000 * 1000 * 4  # a float32 tensor of 10^6 elements


def test_the_peak_counts_what_is_alive_at_once_not_what_was_made():
    x = torch.randn(1000, 1000)

    def work():
        y = x * 2  # 4 MB
        z = y + 1  # 8 MB alive
        del y      # 4 MB
        w = z.exp()  # 8 MB alive again: the peak is two tensors, not the three made
        return w.sum()

    _, peak = peak_allocated(work)
    assert 2 * MB4 <= peak < 2 * MB4 + 1024  # the small sum's bytes aside
