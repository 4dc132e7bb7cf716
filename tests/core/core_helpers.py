"""Constants shared by the core tests (a module of its own: test modules
must not import ``conftest``, whose name other test folders share)."""

import torch

PAGED_SHAPE = torch.Size([2, 2, 16, 8])
PAGED_DTYPE = torch.float16
PAGED_BYTES = PAGED_SHAPE.numel() * 2
