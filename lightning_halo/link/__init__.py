"""Link prediction on the full graph: the split, whole-graph negatives, rows of any node, metrics."""

from lightning_halo.link.gather import gather_rows
from lightning_halo.link.negatives import NegativeSampler, negative_sampling
from lightning_halo.link.split import LinkSplit, link_split

__all__ = ["LinkSplit", "NegativeSampler", "gather_rows", "link_split", "negative_sampling"]
