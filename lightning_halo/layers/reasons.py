"""Why a layer call takes the slower or wider path: enums that the code branches on, whose values are the words.

The layer report (:meth:`~lightning_halo.layers.call.LayerCall.describe`) and the errors quote
the values; code compares members, never text, so rewording a reason cannot change a decision.
A value may name the aggregation it is about (``{reduce}``), filled in by :meth:`Reason.text`.
"""

from __future__ import annotations

from enum import Enum


class Reason(str, Enum):
    """A reason; its value is the text the report prints (``{reduce}``: the aggregation it is about)."""

    def text(self, reduce: str = "") -> str:
        """The words, with the aggregation filled in.

        Example:
            >>> EdgeIndexReason.NO_CUDA_KERNEL.text("max")
            'torch has no CUDA kernel for sparse max'
        """
        return self.value.format(reduce=reduce)


class EdgeIndexReason(Reason):
    """Why a call runs on PyG's ``edge_index`` path instead of the fused sparse aggregation."""

    OPTION = "aggregation='edge_index'"
    UNFUSED_CLASS = (
        "PyG generated its class's propagate without the fused branch (the first instance built in this "
        "process could not fuse)"
    )
    NO_SPARSE_PATH = "it has no fused sparse aggregation in PyG (per-edge computation)"
    FLIPPED = "flow='target_to_source' (PyG has no sparse path for it)"
    WEIGHT_GRADIENTS = "its edge weights need gradients"
    WEIGHTED_MIN_MAX = "{reduce} aggregation with edge weights"
    NO_CUDA_KERNEL = "torch has no CUDA kernel for sparse {reduce}"
    #: on a relation of a heterogeneous partition the layer's own forward would receive the adjacency
    RENORMALIZES = (
        "it normalises its input in its forward, and PyG normalises a sparse adjacency differently from "
        "edge_index where edges repeat or loop"
    )


class ReductionReason(Reason):
    """Why a call fetches every halo row instead of receiving partial sums (``halo_reduction="cover"``)."""

    OPTION = "halo_reduction='none'"
    ONE_PROCESS = "one process"
    NOT_FUSED = "not on the fused path"
    NOT_LINEAR = "{reduce} aggregation is not linear"
    NONLINEAR_TRANSFORM = "its rows pass a non-linear transform before the aggregation"
    REVERSED = "reversed edges"
    EDGE_SUBSET = "edges kept by dropout_edge"
    USER_SPARSE = "a user's sparse adjacency"
    #: a call on the partition's input features: its halo rows are stored locally, none crosses
    STORED_INPUT = "its input's halo is stored in the partition"


#: Reductions that do not concern the wire: the report says nothing about halo rows for them.
SILENT_REDUCTIONS = frozenset({ReductionReason.ONE_PROCESS, ReductionReason.OPTION})
