"""The partitioning options and their checks, defined once (the DataModule, the CLI and the pure
functions import them from here)."""

from __future__ import annotations

from typing import Literal, Optional, get_args

Partitioner = Literal["metis", "kaminpar", "auto", "random"]
Balance = Literal["nodes", "edges"]

#: Accepted values of ``partitioner`` and ``balance`` (the CLI's choices come from here too).
PARTITIONERS: tuple[str, ...] = get_args(Partitioner)
BALANCES: tuple[str, ...] = get_args(Balance)

#: The boolean split masks every graph carries, node-level, one entry per node.
MASK_KEYS = ("train_mask", "val_mask", "test_mask")


def _one_of(values: tuple[str, ...]) -> str:
    return ", ".join(map(repr, values[:-1])) + f" or {values[-1]!r}" if len(values) > 1 else repr(values[0])


def check_partitioner(partitioner: str) -> None:
    if partitioner not in PARTITIONERS:
        raise ValueError(f"unknown partitioner {partitioner!r}; choose {_one_of(PARTITIONERS)}")


def check_threads(threads: int) -> None:
    """Partitioner threads are a positive integer (more than one makes KaMinPar non-deterministic)."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")


def check_balance(balance: str) -> None:
    if balance not in BALANCES:
        raise ValueError(f"unknown balance {balance!r}; choose {_one_of(BALANCES)}")


def check_num_parts(num_parts: Optional[int], num_nodes: Optional[int] = None, *, allow_none: bool = False) -> None:
    """``num_parts`` is a positive integer (or ``None`` where allowed) and at most ``num_nodes``."""
    if num_parts is None and allow_none:
        return
    if isinstance(num_parts, bool) or not isinstance(num_parts, int) or num_parts < 1:
        what = "a positive integer or None" if allow_none else "a positive integer"
        raise ValueError(f"num_parts must be {what}, got {num_parts!r}")
    if num_nodes is not None and num_parts > num_nodes:
        raise ValueError(
            f"num_parts={num_parts} exceeds the number of nodes ({num_nodes}): every part needs at "
            f"least one node. Use at most {num_nodes} processes for this graph."
        )


def check_options(partitioner: str, balance: str, num_parts: Optional[int] = None, *, allow_none: bool = True) -> None:
    """All three checks at once (what a constructor taking these options calls)."""
    check_partitioner(partitioner)
    check_balance(balance)
    check_num_parts(num_parts, allow_none=allow_none)
