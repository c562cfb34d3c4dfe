"""What counts as noise in a run's output: warnings (Python's and Lightning's format) and PyG chatter."""

from __future__ import annotations

import re

# Python prints "file.py:12: UserWarning: msg"; Lightning's rank_zero_warn prints "file.py:12: msg".
_WARNING = re.compile(r"\.py:\d+: |\b[A-Z]\w*Warning\b")
_CHATTER = {"Processing...", "Done!"}  # PyG's dataset processing, once per rank


def noise_lines(output: str) -> list[str]:
    """The lines of ``output`` a user did not ask for: every warning, and PyG's processing lines.

    Example:
        >>> noise_lines("epoch 0\\n/x/slurm.py:204: The `srun` command is available\\nDone!\\n")
        ['/x/slurm.py:204: The `srun` command is available', 'Done!']
    """
    return [line for line in output.splitlines() if _WARNING.search(line) or line.strip() in _CHATTER]
