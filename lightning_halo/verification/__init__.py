"""Check that a model trains on partitions exactly as on one process: :func:`verify` and its report."""

from lightning_halo.verification.compare import ModuleDifference, VerifyReport, compare_step
from lightning_halo.verification.run import VerifyError, VerifyTimeout, verify

__all__ = ["ModuleDifference", "VerifyError", "VerifyReport", "VerifyTimeout", "compare_step", "verify"]
