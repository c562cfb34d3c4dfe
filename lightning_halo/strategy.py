"""HaloQuantStrategy: DDP plus a halo exchange around every PyG message-passing layer."""

from __future__ import annotations

import logging
import time
import warnings
from datetime import timedelta
from typing import Any, Literal, Optional

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from lightning_halo.exchange import (
    HaloExchanger,
    LayerHook,
    UnsupportedLayerError,
    find_message_passing,
    layer_kind,
)
from lightning_halo.partition.halo_partition import HaloPartition

log = logging.getLogger(__name__)

SUPPORTED_BITS = (1, 2, 4, 8, 16, 32)
_GRAPH_NORMS = ("GraphNorm", "PairNorm", "InstanceNorm", "MeanSubtractionNorm", "DiffGroupNorm")


def _check_bits(name: str, value: Optional[int]) -> None:
    if value is not None and value not in SUPPORTED_BITS:
        raise ValueError(f"{name}={value!r} is not supported; choose one of {SUPPORTED_BITS} (32 = exact float rows).")


class HaloQuantStrategy(DDPStrategy):
    r"""Distributed full-graph GNN training: DDP plus a (quantized) halo exchange per layer.

    Every :class:`~torch_geometric.nn.conv.MessagePassing` layer of the LightningModule is
    hooked: its node-feature input (the rank's ``n_inner`` rows) is extended with the halo
    rows fetched from their owners, the layer runs, and its output is cut back to the inner
    rows. Backward, halo gradients return to their owners and are added to their rows'
    gradients. Parameters are replicated and their gradients all-reduced by DDP, as in
    CAGNET's 1-D and DistDGL's owner-compute schemes. At ``bits=32`` (sync) the result equals
    single-process training; lower ``bits`` quantize what crosses the wire with unbiased
    stochastic rounding (`Sylvie <https://arxiv.org/abs/2303.01277>`_).

    The loss returned by ``training_step`` is taken as a mean over the partition's train
    nodes and multiplied by :math:`P\,n_r / N_{train}`, so that DDP's averaged gradient is
    the gradient of the mean over all train nodes of the graph
    (:math:`\frac{1}{P}\sum_r \nabla (P\,n_r/N)\,L_r = \nabla \frac{1}{N}\sum_i \ell_i`).

    Args:
        bits (int, optional): bits per value of forward halo rows in training: ``1``, ``2``,
            ``4``, ``8`` (stochastic rounding), ``16`` (bfloat16) or ``32`` (exact). (default: ``1``)
        grad_bits (int, optional): bits of backward halo gradients. (default: ``bits``)
        eval_bits (int, optional): bits for validation/test/predict. (default: ``32``)
        scale_loss (bool, optional): rescale the loss as above; turn off if your
            ``training_step`` already returns a globally normalised sum. (default: ``True``)
        halo_timeout (float, optional): seconds a halo collective may wait for its peers
            before raising (a dead rank must not hang the job). (default: ``300``)
        seed (int, optional): seed of the per-rank stochastic-rounding generators. (default: ``0``)
        check_finite (bool, optional): raise on NaN/Inf in halo rows, naming the layer,
            direction and rank. (default: ``True``)
        accelerator: as for :class:`~lightning.pytorch.strategies.DDPStrategy`.
        parallel_devices: as for ``DDPStrategy``.
        cluster_environment: as for ``DDPStrategy``.
        checkpoint_io: as for ``DDPStrategy``.
        precision_plugin: as for ``DDPStrategy``.
        process_group_backend (str, optional): ``"gloo"`` or ``"nccl"``; by default gloo on CPU,
            NCCL on CUDA (the halo group uses the same backend).
        timeout (timedelta, optional): timeout of DDP's default process group.
        start_method (str, optional): ``"popen"`` (default) or ``"spawn"``/``"fork"``/``"forkserver"``.
        find_unused_parameters (bool, optional): as for DDP. (default: ``False``)
        static_graph (bool, optional): as for DDP. (default: ``False``)
        gradient_as_bucket_view (bool, optional): as for DDP. (default: ``False``)

    The DDP options are explicit parameters, not ``**kwargs``, so configs saved by the CLI do
    not depend on the torch version.

    Example:
        >>> trainer = L.Trainer(strategy=HaloQuantStrategy(bits=1), accelerator="cpu", devices=2)
        >>> trainer = L.Trainer(strategy=HaloQuantStrategy(bits=32), devices=2)  # exact
        >>> trainer = L.Trainer(strategy="halo_quant", devices=2)  # registered name, defaults
    """

    strategy_name = "halo_quant"

    def __init__(
        self,
        bits: int = 1,
        grad_bits: Optional[int] = None,
        eval_bits: int = 32,
        scale_loss: bool = True,
        halo_timeout: float = 300.0,
        seed: int = 0,
        check_finite: bool = True,
        accelerator: Optional["pl.accelerators.Accelerator"] = None,
        parallel_devices: Optional[list[torch.device]] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[Precision] = None,
        process_group_backend: Optional[str] = None,
        timeout: Optional[timedelta] = default_pg_timeout,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
    ) -> None:
        _check_bits("bits", bits)
        _check_bits("grad_bits", grad_bits)
        _check_bits("eval_bits", eval_bits)
        if halo_timeout <= 0:
            raise ValueError(f"halo_timeout must be positive seconds, got {halo_timeout}")
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            find_unused_parameters=find_unused_parameters,
            static_graph=static_graph,
            gradient_as_bucket_view=gradient_as_bucket_view,
        )
        self.bits = bits
        self.grad_bits = bits if grad_bits is None else grad_bits
        self.eval_bits = eval_bits
        self.scale_loss = scale_loss
        self.halo_timeout = float(halo_timeout)
        self.seed = seed
        self.check_finite = check_finite
        self.exchanger = HaloExchanger(
            None, bits=bits, grad_bits=grad_bits, eval_bits=eval_bits, seed=seed, check_finite=check_finite
        )
        self._halo_group: Any = None
        self._hooks: list[LayerHook] = []
        self._plans_checked: set[int] = set()

    # ------------------------------------------------------------------ environment
    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        if self.world_size > 1 and self._halo_group is None:
            # Its own group: halo traffic never interleaves with DDP's all-reduce on the default one.
            self._halo_group = dist.new_group(
                backend=self._get_process_group_backend(), timeout=timedelta(seconds=self.halo_timeout)
            )
        self.exchanger.group = self._halo_group
        module = self.lightning_module
        if module is not None and module._trainer is not None:
            self._add_callbacks(module.trainer)

    def _add_callbacks(self, trainer: pl.Trainer) -> None:
        """Traffic logging and checkpoint state are part of the strategy, not user options.

        Added here, before Lightning restores callback states from a checkpoint.
        """
        from lightning_halo.callbacks import HaloStateCallback, HaloTrafficLogger

        if not any(isinstance(cb, HaloTrafficLogger) for cb in trainer.callbacks):
            trainer.callbacks.append(HaloTrafficLogger())
        state = next((cb for cb in trainer.callbacks if isinstance(cb, HaloStateCallback)), None)
        if state is None:
            state = HaloStateCallback()
            trainer.callbacks.append(state)
        state.attach(self.exchanger, self.global_rank, self.world_size)

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        self._install_hooks()

    def _install_hooks(self) -> None:
        self._remove_hooks()
        module = self.lightning_module
        assert module is not None
        layers = find_message_passing(module)
        if not layers:
            raise UnsupportedLayerError(
                f"{type(module).__name__} has no torch_geometric MessagePassing layer (GCNConv, SAGEConv, ...): "
                "HaloQuantStrategy partitions the graph between processes, which only makes sense for a GNN. "
                "For other models use strategy='ddp'."
            )
        kinds = {name: layer_kind(layer) for name, layer in layers.items()}  # raises for unsupported layers
        self._warn_graph_norms(module)
        self._hooks = [LayerHook(layers[name], name, kind, self.exchanger).install() for name, kind in kinds.items()]
        log.debug("lightning-halo: hooked %s", kinds)

    def _warn_graph_norms(self, module: torch.nn.Module) -> None:
        sync_bn = bool(self._layer_sync)
        for name, sub in module.named_modules():
            cls = type(sub).__name__
            if cls in _GRAPH_NORMS or (cls == "LayerNorm" and getattr(sub, "mode", None) == "graph"):
                warnings.warn(
                    f"{name} ({cls}) computes statistics over all nodes it sees; on a partition that is the rank's "
                    "own nodes, not the whole graph, so results differ from single-process training.",
                    stacklevel=2,
                )
            elif isinstance(sub, torch.nn.modules.batchnorm._BatchNorm) and not sync_bn and self.world_size > 1:
                fix = (
                    "pass Trainer(sync_batchnorm=True) for whole-graph statistics"
                    if self.root_device.type == "cuda"
                    else "PyTorch's SyncBatchNorm is GPU-only, so on CPU they stay per partition"
                )
                warnings.warn(f"{name} ({cls}) normalises with per-partition batch statistics; {fix}.", stacklevel=2)

    def _remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    # ------------------------------------------------------------------ steps
    def _begin(self, args: tuple, kwargs: dict, training: bool) -> HaloPartition:
        batch = args[0] if args else kwargs.get("batch")
        if not isinstance(batch, HaloPartition):
            raise TypeError(
                f"HaloQuantStrategy expects every batch to be a HaloPartition, got {type(batch).__name__}. "
                "Use lightning_halo.HaloDataModule (or a DataLoader yielding this rank's HaloPartition)."
            )
        if int(batch.num_parts) != self.world_size or int(batch.part_id) != self.global_rank:
            raise ValueError(
                f"rank {self.global_rank} of {self.world_size} received partition {int(batch.part_id)} of "
                f"{int(batch.num_parts)}; each rank must get its own part of a {self.world_size}-way partition."
            )
        if self.exchanger.bind(batch) and self.exchanger.active:
            self._check_plans()
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if trainer is not None:
            self.exchanger.epoch = int(trainer.current_epoch)
        self.exchanger.begin_step(training)
        return batch

    def _check_plans(self) -> None:
        """Cheap collective at the first step: every peer must expect exactly the rows we send."""
        plan = self.exchanger.plan
        assert plan is not None
        key = id(self.exchanger.part)
        if key in self._plans_checked:
            return
        sigs: list[Any] = [None] * self.world_size
        dist.all_gather_object(sigs, (plan.send_counts, plan.recv_counts), group=self._halo_group)
        for q, (send_q, recv_q) in enumerate(sigs):
            if len(send_q) != self.world_size or recv_q[self.global_rank] != plan.send_counts[q] or (
                send_q[self.global_rank] != plan.recv_counts[q]
            ):
                raise ValueError(
                    f"rank {self.global_rank}: the exchange plan disagrees with rank {q}'s (different partition caches "
                    "or graphs on different nodes?). Clear the partition cache and make sure every node reads the same graph."
                )
        self._plans_checked.add(key)

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        self._begin(args, kwargs, training=True)
        out = super().training_step(*args, **kwargs)
        module = self.lightning_module
        if out is None and module is not None and module.automatic_optimization and self.exchanger.active:
            raise RuntimeError(
                "training_step returned None, which skips backward on this rank while its peers wait for its halo "
                "gradients. Return a loss on every rank (a partition without train nodes still returns its loss)."
            )
        return out

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        self._begin(args, kwargs, training=False)
        return super().validation_step(*args, **kwargs)

    @override
    def test_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        self._begin(args, kwargs, training=False)
        return super().test_step(*args, **kwargs)

    @override
    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        self._begin(args, kwargs, training=False)
        return super().predict_step(*args, **kwargs)

    @override
    def backward(self, closure_loss: Tensor, optimizer: Optional[Optimizer], *args: Any, **kwargs: Any) -> Tensor:
        loss = closure_loss
        part = self.exchanger.part
        if self.scale_loss and part is not None:
            loss = self._scale(loss, part)
        loss = self.exchanger.prepare_loss(loss)
        return super().backward(loss, optimizer, *args, **kwargs)

    def _scale(self, loss: Tensor, part: HaloPartition) -> Tensor:
        total = int(part.num_train_global)
        if total == 0:
            raise ValueError("the graph has no train node (train_mask is all False); nothing to train on.")
        n_r = int(part.train_mask.sum()) if "train_mask" in part else 0
        factor = self.world_size * n_r / total
        if n_r == 0:
            # The mean over zero nodes is NaN; keep the graph (every collective must run) but weigh it 0.
            return torch.where(torch.isfinite(loss), loss, torch.zeros_like(loss)) * 0.0
        return loss * factor

    @override
    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)
        # A failed run must leave no process behind. A rank frozen in user code never reaches the
        # collective that would time out, and Lightning's launcher kills the ranks it started only on
        # KeyboardInterrupt (trainer/call.py): do the same for every failure. Ranks started by
        # torchrun/SLURM are not ours (the launcher then has no children) and are left to them.
        from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher
        from lightning.pytorch.trainer.connectors.signal_connector import _get_sigkill_signal

        launcher = self.launcher
        if isinstance(launcher, _SubprocessScriptLauncher) and launcher.procs:
            deadline = time.monotonic() + 2.0  # ranks failing too get to print their own error first
            while any(p.poll() is None for p in launcher.procs) and time.monotonic() < deadline:
                time.sleep(0.05)
            launcher.kill(_get_sigkill_signal())

    # ------------------------------------------------------------------ teardown, registry
    @override
    def teardown(self) -> None:
        try:
            self.exchanger.flush()
        except Exception as err:  # a dead peer must not mask the original error
            log.warning("lightning-halo: could not flush pending halo exchanges: %s", err)
        self._remove_hooks()
        if self._halo_group is not None:
            dist.destroy_process_group(self._halo_group)
            self._halo_group = self.exchanger.group = None
        super().teardown()
        # gloo's worker threads destroy finished collectives (releasing Python tensors) after the
        # waiting caller returned; they need the GIL for that. Yield it briefly so none is still
        # pending if the script exits right after fit (an interpreter shutting down aborts them).
        time.sleep(0.05)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        for name, start_method in (("halo_quant", "popen"), ("halo_quant_spawn", "spawn")):
            if name not in strategy_registry:
                strategy_registry.register(
                    name,
                    cls,
                    description=f"lightning-halo full-graph GNN strategy (start_method '{start_method}')",
                    start_method=start_method,
                )
