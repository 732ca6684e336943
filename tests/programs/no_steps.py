"""A loop of matrix products that marks nothing: tuiprof can only cut it into time windows."""
import time

import torch

x = torch.randn(64, 64)
t_end = time.monotonic() + 0.5
n = 0
while time.monotonic() < t_end:
    x = torch.tanh(x @ x)
    n += 1
print(f"{n} products")
