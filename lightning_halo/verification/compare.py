r"""One training step on one process against the same step on :math:`P`: pure comparisons.

A *record* is what :class:`~lightning_halo.verification.recorder.StepRecorder` saves for one
rank: the global ids of its rows (``n_id``), every module call of the step in order with its
inputs and outputs, the loss and the gradients. :func:`compare_step` puts the ranks' rows
together in global node order and compares them with the one-process record, call by call,
and names the first module whose output differs.

A tensor is compared *per node* when it has a row per node (``N`` rows on one process, the
rank's ``n_inner`` rows on each rank; on a heterogeneous graph, of one node type, the record
holding each type's ids); else as a whole, when it has the same shape everywhere (a
graph-level value, a parameter-sized one). Tensors of other shapes (per edge: each rank holds
its own edges) are not compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor

#: ``(rtol, atol)`` by dtype: values are close when ``|a - b| <= atol * max(1, max|b|) + rtol * |b|``.
TOLERANCES = {torch.float64: (1e-7, 1e-9), torch.float32: (1e-4, 1e-5)}

DOCS = "docs/layers.md#what-the-hooks-cannot-see"


@dataclass(frozen=True)
class ModuleDifference:
    """The first module call whose output differs between one process and :math:`P`.

    Args:
        name (str): the module's name in the LightningModule (``""`` for the module itself).
        cls (str): its class name.
        call (int): which call of it in the step (``1`` for the first).
        inputs_differ (bool): whether its inputs differed already.
        previous (str, optional): the module called just before it (``None`` if it was the first).
        max_diff (float): the largest difference of its output.
    """

    name: str
    cls: str
    call: int
    inputs_differ: bool
    previous: Optional[str]
    max_diff: float

    def explain(self) -> str:
        where = f"`{self.name or '<LightningModule>'}` ({self.cls}), call {self.call}"
        if self.inputs_differ:
            before = f"after `{self.previous}`, whose output matched" if self.previous else "before any module ran"
            return (
                f"the first module whose output differs is {where}, and its input differs already: the code that "
                f"computes that input ({before}), in forward or training_step, gives another result on a partition. "
                "Look there for code that reads all nodes (global_mean_pool(h, None), h.mean(0), x.size(0), "
                "F.normalize(h, dim=0)) or positions (torch.arange(x.size(0)), emb.weight[:n]: look up per-node "
                "parameters with batch.n_id)"
            )
        return (
            f"the first module whose output differs is {where}, from the same input: it computes its output over "
            "more than each node's own row (statistics over all rows it sees, such as a norm over the batch, or a "
            "custom layer that reduces over nodes or reads the edges itself)"
        )


@dataclass
class VerifyReport:
    """What :func:`~lightning_halo.verify` found: whether one step on :math:`P` processes equals one process.

    Args:
        devices (int): :math:`P`.
        dtype (torch.dtype): the dtype both runs used.
        ok (bool): loss, every compared module output and every gradient are close, and nothing
            that must be compared was missing (see ``not_compared``).
        loss (tuple, optional): ``(one process, P processes)``: the whole graph's loss.
        logits_diff (float, optional): largest difference of the logits (the output of the last
            module called with a row per node).
        grads_differ (list): names of the parameters whose gradients differ.
        first_difference (ModuleDifference, optional): the first module whose output differs.
        compared (int): module calls compared.
        error (str, optional): why the :math:`P`-process run stopped, if it did.
        not_compared (list): what could not be compared, and why (e.g. ``training_step``
            returned no loss): the step is then not verified, and the report not ``ok``.
        strategy (str, optional): the strategy both runs used, as the ranks built it
            (``HaloQuantStrategy(bits=32, ...)``, its options that are not their defaults).
        notes (list): anything else worth knowing (e.g. why it ran in float32).
        unused (list): parameters that get no gradient from the loss, where gradients differ and DDP runs without
            ``find_unused_parameters``: it leaves the gradients that share their buckets unreduced.

    Example:
        >>> report = verify(model, dm, devices=2)  # doctest: +SKIP
        >>> if not report:  # doctest: +SKIP
        ...     print(report.first_difference.name, report.grads_differ)
        conv2 ['conv1.bias', 'conv1.lin.weight', 'conv2.bias', 'conv2.lin.weight']
    """

    devices: int
    dtype: torch.dtype
    ok: bool = True
    loss: Optional[tuple[float, float]] = None
    logits_diff: Optional[float] = None
    grads_differ: list[str] = field(default_factory=list)
    first_difference: Optional[ModuleDifference] = None
    compared: int = 0
    error: Optional[str] = None
    not_compared: list[str] = field(default_factory=list)
    strategy: Optional[str] = None
    notes: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        differs = self.error is not None or self.first_difference is not None or bool(self.grads_differ)
        head = "exact" if self.ok else "NOT exact" if differs or not self.not_compared else "NOT verified"
        dtype = str(self.dtype).replace("torch.", "")
        lines = [f"lightning-halo verify: {head}: one training step on {self.devices} processes vs one process ({dtype})"]
        if self.strategy is not None:
            lines.append(f"  strategy: {self.strategy}")
        lines.extend(f"  not compared: {what}" for what in self.not_compared)
        if self.error is not None:
            lines.append(f"  the {self.devices}-process run stopped: {self.error}")
        if self.loss is not None:
            lines.append(f"  loss: {self.loss[0]:.10g} on one process, {self.loss[1]:.10g} on {self.devices}")
        if self.logits_diff is not None:
            lines.append(f"  logits: largest difference {self.logits_diff:.3g}")
        if self.compared:
            lines.append(f"  module calls compared: {self.compared}")
        if self.grads_differ:
            shown = ", ".join(self.grads_differ[:5]) + (", ..." if len(self.grads_differ) > 5 else "")
            lines.append(f"  gradients differ: {len(self.grads_differ)} parameter(s): {shown}")
        if self.first_difference is not None:
            lines.append(f"  {self.first_difference.explain()}.")
        elif self.unused:
            lines.append(
                f"  {len(self.unused)} parameter(s) get no gradient from this loss ({_shown(self.unused)}): DDP then "
                "leaves the gradients that share their buckets unreduced on each rank (training would stop at the "
                "next step). Pass HaloQuantStrategy(find_unused_parameters=True), or leave out what the loss does "
                "not read."
            )
        elif not self.ok and self.error is None and head == "NOT exact":
            lines.append(
                "  every module's output matched, so the difference arises after the last module: in forward or "
                "training_step (a loss or a value over all rows, e.g. out.mean(), a pool of the output)."
            )
        if not self.ok and self.error is None and head == "NOT exact" and not self.unused:
            lines.append(f"  What code outside the layers must do on a partition: {DOCS}")
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)


def _shown(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def tolerances(dtype: torch.dtype, rtol: Optional[float] = None, atol: Optional[float] = None) -> tuple[float, float]:
    """``(rtol, atol)`` for ``dtype`` (:data:`TOLERANCES`), each overridable."""
    r, a = TOLERANCES.get(dtype, TOLERANCES[torch.float32])
    return (r if rtol is None else rtol, a if atol is None else atol)


def max_diff(a: Tensor, b: Tensor) -> float:
    """Largest ``|a - b|`` (NaN where exactly one side is NaN counts as infinite)."""
    a, b = a.to(torch.float64), b.to(torch.float64)
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    both = torch.isnan(a) & torch.isnan(b)
    d = torch.where(both, torch.zeros_like(a), (a - b).abs())
    return float(torch.nan_to_num(d, nan=float("inf")).max())


def close(a: Tensor, b: Tensor, rtol: float, atol: float) -> bool:
    """Whether ``a`` and ``b`` agree: ``|a - b| <= atol * max(1, max|b|) + rtol * |b|`` everywhere (NaNs agree)."""
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    a, b = a.to(torch.float64), b.to(torch.float64)
    scale = max(1.0, float(torch.nan_to_num(b.abs(), nan=0.0, posinf=0.0).max()))
    both = torch.isnan(a) & torch.isnan(b)
    ok = (a - b).abs() <= atol * scale + rtol * b.abs()
    return bool((ok | both).all())


def node_sets(rec: dict[str, Any]) -> list[tuple[Tensor, int]]:
    """The node sets a record's rows may be of, ``(global ids of its rows, how many)``: the graph's nodes, or on a
    heterogeneous graph each node type's (ids within the type)."""
    if "types" in rec:
        return [(n_id, n_inner) for n_id, n_inner in rec["types"].values()]
    return [(rec["n_id"], rec["n_inner"])]


