"""The ``lightning-halo partition`` verb: partition a graph and print its statistics and traffic table."""

from __future__ import annotations

import argparse
import json

from lightning_halo.data import HaloDataModule
from lightning_halo.exchange import predict_traffic
from lightning_halo.quant import SUPPORTED_BITS as BITS


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lightning-halo partition",
        description="Partition a graph into the cache and print its statistics and the halo traffic per bit width.",
    )
    parser.add_argument("--data", default="cora", help="bundled name, torch.save'd Data path, or pyg:<Class>:<root>[:<name>]")
    parser.add_argument("--num-parts", type=int, required=True)
    parser.add_argument("--partitioner", choices=["metis", "random"], default="metis")
    parser.add_argument("--balance", choices=["nodes", "edges"], default="nodes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--hidden", type=int, default=64, help="hidden size of the model, for the traffic table")
    parser.add_argument("--layers", type=int, default=2, help="message-passing layers of the model")
    parser.add_argument("--gcn", action="store_true", help="the model uses GCN-style layers (one degree exchange)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = parser.parse_args(argv)
    dm = HaloDataModule(
        args.data,
        num_parts=args.num_parts,
        partitioner=args.partitioner,
        balance=args.balance,
        seed=args.seed,
        cache_dir=args.cache_dir,
    )
    parts = dm.partitions(args.num_parts)
    from lightning_halo.partition import partition_stats

    stats = partition_stats(parts)
    feature_bytes = parts[0].x.element_size()
    stored = all("halo_x" in p for p in parts)
    traffic = {
        bits: predict_traffic(
            stats["halo_rows"], dm.num_features, args.hidden, args.layers, bits, feature_bytes=feature_bytes, gcn=args.gcn,
            input_stored=stored,
        )
        for bits in BITS
    }
    if args.json:
        print(json.dumps({"stats": stats, "traffic": traffic, "cache": str(dm._cache(args.num_parts).dir)}))
        return 0
    print(f"graph {args.data}: {sum(stats['nodes'])} nodes, {sum(stats['edges'])} edges, {dm.num_features} features")
    print(f"{args.partitioner} into {args.num_parts} parts: edge cut {stats['edge_cut']}, halo rows {stats['halo_rows']}, "
          f"balance {stats['balance']:.3f}, replication {stats['replication']:.3f}")
    print(f"{'part':>6} {'nodes':>10} {'in-edges':>12} {'halo':>10} {'sends':>10}")
    for p in range(args.num_parts):
        print(f"{p:>6} {stats['nodes'][p]:>10} {stats['edges'][p]:>12} {stats['halo_nodes'][p]:>10} {stats['send_rows'][p]:>10}")
    print(f"\nhalo traffic per training epoch, all ranks, {args.layers} layers, hidden {args.hidden}:")
    print(f"{'bits':>6} {'forward MB':>12} {'backward MB':>12} {'vs fp32':>9}")
    for bits, t in traffic.items():
        sent = t["fwd_per_epoch"] + t["bwd_per_epoch"]
        ratio = f"{t['fp32_per_epoch'] / sent:.1f}x" if sent else "-"
        print(f"{bits:>6} {t['fwd_per_epoch'] / 1e6:>12.4f} {t['bwd_per_epoch'] / 1e6:>12.4f} {ratio:>9}")
    if stored:
        stored_mb = sum(p.halo_x.numel() * p.halo_x.element_size() for p in parts) / 1e6
        print(f"input features of the halo: stored in the partitions ({stored_mb:.3f} MB in all), not exchanged")
    else:
        print(f"plus once: input-feature halo {traffic[32]['input_once'] / 1e6:.3f} MB (full precision)")
    if args.gcn:
        print(f"plus once: GCN degrees of the halo {traffic[32]['aux_once'] / 1e6:.3f} MB")
    print(f"cached in {dm._cache(args.num_parts).dir}")
    return 0
