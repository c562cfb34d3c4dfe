"""HaloQuantStrategy: DDP plus a halo exchange around every PyG message-passing layer."""

from __future__ import annotations

import logging
import os
import re
from datetime import timedelta
from typing import Any, Callable, Literal, Optional, Union

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
from typing_extensions import override

from lightning_halo._compat.lightning import (
    StrategyRegistryType,
    compiled_by_trainer,
    precision_input_dtype,
    step_output_redirection,
    stop_launched_ranks,
)
from lightning_halo.exchange import SYNC, DistTransport, HaloExchanger, HaloPolicy, TrafficMeter, check_signatures
from lightning_halo.exchange.current import release_exchanger, use_exchanger
from lightning_halo.layers.batchnorm import NormHook
from lightning_halo.layers.call import Aggregation
from lightning_halo.layers.hooks import (
    LayerContext,
    LayerHook,
    RecomputeHook,
    check_model,
    find_message_passing,
    install_batch_norms,
    install_hooks,
)
from lightning_halo.layers.reduction import HaloReduction
from lightning_halo.layers.registry import COMPILE_REFUSAL, UnsupportedLayerError, graph_norm_refusal
from lightning_halo.loss import LossScaling, check_scale_loss, scaled_loss
from lightning_halo.partition.chunks import trim_heap
from lightning_halo.partition.halo_partition import HaloPartition
from lightning_halo.partition.hetero import HeteroHaloPartition
from lightning_halo.quant.allocate import BIT_BUDGET, BIT_CHOICES, BIT_PATIENCE, BIT_TARGET, MonitorMode
from lightning_halo.shutdown import release_at_exit

log = logging.getLogger(__name__)

# DDP's error when a parameter got no gradient in the previous step, and what to do about it here.
_UNUSED_PARAMETERS = ".*Expected to have finished reduction in the prior iteration.*"
_UNUSED_PARAMETERS_FIX = (
    "It looks like your LightningModule has parameters that were not used in producing the loss returned by "
    "training_step (PyG's DirGNNConv, for one, leaves its inner layers' root weight unused). If this is intentional, "
    "enable DDP's detection of unused parameters: strategy=HaloQuantStrategy(find_unused_parameters=True), or in a "
    "config `--trainer.strategy.init_args.find_unused_parameters true`."
)


def check_halo_timeout(halo_timeout: float) -> None:
    if isinstance(halo_timeout, bool) or not isinstance(halo_timeout, (int, float)) or halo_timeout <= 0:
        raise ValueError(f"halo_timeout must be positive seconds, got {halo_timeout!r}")


def check_num_threads(num_threads: Optional[int]) -> None:
    if num_threads is None:
        return
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive integer or None, got {num_threads!r}")


def check_batch(batch: Any, rank: int, world_size: int) -> HaloPartition | HeteroHaloPartition:
    """``batch`` if it is this rank's part of a ``world_size``-way partition, else the error saying why."""
    if not isinstance(batch, (HaloPartition, HeteroHaloPartition)):
        raise TypeError(
            f"HaloQuantStrategy expects every batch to be a HaloPartition (or a HeteroHaloPartition), got "
            f"{type(batch).__name__}. Use lightning_halo.HaloDataModule (or a DataLoader yielding this rank's partition)."
        )
    if int(batch.num_parts) != world_size or int(batch.part_id) != rank:
        raise ValueError(
            f"rank {rank} of {world_size} received partition {int(batch.part_id)} of "
            f"{int(batch.num_parts)}; each rank must get its own part of a {world_size}-way partition."
        )
    return batch


