"""verify's runs, without running them: a run that does not finish is a timeout, never a hang."""

from __future__ import annotations

import pytest

from lightning_halo.verification import VerifyError
from lightning_halo.verification.run import VerifyTimeout, _wait


class _Stuck:
    """A process that never ends until killed."""

    exitcode = None

    def __init__(self) -> None:
        self.killed = False

    def is_alive(self) -> bool:
        return not self.killed

    def kill(self) -> None:
        self.killed = True

    def join(self, timeout: float | None = None) -> None:
        pass


def test_a_run_that_does_not_finish_is_stopped_and_is_a_timeout() -> None:
    procs = [_Stuck(), _Stuck()]
    with pytest.raises(VerifyTimeout, match="the 2-process run did not finish within 0.2 s") as err:
        _wait(procs, 0.2, "the 2-process run")
    assert all(p.killed for p in procs)
    assert isinstance(err.value, TimeoutError) and isinstance(err.value, VerifyError), "the CLI's status 3, and a VerifyError"
