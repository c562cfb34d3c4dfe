"""Single-process simulation of stale (pipelined / periodic) halo training, for reference.

Runs every partition of a SAGE ``Net`` in one process. Input features are exact (their halo is
constant). For layer ``l >= 1`` (halo slot ``l - 1``):

* ``sync``: the halo is built from the owners' current rows, differentiably: exact training;
* ``pipelined``: the halo is last epoch's rows (a constant); the gradient it receives is kept and
  injected into the owners' rows in the *next* epoch's backward;
* ``periodic``: the halo is the last refresh's rows; no gradient crosses partitions.

``step_mode(epoch)`` gives the epoch's mode, or one mode per slot (what an ``"adaptive"`` epoch
decided for each layer).

The objective is ``(1/P) sum_q (P n_q / N) L_q``, i.e. what DDP averages.
"""

from __future__ import annotations

from typing import Callable, Sequence, Union

import torch
import torch.nn.functional as F

from lightning_halo.partition import build_halo_partitions, partition_graph


def _owner_slices(parts, q: int) -> list[tuple[int, int, int]]:
    """For receiver q: (owner, start in owner's send buffer, count) in q's halo order."""
    out = []
    for o, count in enumerate(parts[q].recv_counts.tolist()):
        start = int(parts[o].send_counts[:q].sum())
        out.append((o, start, count))
    return out


def simulate(
    data, net, world_size: int, epochs: int, step_mode: Callable[[int], Union[str, Sequence[str]]], lr: float = 0.01
) -> dict:
    parts = build_halo_partitions(data, partition_graph(data.edge_index, data.num_nodes, world_size), world_size)
    P = world_size
    n_total = int(data.train_mask.sum())
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    B: dict[tuple[int, int], torch.Tensor] = {}  # (slot, receiver) -> halo rows to reuse
    G: dict[tuple[int, int], torch.Tensor] = {}  # (slot, owner) -> gradients for its sent rows
    for epoch in range(epochs):
        modes = step_mode(epoch)
        opt.zero_grad()
        h = [p.x for p in parts]
        objective = torch.zeros((), dtype=data.x.dtype)
        grad_sources: list[tuple[int, int, torch.Tensor]] = []  # (slot, receiver, tensor whose grad to keep)
        for li, conv in enumerate(net.convs):
            halos = []
            if li == 0:
                halos = [data.x[p.global_id[int(p.n_inner) :]] for p in parts]
            else:
                slot = li - 1
                mode = modes if isinstance(modes, str) else modes[slot]
                sent = [h[o][parts[o].send_index] for o in range(P)]
                for q in range(P):
                    fresh = torch.cat([sent[o][s : s + c] for o, s, c in _owner_slices(parts, q)])
                    have = (slot, q) in B
                    if mode == "sync" or not have:
                        if fresh.requires_grad:
                            fresh.retain_grad()
                        grad_sources.append((slot, q, fresh))
                        used = fresh
                        B[(slot, q)] = fresh.detach()
                    elif mode == "pipelined":
                        used = B[(slot, q)].clone().requires_grad_()
                        grad_sources.append((slot, q, used))
                        B[(slot, q)] = fresh.detach()
                    else:  # periodic
                        used = B[(slot, q)]
                    halos.append(used)
                if mode == "pipelined":
                    for o in range(P):
                        if (slot, o) in G:  # last epoch's halo gradients, applied by the owner now
                            objective = objective + (sent[o] * G[(slot, o)]).sum()
            new_h = []
            for q, p in enumerate(parts):
                out = conv((torch.cat([h[q], halos[q]]), h[q]), p.edge_index)
                new_h.append(F.relu(out) if li < len(net.convs) - 1 else out)
            h = new_h
        for q, p in enumerate(parts):
            n_q = int(p.train_mask.sum())
            if n_q:
                objective = objective + n_q / n_total * F.cross_entropy(h[q][p.train_mask], p.y[p.train_mask])
        objective.backward()
        if modes != "periodic":  # an adaptive epoch's slots are synchronous or pipelined
            grads: dict[tuple[int, int], torch.Tensor] = {}
            for slot, q, t in grad_sources:
                grads[(slot, q)] = t.grad if t.grad is not None else torch.zeros_like(t)
            for slot in {s for s, _, _ in grad_sources}:
                for o in range(P):
                    pieces = []
                    for q in range(P):
                        offset = 0
                        for owner, s, c in _owner_slices(parts, q):
                            if owner == o:
                                pieces.append(grads[(slot, q)][offset : offset + c])
                            offset += c
                    G[(slot, o)] = torch.cat(pieces) if pieces else torch.zeros(0)
        opt.step()
    return {k: p.detach().clone() for k, p in net.named_parameters()}