def check_input_dtype(batch: HaloPartition | HeteroHaloPartition, precision: Precision) -> None:
    """Refuse features of another dtype than the one a ``"*-true"`` precision runs the model in.

    Lightning converts the floating tensors of a step's input collections (``Precision.convert_input``), not the
    attributes of a PyG graph, so ``Trainer(precision="64-true")`` would meet float32 features in the first layer
    (a dtype error from deep inside it). ``"*-mixed"`` precisions take float32 inputs: nothing to check.

    Raises:
        TypeError: naming the precision, the node type and both dtypes, and how to convert the graph.
    """
    want = precision_input_dtype(precision)
    if want is None:
        return
    hetero = isinstance(batch, HeteroHaloPartition)
    for node_type, store in [(t, batch[t]) for t in batch.node_types] if hetero else [(None, batch)]:
        for key in ("x", "halo_x"):
            x = store.get(key)
            if isinstance(x, Tensor) and x.is_floating_point() and x.dtype != want:
                where = f" of node type {node_type!r}" if node_type is not None else ""
                raise TypeError(
                    f"Trainer(precision={getattr(precision, 'precision', '?')!r}) runs the model in {want}, but the "
                    f"partition's features `{key}`{where} are {x.dtype}: Lightning converts the tensors of a step's "
                    f"input collections, not the attributes of a PyG graph. Convert the graph's floating attributes "
                    f"before HaloDataModule (data.x = data.x.to({want}), and edge weights), or use precision='32-true'."
                )


def check_materialised(module: torch.nn.Module) -> None:
    """Refuse a model with lazy parameters (``in_channels=-1``, ``Linear(-1, ...)``) before DDP wraps it.

    DDP needs every parameter's shape when it wraps the model, and every rank must hold the same
    ones; PyG materialises lazy modules in the first forward pass, which under the strategy runs
    after wrapping, on each rank's own partition.

    Raises:
        RuntimeError: naming the parameters and the two ways to give them their shapes.
    """
    from torch.nn.parameter import is_lazy

    lazy = [name for name, p in module.named_parameters() if is_lazy(p)]
    if lazy:
        shown = ", ".join(lazy[:4]) + (f" and {len(lazy) - 4} more" if len(lazy) > 4 else "")
        raise RuntimeError(
            f"the model has parameters that are not initialised yet (lazy modules such as in_channels=-1 or "
            f"Linear(-1, ...)): {shown}. DDP needs their shapes before training, the same on every rank. Give the "
            "layers their input sizes (HaloDataModule.num_features: per node type for a heterogeneous graph), or "
            "run one forward pass on the whole graph before trainer.fit, as PyG's examples do: "
            "`with torch.no_grad(): model(dm.data)` (the model's forward as its steps call it); DDP then copies rank "
            "0's values to every rank."
        )