def _layouts(ref: Tensor, ranks: list[Tensor], ref_rec: dict[str, Any], recs: list[dict[str, Any]]) -> list[int]:
    """The node sets ``ref`` and the ranks' tensors have a row per node of (``N`` rows on one process, each rank's
    share on the ranks); several where types have equal counts everywhere, none for other tensors."""
    if ref.dim() == 0:
        return []
    found = []
    rank_sets = [node_sets(r) for r in recs]
    for i, (_, n) in enumerate(node_sets(ref_rec)):
        if ref.size(0) == n and all(
            t.dim() >= 1 and t.size(0) == sets[i][1] and t.shape[1:] == ref.shape[1:] for t, sets in zip(ranks, rank_sets)
        ):
            found.append(i)
    return found


def per_node(ref: Tensor, ranks: list[Tensor], ref_rec: dict[str, Any], recs: list[dict[str, Any]]) -> bool:
    """Whether ``ref`` and the ranks' tensors have a row per node (of the graph, or of one node type)."""
    return bool(_layouts(ref, ranks, ref_rec, recs))


def in_node_order(t: Tensor, n_id: Tensor, num_nodes: int) -> Tensor:
    """``t``'s rows placed at their global ids (rows of no rank are NaN), in float64."""
    out = torch.full((num_nodes, *t.shape[1:]), float("nan"), dtype=torch.float64)
    out[n_id] = t.to(torch.float64)
    return out


