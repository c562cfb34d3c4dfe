"""Ready node-classification and link-prediction models, so that a config file alone can train."""

from lightning_halo.models.hetero_classifier import HeteroNodeClassifier, RelationSum
from lightning_halo.models.link_predictor import HeteroLinkPredictor, LinkPredictor
from lightning_halo.models.node_classifier import GAT, GCN, GIN, GraphSAGE, NodeClassifier

__all__ = ["GAT", "GCN", "GIN", "GraphSAGE", "HeteroLinkPredictor", "HeteroNodeClassifier", "LinkPredictor", "NodeClassifier", "RelationSum"]
