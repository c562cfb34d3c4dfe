"""Training from a partition directory equals training from the in-memory graph, and resumes exactly.

The directories are written offline from a ``torch.save``'d graph file that is deleted before
training: the ranks can only have read the manifest and their own part.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_halo.data.offline import partition_to_dir
from tests.support.graphs import graph_by_name
from tests.support.launch import check, run_workers
from tests.support.parity import assert_parity, load_records

WORKER = "tests/workers/partition_dir_worker.py"
CONFIGS = ["gcn:2:cora", "sage:2:awkward", "gat:2:awkward"]


def _offline(root: Path, graph: str, world_size: int) -> Path:
    """Partition ``graph`` from a file into ``root/<graph>-<world size>``, then delete the file."""
    src = root / f"{graph}.pt"
    torch.save(graph_by_name(graph, world_size), src)
    out = root / f"{graph}-{world_size}"
    partition_to_dir(src, out, world_size)
    src.unlink()
    return out


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [3])
def test_same_model_from_a_partition_directory(world_size: int, tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    parts.mkdir()
    for graph in {c.split(":")[2] for c in CONFIGS}:
        _offline(parts, graph, world_size)
    for source, out in ((str(parts), tmp_path / "dir"), ("memory", tmp_path / "memory")):
        check(run_workers([WORKER, "parity", "--out", str(out), "--data", source, "--configs", *CONFIGS], world_size, timeout=900))
    for config in CONFIGS:
        from_dir = load_records(config, world_size, tmp_path / "dir")
        in_memory = load_records(config, world_size, tmp_path / "memory")
        for r, (a, b) in enumerate(zip(from_dir, in_memory)):
            assert torch.equal(a["out0"], b["out0"]) and a["n_train"] == b["n_train"], f"{config} rank {r}"
            assert not a["n_train"] or a["loss0"] == b["loss0"], f"{config} rank {r}: loss"
            for name in b["params"]:
                assert torch.equal(a["grad0"][name], b["grad0"][name]), f"{config} rank {r}: grad {name} differs"
                assert torch.equal(a["params"][name], b["params"][name]), f"{config} rank {r}: {name} differs"
            assert a["epoch_bytes"] == b["epoch_bytes"], f"{config} rank {r}: different traffic"
            data = graph_by_name(config.split(":")[2], world_size)
            assert (a["num_features"], a["num_classes"]) == (data.num_features, int(data.y.max()) + 1)
        assert_parity(config, world_size, tmp_path / "dir")  # and both equal single-process PyG


@pytest.mark.multiprocess
def test_resume_from_a_partition_directory_is_bitwise_exact(tmp_path: Path) -> None:
    source = _offline(tmp_path, "cora32", 2)
    for phase in ("full", "first", "second"):
        check(run_workers([WORKER, "resume", "--out", str(tmp_path), "--data", str(source), "--phase", phase], 2, timeout=600))
    assert not (tmp_path / "cache").exists(), "a partition directory needs no cache"
    for mode in ("sync", "pipelined_2"):
        for rank in range(2):
            full = torch.load(tmp_path / "full" / mode / f"rank{rank}.pt")
            resumed = torch.load(tmp_path / "second" / mode / f"rank{rank}.pt")
            first = torch.load(tmp_path / "first" / mode / f"rank{rank}.pt")
            for name in full:
                assert torch.equal(full[name], resumed[name]), f"{mode} rank {rank}: {name} differs after resume"
            assert any(not torch.equal(full[n], first[n]) for n in full), "the second half must have trained"


@pytest.mark.multiprocess
def test_a_damaged_part_stops_every_rank_with_its_name(tmp_path: Path) -> None:
    source = _offline(tmp_path, "cora32", 2)
    raw = bytearray((source / "part_1.pt").read_bytes())
    raw[-300] ^= 0xFF  # same size, other bytes: only rank 1 can tell, by its hash
    (source / "part_1.pt").write_bytes(bytes(raw))
    results = run_workers([WORKER, "load", "--out", str(tmp_path / "load"), "--data", str(source)], 2, timeout=300)
    check(results)  # both ranks stop cleanly, neither hangs
    own = (tmp_path / "load" / "rank1.txt").read_text()
    peer = (tmp_path / "load" / "rank0.txt").read_text()
    assert own.startswith("PartitionFileError:") and "part_1.pt does not match the SHA-256" in own
    assert peer.startswith("PartitionFileError: rank 1 cannot load its partition:") and "part_1.pt" in peer
    assert (source / "part_1.pt").read_bytes() == bytes(raw), "the directory is never modified"
