"""Logs halo traffic and exchange wait time each epoch, and prints a summary at the end of fit."""

from __future__ import annotations

from typing import Any, Optional

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from lightning_halo.callbacks.reduced import all_ranks, log_reduced
from lightning_halo.exchange import TrafficMeter

_MB = 1e6


def _traffic(trainer: pl.Trainer) -> Optional[TrafficMeter]:
    """The strategy's traffic meter (``None`` under another strategy)."""
    return getattr(trainer.strategy, "traffic", None)


def _reduction_text(sent: float, fp32: float, bits: int, grad_bits: int) -> str:
    """How the summary states the saving: a factor, or that float32 rows were sent unchanged.

    Example:
        >>> _reduction_text(1.0e6, 27.7e6, 1, 1), _reduction_text(14.0e6, 14.0e6, 32, 32)
        ('27.7x less', 'exact, no reduction')
    """
    if not sent:
        return "nothing sent"
    if bits == grad_bits == 32:
        return "exact, no reduction"
    return f"{fp32 / sent:.1f}x less"


class HaloTrafficLogger(Callback):
    r"""Puts the halo traffic of every epoch into the LightningModule's logger.

    Logged each training epoch, summed over ranks: ``halo/fwd_bytes``, ``halo/bwd_bytes``
    (bytes handed to the collectives), ``halo/fwd_fp32_bytes``, ``halo/bwd_fp32_bytes``
    (what raw float32 rows would have cost), ``halo/MB`` (forward + backward, also on the
    progress bar), ``halo/wait_s`` (slowest rank's time blocked on halo collectives) and
    ``halo/codec_s`` (slowest rank's time quantizing and dequantizing); with ``bits="adaptive"``
    ``halo/bits/<layer>/<fwd|bwd>`` (the width each exchange sent at this epoch) and
    ``halo/noise/<layer>/<fwd|bwd>`` (the noise that width puts into the layer's outputs, relative to their
    energy, by the codec's bound of the last measured epoch: what ``bit_target`` bounds);
    ``halo/eval_bytes`` for validation. At the end of fit, rank 0 prints MB sent and the
    reduction factor against float32, per layer and kind of traffic, and the figures are kept in
    :attr:`summary` (with link prediction also the pair exchange of
    :func:`~lightning_halo.gather_rows` per epoch, ``summary["pair_bytes_per_epoch"]``).
    :class:`HaloQuantStrategy` adds this callback itself.

    Example:
        >>> trainer.callback_metrics["halo/fwd_bytes"]  # doctest: +SKIP
        tensor(1.2e+06)
    """

    def __init__(self) -> None:
        self.summary: dict[str, Any] = {}

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        m = _traffic(trainer)
        if m is None:
            return
        local = torch.tensor(
            [TrafficMeter.sum_traffic(m.epoch, "fwd"), TrafficMeter.sum_traffic(m.epoch, "bwd"),
             TrafficMeter.sum_traffic(m.epoch_fp32, "fwd"), TrafficMeter.sum_traffic(m.epoch_fp32, "bwd"),
             m.epoch_wait_s, m.epoch_codec_s],
            dtype=torch.float64,
        )  # fmt: skip
        ranks = all_ranks(trainer, local)  # one collective for all of this epoch's figures
        fwd, bwd, fwd32, bwd32 = ranks[:, :4].sum(0).tolist()
        wait_s, codec_s = ranks[:, 4:].max(0).values.tolist()
        log_reduced(pl_module, {"halo/fwd_bytes": fwd, "halo/bwd_bytes": bwd, "halo/fwd_fp32_bytes": fwd32,
                                "halo/bwd_fp32_bytes": bwd32}, reduce_fx="sum")  # fmt: skip
        log_reduced(pl_module, {"halo/MB": (fwd + bwd) / _MB}, reduce_fx="sum", prog_bar=True)
        log_reduced(pl_module, {"halo/wait_s": wait_s, "halo/codec_s": codec_s}, reduce_fx="max")
        widths = getattr(trainer.strategy, "halo_widths", dict)()
        if widths:  # bits="adaptive": every rank agreed on them (SlotTable.decide_widths), nothing to reduce
            log_reduced(pl_module, {f"halo/bits/{layer}/{d}": b for layer, w in widths.items() for d, b in w.items()},
                        reduce_fx="max")  # fmt: skip
            noise = trainer.strategy.halo_noise()  # type: ignore[attr-defined]
            log_reduced(pl_module, {f"halo/noise/{layer}/{d}": v for layer, w in noise.items() for d, v in w.items()},
                        reduce_fx="max")  # fmt: skip

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        m = _traffic(trainer)
        if m is None or trainer.sanity_checking:
            return
        eval_bytes = TrafficMeter.sum_traffic(m.epoch, "eval")
        pl_module.log("halo/eval_bytes", float(eval_bytes), reduce_fx="sum", sync_dist=True, batch_size=1)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        m = _traffic(trainer)
        if m is None:
            return
        bits, grad_bits = trainer.strategy.bits, trainer.strategy.grad_bits  # type: ignore[attr-defined]
        keys = sorted(set(m.total))
        local = torch.tensor(
            [[m.total[k], m.total_fp32[k]] for k in keys] + [[m.total_wait_s, 0.0]],
            dtype=torch.float64,
        )
        sums, waits = local[:-1].clone(), local[-1:, :1].clone()
        if trainer.world_size > 1:
            # Every rank hooked the same layers, so the key lists agree: sum bytes, take the max wait.
            # (Often the last collective before the interpreter exits: lightning_halo.shutdown.)
            device = trainer.strategy.root_device
            sums, waits = sums.to(device), waits.to(device)
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)
            dist.all_reduce(waits, op=dist.ReduceOp.MAX)
            sums, waits = sums.cpu(), waits.cpu()
        rows = {f"{layer}/{traffic}": (float(s[0]), float(s[1])) for (layer, traffic), s in zip(keys, sums)}
        sent = sum(v[0] for k, v in rows.items() if k.endswith(("/fwd", "/bwd")))
        fp32 = sum(v[1] for k, v in rows.items() if k.endswith(("/fwd", "/bwd")))
        self.summary = {
            "bytes": rows,
            "train_bytes": sent,
            "train_fp32_bytes": fp32,
            "reduction": fp32 / sent if sent else float("nan"),
            "wait_s": float(waits.max()) if waits.numel() else 0.0,
            "epochs": trainer.current_epoch,
        }
        lines = [
            f"lightning-halo traffic (all ranks, {trainer.current_epoch} epochs, bits={bits}, grad_bits={grad_bits}):"
        ]
        for key, (b, f32) in rows.items():
            lines.append(f"  {key:<32} {b / _MB:10.3f} MB  (fp32 {f32 / _MB:10.3f} MB)")
        pairs = sum(v[0] for k, v in rows.items() if k.startswith("gather_rows/") and k.endswith(("/fwd", "/bwd")))
        if pairs:  # link prediction's pair rows (lightning_halo.gather_rows), per epoch: they dominate
            self.summary["pair_bytes_per_epoch"] = pairs / max(trainer.current_epoch, 1)
            per_epoch_mb = self.summary["pair_bytes_per_epoch"] / _MB
            lines.append(f"  pair exchange (gather_rows, fwd + bwd) {per_epoch_mb:.3f} MB per epoch")
        lines.append(
            f"  training halo traffic {sent / _MB:.3f} MB vs {fp32 / _MB:.3f} MB as float32: "
            f"{_reduction_text(sent, fp32, bits, grad_bits)}; exchange wait {self.summary['wait_s']:.2f} s"
        )
        rank_zero_info("\n".join(lines))