def assemble(ranks: list[Tensor], ids: list[Tensor], num_nodes: int) -> Tensor:
    """The whole graph's ``[N, ...]`` tensor from every rank's rows (``ids``: each rank's rows' global ids)."""
    out = in_node_order(ranks[0], ids[0], num_nodes)
    for t, n_id in zip(ranks[1:], ids[1:]):
        out[n_id] = t.to(torch.float64)
    return out


def compare_tensor(
    ref: Tensor, ranks: list[Tensor], ref_rec: dict[str, Any], recs: list[dict[str, Any]], rtol: float, atol: float
) -> tuple[bool, Optional[float]]:
    """``(comparable, largest difference or None if they agree)``; per-edge tensors are not comparable.

    A tensor whose row count fits several node types (equal counts on every rank) agrees if it agrees as
    one of them."""
    diffs = []
    for i in _layouts(ref, ranks, ref_rec, recs):
        ref_ids, num_nodes = node_sets(ref_rec)[i]
        want = in_node_order(ref, ref_ids, num_nodes)
        got = assemble(ranks, [node_sets(r)[i][0] for r in recs], num_nodes)
        if close(got, want, rtol, atol):
            return True, None
        diffs.append(max_diff(got, want))
    if diffs:
        return True, min(diffs)
    if all(t.shape == ref.shape for t in ranks):
        worst = [max_diff(t, ref) for t in ranks if not close(t, ref, rtol, atol)]
        return True, max(worst) if worst else None
    return False, None


def compare_all(
    refs: list[Tensor], ranks: list[list[Tensor]], ref_rec: dict[str, Any], recs: list[dict[str, Any]], rtol: float,
    atol: float,
) -> tuple[int, Optional[float]]:  # fmt: skip
    """Tensors compared position by position: ``(how many could be compared, largest difference or None)``."""
    if any(len(ts) != len(refs) for ts in ranks):
        return 1, float("inf")
    compared, worst = 0, None
    for j, ref in enumerate(refs):
        comparable, d = compare_tensor(ref, [ts[j] for ts in ranks], ref_rec, recs, rtol, atol)
        compared += comparable
        if d is not None:
            worst = d if worst is None else max(worst, d)
    return compared, worst


