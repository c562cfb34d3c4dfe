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


def test_only_the_library_s_input_errors_become_one_line(tmp_path) -> None:
    """partition, plan and verify: a deliberate ValueError/TypeError/OSError of the library is a mistake in the
    command; a RuntimeError of the library (a run that failed) and anything raised elsewhere keep their traceback."""
    import pytest

    from lightning_halo import HaloDataModule, HaloQuantStrategy
    from lightning_halo.cli.status import CommandError, input_errors_are_command_errors

    with pytest.raises(CommandError, match=r"^ValueError: bits=3 is not supported") as err:
        with input_errors_are_command_errors():
            HaloQuantStrategy(bits=3)
    assert isinstance(err.value.__cause__, ValueError), "the original stays attached"
    with pytest.raises(RuntimeError, match="setup\\(\\) has not run"):
        with input_errors_are_command_errors():
            HaloDataModule("cora", cache_dir=str(tmp_path)).train_dataloader()
    with pytest.raises(ValueError, match="outside"):
        with input_errors_are_command_errors():
            raise ValueError("raised outside the package")


def test_each_kind_of_end_has_its_status_and_only_a_command_error_loses_its_traceback(capsys) -> None:
    from lightning_halo.cli.status import CommandError, ExitStatus, exit_status

    def raised(err: Exception) -> Exception:
        try:
            raise err
        except Exception as caught:  # noqa: BLE001
            return caught

    assert exit_status("lightning-halo x", CommandError("no --ckpt_path")) == ExitStatus.USAGE == 2
    assert capsys.readouterr().err == "lightning-halo x: error: no --ckpt_path\n"
    for err, status in [(TimeoutError("slow"), ExitStatus.TIMEOUT), (RuntimeError("broken"), ExitStatus.ERROR)]:
        assert exit_status("lightning-halo x", raised(err)) == status
        text = capsys.readouterr().err
        assert text.startswith("Traceback (most recent call last):") and text.endswith(f"{type(err).__name__}: {err}\n")
    assert [int(s) for s in ExitStatus] == [0, 1, 2, 3, 4]
