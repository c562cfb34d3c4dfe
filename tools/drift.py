"""How far distributed float32 training drifts from single-process PyG, per layer: the figures of docs/faq.md.

    python tools/drift.py --world-size 2 --steps 5 --out benchmarks/results/drift.json

Trains every supported layer (the two-conv models of the parity tests) on Cora for ``--steps``
Adam steps at ``bits=32`` through the strategy on ``--world-size`` processes, in float32 and
in float64, and compares with single-process PyG on the whole graph: the relative difference
of the logits at step 0 and of the parameters after the last step (max |a - b| / max |b|).
Exact arithmetic gives ~1e-15 in float64; what float32 shows is rounding (sums in another
order), amplified by the layer and by training.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lightning_halo  # noqa: E402
from tests.support.graphs import graph_by_name  # noqa: E402
from tests.support.models import build_any, reference_run  # noqa: E402
from tests.support.parity import assemble, load_records, run_parity  # noqa: E402


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--layers", nargs="*", default=None, help="default: every supported layer")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "drift.json"))
    args = parser.parse_args()
    layers = args.layers or list(lightning_halo.supported_layers())
    result: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for graph in ("cora32", "cora"):
            configs = [f"layer:{name}:{graph}" for name in layers]
            out = Path(tmp) / graph
            run_parity(configs, args.world_size, out, extra=["--steps", str(args.steps)])
            data = graph_by_name(graph, args.world_size)
            for name, config in zip(layers, configs):
                ref = reference_run(build_any(f"layer:{name}", data), data, steps=args.steps)
                recs = load_records(config, args.world_size, out)
                logits, _ = assemble(recs, data.num_nodes)
                params = max(_rel(recs[0]["params"][k], p) for k, p in ref["params"].items() if k in ref["grad0"])
                # the predictions after training: the distributed run's parameters on the whole graph
                net = build_any(f"layer:{name}", data)
                net.load_state_dict({**net.state_dict(), **recs[0]["params"]})
                with torch.no_grad():
                    final = net(data.x, data.edge_index, data.get("edge_attr"), data.get("edge_type"))
                    ref_net = build_any(f"layer:{name}", data)
                    ref_net.load_state_dict({**ref_net.state_dict(), **ref["params"]})
                    ref_final = ref_net(data.x, data.edge_index, data.get("edge_attr"), data.get("edge_type"))
                dtype = "float32" if graph == "cora32" else "float64"
                result.setdefault(name, {})[f"{dtype}_logits0"] = _rel(logits, ref["out0"])
                result[name][f"{dtype}_params"] = params
                result[name][f"{dtype}_logits_final"] = _rel(final, ref_final)
    print(f"{'layer':<20} {'fp32 logits@0':>14} {'fp32 logits@end':>16} {'fp32 params':>12} {'fp64 logits@end':>16}")
    for name, r in sorted(result.items(), key=lambda kv: -kv[1]["float32_logits_final"]):
        print(f"{name:<20} {r['float32_logits0']:14.1e} {r['float32_logits_final']:16.1e} {r['float32_params']:12.1e} "
              f"{r['float64_logits_final']:16.1e}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"world_size": args.world_size, "steps": args.steps, "layers": result}, indent=1))


if __name__ == "__main__":
    main()
