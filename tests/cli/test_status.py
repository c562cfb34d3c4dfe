"""How a verb ends: only the library's deliberate errors about its input lose their traceback."""

from __future__ import annotations


def test_only_the_library_s_deliberate_errors_lose_their_traceback() -> None:
    from lightning_halo import HaloPartition, HaloQuantStrategy
    from lightning_halo.cli import library_error

    def wrapped(raise_own) -> BaseException:
        try:
            try:
                raise_own()
            except Exception as own:  # noqa: BLE001
                raise ValueError("Call to compute_fn of link failed") from own  # as jsonargparse wraps it
        except ValueError as outer:
            return outer

    refused = wrapped(lambda: HaloQuantStrategy(bits=3))
    assert str(library_error(refused)).startswith("bits=3 is not supported")
    assert library_error(wrapped(lambda: HaloPartition().batch_size)) is None, "an AttributeError is a bug: keep it"
    assert library_error(ValueError("raised outside the package")) is None