def _cores_per_rank(processes_per_node: int) -> int:
    """CPU cores this rank owns: SLURM's ``--cpus-per-task``, else its affinity mask shared by the node's ranks."""
    slurm = os.environ.get("SLURM_CPUS_PER_TASK")
    if slurm and slurm.isdigit():
        return max(1, int(slurm))
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, processes_per_node))


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

    What ``training_step`` returns must be said with ``scale_loss`` (see
    :mod:`lightning_halo.loss`), because DDP averages the ranks' gradients. By default
    (``"train_mean"``) it is taken as a mean over the partition's train nodes, as
    ``F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])`` is, and multiplied by
    :math:`P\,n_r / N_{train}`, so that DDP's averaged gradient is the gradient of the mean
    over all train nodes of the graph
    (:math:`\frac{1}{P}\sum_r \nabla (P\,n_r/N)\,L_r = \nabla \frac{1}{N}\sum_i \ell_i`).
    A loss over other nodes (a subset of the train nodes, class weights, a sum) is scaled
    wrongly by that rule: return this rank's *share* of the global objective instead (e.g.
    :func:`~lightning_halo.global_mean`) with ``scale_loss="share"``.

    Args:
        bits (int or str, optional): bits per value of forward halo rows in training: ``1``, ``2``,
            ``4``, ``8`` (stochastic rounding), ``16`` (bfloat16) or ``32`` (exact); or ``"adaptive"``:
            per layer call and direction, a width of ``bit_choices`` that every rank agrees on at each
            epoch's start, where the codec's variance bound of last epoch's rows says it matters most,
            within ``bit_budget`` (and, with a ``bit_target``, no wider than needed to meet it)
            (:mod:`lightning_halo.quant.allocate`, docs/quantization.md). (default: ``1``)
        grad_bits (int or str, optional): bits of backward halo gradients, or ``"adaptive"``. (default: ``bits``)
        eval_bits (int, optional): bits for validation/test/predict. (default: ``32``)
        bit_choices (tuple of int, optional): the widths an adaptive direction chooses from (by
            default ``BIT_CHOICES``, ``(1, 2, 4, 8)``).
        bit_budget (float, optional): the bytes per epoch the adaptive directions may move, as a multiple of
            their bytes at the narrowest choice (``1``: all at the narrowest; by default ``BIT_BUDGET``, ``2.0``).
        bit_target (float, optional): the noise an adaptive direction may add to its layer's outputs, as a
            share of their energy, before its width is raised (``0``: no target, widen while ``bit_budget``
            allows; by default ``BIT_TARGET``, ``0``).
        bit_monitor (str, optional): the name of a validation metric the module logs (e.g. ``"val_acc"``):
            adaptive widths stay at the narrowest choice while it improves. Once ``bit_patience`` validations in
            a row fail to improve it (its mean over the ranks, agreed in the widths' all-reduce), ``bit_budget``
            opens on trial: kept for the rest of the run if the metric beats its best within ``bit_patience``
            more validations, else given back (the narrowest choice for the rest of the run). ``None``: the
            budget is open from the first decision. (default: ``None``)
        bit_mode (str, optional): ``"max"`` (an accuracy) or ``"min"`` (a loss). (default: ``"max"``)
        bit_patience (int, optional): validations without improvement before the budget opens on trial, and on
            trial before it is given back (by default ``BIT_PATIENCE``, ``3``).
        scale_loss (str, optional): what the loss is: ``"train_mean"`` (a mean over the
            partition's train nodes; multiplied by :math:`P\,n_r/N_{train}`), ``"share"``
            (this rank's share of the global objective: the ranks' losses sum to it, e.g.
            :func:`~lightning_halo.global_mean` or a sum over nodes; multiplied by :math:`P`)
            or ``"none"`` (as returned, DDP averages). ``True``/``False`` mean
            ``"train_mean"``/``"none"``. (default: ``"train_mean"``)
        halo_timeout (float, optional): seconds a halo collective may wait for its peers
            before raising (a dead rank must not hang the job). (default: ``300``)
        seed (int, optional): seed of the per-rank stochastic-rounding generators. (default: ``0``)
        check_finite (bool, optional): raise on NaN/Inf in halo rows, naming the layer,
            direction and rank. (default: ``True``)
        aggregation (str, optional): how layers aggregate. ``"auto"``: every layer whose
            result does not depend on the edge order and that PyG can run on a sparse adjacency
            (``GCNConv``, ``SAGEConv``, ``GINConv``, ``GraphConv``, ``LGConv``, ``SimpleConv``,
            ``ClusterGCNConv``, ``APPNP``, ``SGConv``, ...) aggregates with one fused sparse-dense
            product on the partition's cached CSR adjacency (and its cached transpose for the
            backward), even when the model passes ``batch.edge_index``; the others keep
            ``edge_index``. ``"edge_index"``: always PyG's per-edge path. ``"sparse"``: like
            ``"auto"``, but a layer that cannot is an error. The choice per layer is logged
            once. (default: ``"auto"``)
        halo_reduction (str, optional): ``"cover"``: for a cut edge :math:`u \to v` of a layer
            that aggregates linearly on the fused path (``GCNConv``, ``SAGEConv`` with mean/sum,
            ``GINConv``, ``GraphConv``, ``LGConv``, ``SimpleConv``, ``ClusterGCNConv``, ``APPNP``,
            ``SGConv``, ``SSGConv``, ``TAGConv``, ``MixHopConv``, ``GCN2Conv``,
            ``GatedGraphConv``), either :math:`u`'s row crosses or :math:`u`'s owner adds up its
            contributions to :math:`v` and sends one partial sum, chosen per rank pair by a
            minimum vertex cover so that the fewest rows cross; exact (the sums are the layer's
            own), quantized like rows at ``bits < 32``. On a heterogeneous partition one exchange
            per layer and source type carries the partial sums of every relation of the layer
            that reads the type (:mod:`lightning_halo.layers.relation_cover`). ``"none"``: every
            halo row crosses. The choice per layer is in the layer report. (default: ``"cover"``)
        num_threads (int, optional): torch threads per rank. By default the cores this rank
            owns: SLURM's ``--cpus-per-task``, else the process' CPU affinity divided by the
            processes per node; ``OMP_NUM_THREADS`` in the environment is respected.
            (default: ``None``)
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
        ddp_comm_hook (callable, optional): a DDP communication hook for the parameters' gradient
            all-reduce (the next cost after the halo on wide first layers), e.g. from
            :mod:`torch.distributed.algorithms.ddp_comm_hooks`: ``default_hooks.fp16_compress_hook``
            or ``powerSGD_hook.powerSGD_hook`` (lossy, like ``bits < 32``). Registered on every
            backend, gloo included (Lightning's ``DDPStrategy`` registers it on CUDA only).
            (default: ``None``)
        ddp_comm_state (object, optional): the hook's state (e.g. a ``PowerSGDState``). (default: ``None``)
        ddp_comm_wrapper (callable, optional): a wrapper of the hook (e.g.
            ``default_hooks.fp16_compress_wrapper``). (default: ``None``)

    The DDP options are explicit parameters, not ``**kwargs``, so configs saved by the CLI do
    not depend on the torch version.

    Example:
        >>> trainer = L.Trainer(strategy=HaloQuantStrategy(bits=32), devices=2)  # exact
        >>> trainer = L.Trainer(strategy=HaloQuantStrategy(bits=1), accelerator="cpu", devices=2)  # lossy
        >>> trainer = L.Trainer(strategy="halo_exact", devices=2)  # registered names: halo_exact (bits=32),
        >>> trainer = L.Trainer(strategy="halo_1bit", devices=2)   # halo_1bit, halo_8bit, halo_quant (= 1 bit)
    """

    strategy_name = "halo_quant"

    def __init__(
        self,
        bits: Union[int, Literal["adaptive"]] = 1,
        grad_bits: Union[int, Literal["adaptive"], None] = None,
        eval_bits: int = 32,
        bit_choices: tuple[int, ...] = BIT_CHOICES,
        bit_budget: float = BIT_BUDGET,
        bit_target: float = BIT_TARGET,
        bit_monitor: Optional[str] = None,
        bit_mode: MonitorMode = "max",
        bit_patience: int = BIT_PATIENCE,
        scale_loss: Union[bool, LossScaling] = "train_mean",
        halo_timeout: float = 300.0,
        seed: int = 0,
        check_finite: bool = True,
        aggregation: Aggregation = "auto",
        halo_reduction: HaloReduction = "cover",
        num_threads: Optional[int] = None,
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
        ddp_comm_hook: Optional[Callable] = None,
        ddp_comm_state: Optional[object] = None,
        ddp_comm_wrapper: Optional[Callable] = None,
    ) -> None:
        # Every argument as given, taken first so that no parameter can be left out (``init_args``).
        self._init_args = {name: value for name, value in locals().items() if name not in ("self", "__class__")}
        check_halo_timeout(halo_timeout)
        check_num_threads(num_threads)
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
            ddp_comm_state=ddp_comm_state,
            ddp_comm_hook=ddp_comm_hook,
            ddp_comm_wrapper=ddp_comm_wrapper,
        )
        if ddp_comm_hook is not None and not callable(ddp_comm_hook):
            raise TypeError(f"ddp_comm_hook must be a DDP communication hook (a callable), got {ddp_comm_hook!r}")
        self._comm_hook = (ddp_comm_hook, ddp_comm_state, ddp_comm_wrapper)
        self._forward_redirection = step_output_redirection(self._tie_step_output)
        self.scale_loss: LossScaling = check_scale_loss(scale_loss)
        self.halo_timeout = float(halo_timeout)
        self.num_threads = num_threads
        #: The rank's halo exchange (checks and owns the bit widths, seeds and per-rank halo state).
        self.exchanger = HaloExchanger(
            None, bits=bits, grad_bits=grad_bits, eval_bits=eval_bits, seed=seed, check_finite=check_finite,
            bit_choices=tuple(bit_choices), bit_budget=bit_budget, bit_target=bit_target, bit_monitor=bit_monitor,
            bit_mode=bit_mode, bit_patience=bit_patience,
        )
        self._layers = LayerContext(self.exchanger, aggregation, halo_reduction)  # checks and owns both options
        self._policy: HaloPolicy = SYNC
        self._state_callback: Any = None  # the HaloStateCallback attached at setup (its sync_epoch)
        self._halo_group: Any = None
        self._hooks: list[LayerHook | RecomputeHook] = []
        self._norm_hooks: list[NormHook] = []
        self._reported: dict[str, str] = {}

    @property
    def init_args(self) -> dict[str, Any]:
        """Every argument this strategy was built with, by name, defaults included (a new dict).

        What is needed to build the same strategy elsewhere: :func:`~lightning_halo.verify` hands
        these options to the strategies of its ranks.

        Example:
            >>> HaloQuantStrategy(bits=32, halo_reduction="none").init_args["halo_reduction"]
            'none'
        """
        return dict(self._init_args)

    @property
    def bits(self) -> Union[int, str]:
        return self.exchanger.bits

    @property
    def grad_bits(self) -> Union[int, str]:
        return self.exchanger.grad_bits

    @property
    def eval_bits(self) -> int:
        return self.exchanger.eval_bits

    @property
    def aggregation(self) -> str:
        return self._layers.aggregation

    @property
    def halo_reduction(self) -> str:
        return self._layers.halo_reduction

    @property
    def layer_choices(self) -> dict[str, str]:
        """How each hooked layer ran (fused sparse or edge_index, and why), by layer name."""
        return dict(self._layers.choices)

    # ------------------------------------------------------------------ what callbacks use
    def use_policy(self, policy: HaloPolicy) -> None:
        """Run training epochs as ``policy`` says (:class:`~lightning_halo.HaloSchedule` hands it over at setup).

        Without one every epoch is ``"sync"``. Validation, test and predict always are.
        """
        self._policy = policy

    @property
    def traffic(self) -> TrafficMeter:
        """This rank's halo traffic (bytes and times), for reading (:class:`~lightning_halo.HaloTrafficLogger`)."""
        return self.exchanger.meter

    def staleness(self) -> dict[str, int]:
        """Epochs since each training exchange (a layer, or a step ``layer#k``) last received fresh rows."""
        return dict(zip(self.exchanger.slot_layers(), self.exchanger.staleness()))

    def halo_widths(self) -> dict[str, dict[str, int]]:
        """With ``bits="adaptive"``: per training exchange, this epoch's width per adaptive direction (``"fwd"``,
        ``"bwd"``), agreed by all ranks; empty where every width is fixed."""
        if not self.exchanger.adaptive_bits:
            return {}
        return dict(zip(self.exchanger.slot_layers(), self.exchanger.widths()))

    def halo_noise(self) -> dict[str, dict[str, float]]:
        """With ``bits="adaptive"``: per training exchange and adaptive direction, the noise its agreed width puts
        into the layer's outputs, relative to their energy (:func:`~lightning_halo.quant.allocate.output_variance`,
        as of the last decision; empty before the first measured epoch and where every width is fixed)."""
        if not self.exchanger.adaptive_bits:
            return {}
        return {layer: n for layer, n in zip(self.exchanger.slot_layers(), self.exchanger.width_noise()) if n}

    def halo_waits(self) -> dict[str, float]:
        """In an ``"adaptive"`` run with a wait threshold: per training exchange, the agreed share of the training
        step its last synchronous exchanges waited (the least over the ranks)."""
        return dict(zip(self.exchanger.slot_layers(), self.exchanger.wait_shares()))

    def halo_decisions(self) -> dict[str, tuple[str, float]]:
        """In an ``"adaptive"`` run: per training exchange, this epoch's choice (``"pipelined"``: stale, or
        ``"sync"``) and the drift, agreed by all ranks, that decided it (``inf``: not measured yet)."""
        return dict(zip(self.exchanger.slot_layers(), self.exchanger.decisions()))

    # ------------------------------------------------------------------ environment
    @override
    def connect(self, model: pl.LightningModule) -> None:
        # Refuse an unsupported layer before anything is partitioned (prepare_data runs later); a model
        # without layers yet may build them in configure_model, so that is checked at setup.
        if compiled_by_trainer(model) and find_message_passing(model):
            # Lightning unwrapped trainer.fit(torch.compile(model)) and compiles it again after setup
            raise UnsupportedLayerError(
                f"'{type(model).__name__}' was given to the Trainer compiled (trainer.fit(torch.compile(model))) and "
                f"holds message-passing layers: {COMPILE_REFUSAL}"
            )
        check_model(model, require_layers=False)
        super().connect(model)

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        release_at_exit()  # gloo threads must not outlive the interpreter: see lightning_halo.shutdown
        self._set_threads()
        if self.world_size > 1 and self._halo_group is None:
            # Its own group: halo traffic never interleaves with DDP's all-reduce on the default one.
            self._halo_group = dist.new_group(
                backend=self._get_process_group_backend(), timeout=timedelta(seconds=self.halo_timeout)
            )
        self.exchanger.connect(
            DistTransport(self._halo_group, self.global_rank, self.world_size) if self._halo_group is not None else None
        )
        trainer = self._trainer()
        if trainer is not None:
            self._add_callbacks(trainer)

    def _trainer(self) -> Optional[pl.Trainer]:
        """The Trainer the LightningModule is attached to, if any."""
        module = self.lightning_module
        if module is None:
            return None
        try:
            return module.trainer
        except RuntimeError:  # not attached to a Trainer
            return None

    @override
    def load_checkpoint(self, checkpoint_path: Union[str, os.PathLike], **kwargs: Any) -> dict[str, Any]:
        """Lightning's loading, with an error that names the file when it cannot be read.

        Raises:
            RuntimeError: the checkpoint is truncated or corrupt (nothing has been written yet).
        """
        try:
            return super().load_checkpoint(checkpoint_path, **kwargs)
        except (RuntimeError, EOFError, OSError, ValueError) as err:
            if isinstance(err, FileNotFoundError):
                raise
            raise RuntimeError(
                f"cannot read the checkpoint {os.fspath(checkpoint_path)!r}: it is truncated or corrupt ({err}). "
                "Nothing was trained or overwritten; resume from an earlier checkpoint (or another copy of this one)."
            ) from err

    def _add_callbacks(self, trainer: pl.Trainer) -> None:
        """Traffic logging and checkpoint state are part of the strategy, not user options.

        Added here, before Lightning restores callback states from a checkpoint.
        """
        from lightning_halo.callbacks import HaloRequeue, HaloStateCallback, HaloTrafficLogger
        from lightning_halo.callbacks.bits import HaloBitMonitor

        if not any(isinstance(cb, HaloTrafficLogger) for cb in trainer.callbacks):
            trainer.callbacks.append(HaloTrafficLogger())
        if HaloRequeue.applies(trainer) and not any(isinstance(cb, HaloRequeue) for cb in trainer.callbacks):
            trainer.callbacks.append(HaloRequeue())  # SLURM's requeue signal, acted on between steps
        state = next((cb for cb in trainer.callbacks if isinstance(cb, HaloStateCallback)), None)
        if state is None:
            state = HaloStateCallback()
            trainer.callbacks.append(state)
        state.attach(self.exchanger.state, self.global_rank, self.world_size)
        self._state_callback = state
        monitor = self.exchanger.bit_monitor
        if monitor is not None and not any(isinstance(cb, HaloBitMonitor) for cb in trainer.callbacks):
            # first: its on_validation_end must run before a ModelCheckpoint saving at that hook
            trainer.callbacks.insert(0, HaloBitMonitor(monitor, self.exchanger))

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        self._install_hooks()
        ex = self.exchanger
        if trainer.training:  # say whether this run is exact: the class default (bits=1) is not
            what = (
                "exact for the hooked layers; run `lightning-halo verify` to check your own code"
                if ex.bits == ex.grad_bits == 32
                else "quantized: lossy, unbiased; bits=32 is exact"
            )
            widths = f"bits={ex.bits!r}, grad_bits={ex.grad_bits!r}"
            if ex.adaptive_bits:  # bits="adaptive": say what it chooses from and within which bytes
                target = f", output noise target {ex.bit_target:g}" if ex.bit_target else ""
                if ex.bit_monitor is not None:
                    target += (f"; at {ex.bit_choices[0]} bit until {ex.bit_monitor} ({ex.bit_mode}) stops improving "
                               f"for {ex.bit_patience} validations, then the budget on trial")  # fmt: skip
                widths += (f" (widths of {ex.bit_choices} agreed every epoch, within {ex.bit_budget:g}x their "
                           f"narrowest bytes{target})")  # fmt: skip
            rank_zero_info(f"lightning-halo: training halos at {widths} ({what})")

    def _set_threads(self) -> None:
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
        elif "OMP_NUM_THREADS" not in os.environ and self.root_device.type == "cpu":
            torch.set_num_threads(_cores_per_rank(self.num_processes))

    def _install_hooks(self) -> None:
        self._remove_hooks()
        module = self.lightning_module
        assert module is not None
        self._refuse_graph_norms(module)
        self._hooks = install_hooks(module, self._layers)  # raises for unsupported layers
        # batch norms use the statistics of every partition's nodes (exact on CPU too, unlike SyncBatchNorm)
        self._norm_hooks = install_batch_norms(module, self._layers)
        log.debug("lightning-halo: hooked %s", {h.name: h.kind for h in self._hooks})

    def _refuse_graph_norms(self, module: torch.nn.Module) -> None:
        """Refuse a graph-wide PyG norm that is not made global (the others run over every rank's rows)."""
        if self.world_size == 1:  # the partition is the whole graph: every norm sees what it would alone
            return
        for name, sub in module.named_modules():
            message = graph_norm_refusal(name, sub)  # the list and the words are the registry's
            if message is not None:
                raise UnsupportedLayerError(message)

    def _remove_hooks(self) -> None:
        for hook in [*self._hooks, *self._norm_hooks]:
            hook.remove()
        self._hooks, self._norm_hooks = [], []

    # ------------------------------------------------------------------ steps
    def _begin(self, args: tuple, kwargs: dict, training: bool) -> HaloPartition | HeteroHaloPartition:
        batch = check_batch(args[0] if args else kwargs.get("batch"), self.global_rank, self.world_size)
        use_exchanger(self.exchanger)  # lightning_halo.gather_rows in the step runs on it
        if self.exchanger.bind(batch):  # another partition (not another stage's view of the bound one)
            check_input_dtype(batch, self.precision_plugin)
            self._layers.bind(batch)
            if self.exchanger.active:
                self._check_plans()
        if training and self.root_device.type == "cpu":
            # glibc keeps the last step's freed activations in its heap (its mmap threshold grows
            # after large frees): returning them before the step lowers the step's peak and the
            # resident set between steps (measured in docs/benchmarks.md#memory-per-rank)
            trim_heap()
        trainer = self._trainer()
        epoch = int(trainer.current_epoch) if trainer is not None else 0
        mode = self._policy.mode_at(epoch) if training else "sync"
        if self._state_callback is not None and self._state_callback.sync_epoch == epoch:
            mode = "sync"  # resumed at another process count: no stale rows to read (HaloStateCallback)
        # a run synchronous throughout never reads old halo rows: the slots do not keep them
        self.exchanger.begin_step(
            training, epoch, mode, self._policy.smoothing, keep_history=self._policy.mode != "sync",
            drift_bound=self._policy.drift_bound, wait_bound=self._policy.wait_bound,
        )  # fmt: skip
        self._layers.begin_step()  # the last step's fetched halos go before this step's forward
        return batch

    def _check_plans(self) -> None:
        """Cheap collective at the first step on a newly bound partition: every peer must expect exactly the
        rows we send. Run at every such bind (the exchanger says which are new), so nothing is remembered
        by object identity."""
        ex = self.exchanger
        sigs: list[Any] = [None] * self.world_size
        if not ex.hetero:
            dist.all_gather_object(sigs, ex.plan().signature(), group=self._halo_group)
            check_signatures(sigs, self.global_rank)
            return
        keys = ex.plan_keys()  # "in" (their sum) and one per node type
        dist.all_gather_object(sigs, tuple((k, ex.plan(k).signature()) for k in keys), group=self._halo_group)  # type: ignore[arg-type]
        for i, key in enumerate(keys):
            if any(len(s) != len(keys) or s[i][0] != key for s in sigs):
                raise ValueError(f"rank {self.global_rank}: the ranks' partitions have other node types; every rank "
                                 "must read the same graph")  # fmt: skip
            check_signatures([s[i][1] for s in sigs], self.global_rank)

    def _report_layers(self) -> None:
        """Say once, on rank 0, how each layer runs (fused or edge_index, and why)."""
        choices = self._layers.choices
        if choices != self._reported:
            new = {k: v for k, v in choices.items() if self._reported.get(k) != v}
            self._reported = dict(choices)
            rank_zero_info("lightning-halo layers:\n" + "\n".join(f"  {k}: {v}" for k, v in new.items()))

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        self._begin(args, kwargs, training=True)
        out = super().training_step(*args, **kwargs)
        self._report_layers()
        module = self.lightning_module
        if out is None and module is not None and module.automatic_optimization and self.exchanger.active:
            raise RuntimeError(
                "training_step returned None, which skips backward on this rank while its peers wait for its halo "
                "gradients. Return a loss on every rank (a partition without train nodes still returns its loss)."
            )
        return out

    def _tie_step_output(self, out: STEP_OUTPUT) -> STEP_OUTPUT:
        """The training step's loss tied to its fetched halos, inside DDP's forward (see
        :func:`~lightning_halo._compat.lightning.step_output_redirection`); backward ties what is left."""
        if isinstance(out, Tensor):
            return self.exchanger.tie_halos(out)
        if isinstance(out, dict) and isinstance(out.get("loss"), Tensor):
            return {**out, "loss": self.exchanger.tie_halos(out["loss"])}
        return out

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        self._begin(args, kwargs, training=False)
        out = super().validation_step(*args, **kwargs)
        self._report_layers()
        return out

    @override
    def test_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        self._begin(args, kwargs, training=False)
        return super().test_step(*args, **kwargs)

    @override
    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        self._begin(args, kwargs, training=False)
        return super().predict_step(*args, **kwargs)

    @override
    def configure_ddp(self) -> None:
        if self.lightning_module is not None:
            check_materialised(self.lightning_module)
        super().configure_ddp()
        hook, state, wrapper = self._comm_hook
        if hook is not None and self.root_device.type != "cuda":  # DDPStrategy registers it on CUDA only
            model = self.model
            assert isinstance(model, DistributedDataParallel)
            model.register_comm_hook(state=state, hook=hook if wrapper is None else wrapper(hook))

    @override
    def backward(self, closure_loss: Tensor, optimizer: Optional[Optimizer], *args: Any, **kwargs: Any) -> Tensor:
        loss = scaled_loss(closure_loss, self.scale_loss, self.world_size, self.exchanger.part)
        loss = self.exchanger.prepare_loss(loss)
        out = super().backward(loss, optimizer, *args, **kwargs)
        self.exchanger.end_step()  # adaptive staleness times the step's halo waits against it
        self._layers.end_step()
        return out

    @override
    def on_exception(self, exception: BaseException) -> None:
        # DDPStrategy's explanation of DDP's unused-parameter error names DDPStrategy: name this strategy.
        exception.args = tuple(
            _UNUSED_PARAMETERS_FIX if isinstance(a, str) and re.match(_UNUSED_PARAMETERS, a, re.DOTALL) else a
            for a in exception.args
        )
        super().on_exception(exception)
        # A failed run must leave no process behind: a rank frozen in user code never reaches the
        # collective that would time out.
        stop_launched_ranks(self.launcher)

    # ------------------------------------------------------------------ teardown, registry
    @override
    def teardown(self) -> None:
        try:
            self.exchanger.flush()
        except Exception as err:  # a dead peer must not mask the original error
            log.warning("lightning-halo: could not flush pending halo exchanges: %s", err)
        self._remove_hooks()
        release_exchanger(self.exchanger)
        self.exchanger.release()  # the partition and what was built from it: a next fit binds afresh
        self._layers.release()
        if self._halo_group is not None:
            self.exchanger.connect(None)
            dist.destroy_process_group(self._halo_group)
            self._halo_group = None
        self._policy = SYNC  # a schedule hands its policy over again at the next setup
        super().teardown()

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: StrategyRegistryType) -> None:
        from lightning_halo.names import register_names

        register_names(strategy_registry, cls)
