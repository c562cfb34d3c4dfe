"""The device that device-aware tests run on: ``LIGHTNING_HALO_DEVICE`` = ``cpu`` (default) or ``cuda``.

The same test code runs on CPU in CI and on a CUDA machine in ``tools/gpu_check.sh``
(``LIGHTNING_HALO_DEVICE=cuda``); tests meant for both carry the ``device`` marker. Asking for
CUDA where there is none is an error, not a skip, so a GPU check cannot pass on CPU by accident.
"""

from __future__ import annotations

import os

import torch

DEVICE = os.environ.get("LIGHTNING_HALO_DEVICE", "cpu")
if DEVICE not in ("cpu", "cuda"):
    raise RuntimeError(f"LIGHTNING_HALO_DEVICE must be 'cpu' or 'cuda', got {DEVICE!r}")
if DEVICE == "cuda" and not torch.cuda.is_available():
    raise RuntimeError("LIGHTNING_HALO_DEVICE=cuda but torch.cuda.is_available() is False")

#: ``Trainer(accelerator=...)`` for :data:`DEVICE`.
ACCELERATOR = "gpu" if DEVICE == "cuda" else "cpu"
ON_CUDA = DEVICE == "cuda"


def max_ranks() -> int:
    """Processes a multi-process test can start here: one per GPU on CUDA, unbounded on CPU."""
    return torch.cuda.device_count() if ON_CUDA else 1 << 30
