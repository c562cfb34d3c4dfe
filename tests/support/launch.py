"""The local multi-process launcher of the tests (it lives in :mod:`benchmarks.launch`, shared with the harness)."""

from benchmarks.launch import REPO, check, free_port, run_workers

__all__ = ["REPO", "check", "free_port", "run_workers"]
