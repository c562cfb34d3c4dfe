"""Clean process exit for worker scripts."""

from __future__ import annotations

import torch.distributed as dist


def shutdown() -> None:
    """Destroy the process groups before the interpreter exits.

    gloo's worker threads release finished collectives' tensors, which needs the GIL; if that
    happens while Python is finalising, the process aborts ("terminate called without an active
    exception"). PyTorch's own advice is to call ``destroy_process_group()`` at the end.
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