def _calls_by_key(rec: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    counts: dict[str, int] = {}
    out = {}
    for call in rec["calls"]:
        counts[call["name"]] = counts.get(call["name"], 0) + 1
        out[(call["name"], counts[call["name"]])] = call
    return out


def _label(call: dict[str, Any]) -> str:
    return call["name"] or "<LightningModule>"


def _encloses(outer: dict[str, Any], inner: dict[str, Any]) -> bool:
    """Whether the call ``outer`` began before ``inner`` and ended after it (a record without times: never)."""
    times = (outer.get("start"), inner.get("start"), outer.get("end"), inner.get("end"))
    return None not in times and outer["start"] < inner["start"] and outer["end"] > inner["end"]


def first_difference(
    ref_rec: dict[str, Any], recs: list[dict[str, Any]], rtol: float, atol: float
) -> tuple[Optional[ModuleDifference], int, Optional[float]]:
    """``(first differing module call, calls compared, largest difference of the logits)``.

    Calls are taken in the order they end, so a module nested in another (an embedding called in
    ``forward``) is judged before the one around it. A differing call none of whose inputs could
    be compared (an aggregation fed per-edge messages) is not blamed yet: the call around it is
    named instead if its inputs could be (and differ, or not). A differing call fed differing
    inputs is named by the outermost call around it that was fed differing inputs too (the layer,
    not its inner linear map). The logits are the output of the last module call with a row per node.
    """
    rank_calls = [_calls_by_key(r) for r in recs]
    counts: dict[str, int] = {}
    matched: list[dict[str, Any]] = []  # calls compared and found equal, in the order they ended
    found: Optional[ModuleDifference] = None
    found_call: dict[str, Any] = {}
    pending: Optional[tuple[dict[str, Any], ModuleDifference]] = None  # differs, inputs not comparable
    compared, logits = 0, None
    for call in ref_rec["calls"]:
        counts[call["name"]] = k = counts.get(call["name"], 0) + 1
        mine = [calls.get((call["name"], k)) for calls in rank_calls]
        before = [c for c in matched if c["end"] < call["start"]]
        previous = _label(before[-1]) if before else None
        if any(m is None for m in mine):  # called fewer times on some rank
            found = found or ModuleDifference(call["name"], call["cls"], k, True, previous, float("inf"))
            continue
        n_out, out_diff = compare_all(call["outputs"], [m["outputs"] for m in mine], ref_rec, recs, rtol, atol)
        compared += n_out > 0
        if call["outputs"] and per_node(call["outputs"][0], [m["outputs"][0] for m in mine], ref_rec, recs):
            logits = out_diff or 0.0
        if out_diff is None and n_out:
            matched.append(call)
        elif out_diff is not None and found is None:
            if pending is not None and not _encloses(call, pending[0]):
                continue  # another call, after the pending one: the pending one stands unless one around it explains it
            n_in, in_diff = compare_all(call["inputs"], [m["inputs"] for m in mine], ref_rec, recs, rtol, atol)
            here = ModuleDifference(call["name"], call["cls"], k, in_diff is not None, previous, out_diff)
            if n_in:
                found, found_call = here, call
            elif pending is None:
                pending = (call, here)
            else:
                pending = (call, pending[1])
    if found is None and pending is not None:
        found = pending[1]
    elif found is not None and found.inputs_differ:
        found = _outermost_fed(found, found_call, ref_rec, recs, rank_calls, rtol, atol)
    return found, compared, logits


def _outermost_fed(
    found: ModuleDifference, call: dict[str, Any], ref_rec: dict[str, Any], recs: list[dict[str, Any]],
    rank_calls: list[dict[tuple[str, int], dict[str, Any]]], rtol: float, atol: float,
) -> ModuleDifference:  # fmt: skip
    """The outermost call around ``call`` that was given differing inputs too (a layer whose inner linear map
    is the first to show the difference): the module the differing input was handed to."""
    counts: dict[str, int] = {}
    best: Optional[tuple[dict[str, Any], int]] = None
    for outer in ref_rec["calls"]:
        counts[outer["name"]] = k = counts.get(outer["name"], 0) + 1
        if not _encloses(outer, call) or (best is not None and outer["start"] > best[0]["start"]):
            continue
        mine = [calls.get((outer["name"], k)) for calls in rank_calls]
        if any(m is None for m in mine):
            continue
        n_in, in_diff = compare_all(outer["inputs"], [m["inputs"] for m in mine], ref_rec, recs, rtol, atol)
        if n_in and in_diff is not None:
            best = (outer, k)
    if best is None:
        return found
    outer, k = best
    _, out_diff = compare_all(outer["outputs"], [m["outputs"] for m in (c.get((outer["name"], k)) for c in rank_calls)],
                              ref_rec, recs, rtol, atol)  # fmt: skip
    return ModuleDifference(outer["name"], outer["cls"], k, True, found.previous, out_diff if out_diff is not None else found.max_diff)


def global_loss(recs: list[dict[str, Any]]) -> Optional[float]:
    """The whole graph's loss: the mean over ranks of what each back-propagates (see :mod:`lightning_halo.loss`)."""
    values = [r.get("scaled_loss") for r in recs]
    if any(v is None for v in values):
        return None
    return sum(values) / len(values)


def missing_loss(ref_rec: dict[str, Any], recs: list[dict[str, Any]]) -> Optional[str]:
    """Why the loss cannot be compared (``training_step`` returned none on one side), or None if it can."""
    where = ["one process"] if ref_rec.get("scaled_loss") is None else []
    ranks = [str(r.get("rank", i)) for i, r in enumerate(recs) if r.get("scaled_loss") is None]
    if ranks:
        where.append(f"rank {', '.join(ranks)}" if len(ranks) == 1 else f"ranks {', '.join(ranks)}")
    if not where:
        return None
    return (
        f"the loss: training_step returned no loss on {' and on '.join(where)} (None, or a dict without 'loss'); "
        "verify compares one optimisation step: return the loss that is back-propagated"
    )


def compare_step(
    ref_rec: dict[str, Any], recs: list[dict[str, Any]], *, rtol: Optional[float] = None, atol: Optional[float] = None
) -> VerifyReport:
    """Compare a one-process record with the records of the ranks of a :math:`P`-process run.

    Args:
        ref_rec (dict): the one-process record.
        recs (list): one record per rank, in rank order.
        rtol (float, optional): relative tolerance. (default: by dtype, :data:`TOLERANCES`)
        atol (float, optional): absolute tolerance, times ``max(1, max|reference|)``. (default: by dtype)

    Returns:
        The :class:`VerifyReport`.
    """
    dtype = ref_rec["dtype"]
    rtol, atol = tolerances(dtype, rtol, atol)
    report = VerifyReport(devices=len(recs), dtype=dtype)
    report.first_difference, report.compared, report.logits_diff = first_difference(ref_rec, recs, rtol, atol)
    want, got = global_loss([ref_rec]), global_loss(recs)
    loss_ok = True
    missing = missing_loss(ref_rec, recs)
    if missing is not None:
        report.not_compared.append(missing)
    else:
        report.loss = (want, got)  # type: ignore[assignment]
        loss_ok = close(torch.tensor(got), torch.tensor(want), rtol, atol)
    for name, g in ref_rec["grads"].items():
        if not all(name in r["grads"] and close(r["grads"][name], g, rtol, atol) for r in recs):
            report.grads_differ.append(name)
    # A layer whose output reaches the loss only through the exchange is tied in with weight 0 on partitions (so
    # backward reaches every peer): a zero gradient where one process has none, the same step but for weight decay.
    extra = sorted({n for r in recs for n in r["grads"]} - set(ref_rec["grads"]))
    zero = [n for n in extra if all(n not in r["grads"] or not r["grads"][n].any() for r in recs)]
    report.grads_differ += [n for n in extra if n not in zero]
    if zero:
        report.notes.append(
            f"{len(zero)} parameter(s) get a zero gradient on partitions and none on one process ({_shown(zero)}): "
            "their layer's output does not reach the loss; the step is the same, except that weight decay applies "
            "to them on partitions"
        )
    unused = ref_rec.get("no_grad", [])
    if unused and report.grads_differ and not ref_rec.get("strategy", {}).get("find_unused_parameters", False):
        report.unused = list(unused)
    report.ok = loss_ok and not report.grads_differ and report.first_difference is None and not report.not_compared
    return report
