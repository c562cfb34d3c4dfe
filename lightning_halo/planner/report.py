"""The plan as the ``lightning-halo plan`` command prints it: tables, assumptions, the recommendation."""

from __future__ import annotations

import textwrap
from typing import Any

from lightning_halo.planner.options import format_bytes

_MEMORY_TERMS = (("part_file", "part file"), ("pages", "pages read"), ("adjacency", "adjacency"),
                 ("activations", "activations"), ("halo", "halo rows"), ("backward", "backward"),
                 ("model", "model+grad+Adam"), ("graph", "whole graph"), ("codec", "quantizer code"),
                 ("idle", "idle process"))  # fmt: skip


def plan_table(plans: list[dict[str, Any]]) -> list[str]:
    """One line per (ranks, bits, mode): peak per rank, whether it fits, epoch time and its parts, bytes.

    ``kernels`` and ``overhead`` add up to the compute of the slowest rank's step (the overhead:
    Lightning's loop, the optimizer, the strategy's hooks and halo bookkeeping, calibrated).
    """
    lines = [f"{'ranks':>5} {'bits':>4} {'mode':>9} {'peak/rank':>9} {'fits':>4} {'epoch s':>8} {'kernels':>8} "
             f"{'overhead':>8} {'halo':>7} {'allred.':>7} {'bytes':>8}"]  # fmt: skip
    for p in plans:
        t, fits = p["time"], {None: "-", True: "yes", False: "NO"}[p["fits"]]
        lines.append(f"{p['ranks']:>5} {p['bits']:>4} {p['mode']:>9} {format_bytes(p['peak_bytes_per_rank']):>9} {fits:>4} "
                     f"{p['epoch_seconds']:>8.3g} {t['kernels']:>8.3g} {t['overhead']:>8.3g} {t['halo']:>7.3g} {t['allreduce']:>7.2g} "
                     f"{format_bytes(p['bytes_per_epoch']):>8}")  # fmt: skip
    return lines


def memory_table(plans: list[dict[str, Any]]) -> list[str]:
    """Each memory term of the largest rank (rows) per rank count (columns), at the first bit width and mode planned."""
    firsts = {p["ranks"]: p for p in reversed(plans)}
    counts = sorted(firsts)
    lines = [f"{'ranks':<16}" + "".join(f"{r:>10}" for r in counts)]
    for key, label in (*_MEMORY_TERMS, ("peak", "peak")):
        lines.append(f"{label:<16}" + "".join(f"{format_bytes(firsts[r]['memory'][key]):>10}" for r in counts))
    return lines


def step_table(steps: list[dict[str, Any]]) -> list[str]:
    """The partition step's predicted peak per rank count and partitioner."""
    lines = [f"{'ranks':>5} {'partitioner':>11} {'CSR':>10} {'peak':>10}"]
    lines += [f"{s['ranks']:>5} {s['partitioner']:>11} {format_bytes(s['csr_bytes']):>10} {format_bytes(s['peak_bytes']):>10}"
              for s in steps]  # fmt: skip
    return lines


def report(result: dict[str, Any]) -> str:
    """The whole plan as text: what it rests on, the three tables, the recommendation."""
    a, g = result["assumptions"], result["graph"]
    cal = a["calibration"]
    lines = [
        f"graph: {g['num_nodes']:,} nodes, {g['num_edges']:,} edges, {g['num_features']} features, {g['num_classes']} classes",
        *(f"counts: {note}" for note in a["counts"]),
        f"model: {a['model']}, {a['layers']} layers, hidden {a['hidden']}, halo_reduction={a['halo_reduction']!r}",
        f"link: {a['bandwidth_bytes_per_s'] * 8 / 1e9:g} Gbit/s per rank, latency {a['latency_s'] * 1e6:g} us, "
        f"{a['duplex']}-duplex exchanges",
        f"kernel rates ({cal['key']}, {cal['measured']}):",
        f"  SpMM {cal['spmm'] / 1e9:.2f} G edge-feat./s, dense {cal['dense'] / 1e9:.1f} GFLOP/s, "
        f"idle process {format_bytes(cal['idle_bytes'])}",
        f"  overhead per step + per layer: {cal['step_s'] * 1e3:.1f} + {cal['layer_s'] * 1e3:.1f} ms at one rank, "
        f"{cal['dist_step_s'] * 1e3:.1f} + {cal['dist_layer_s'] * 1e3:.1f} ms at several",
        f"  {a['ranks_per_host']} rank(s) per host; {cal['share_ranks']} ranks sharing this host's {cal['cores']} "
        f"cores ran the kernels {cal['share']:.2f}x slower",
        "",
        "per rank count, bit width and mode (peak: the largest rank; epoch: the slowest;",
        "bytes: halo traffic per epoch, all ranks):",
        *plan_table(result["plans"]),
        "",
        f"memory of the largest rank, term by term ({result['plans'][0]['bits']} bits, {result['plans'][0]['mode']}):",
        *memory_table(result["plans"]),
    ]
    if result["partition_step"]:
        lines += [
            "",
            "the partition step (lightning-halo partition), one process:",
            *step_table(result["partition_step"]),
        ]
    lines += [
        "",
        *textwrap.wrap(f"not modelled: {a['not_modelled']}", 79),
        "",
        f"recommendation: {result['recommendation']['text']}",
    ]
    return "\n".join(lines)
