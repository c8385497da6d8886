"""Node classification on a citation graph (Cora, Citeseer): one label per node, the graph given.

Which model: GAT, GCN or a Transformer over the nodes (`model.kind`: "gat", "gcn",
"node-transformer"). Which data: a Planetoid-format data set folder (`attnlab.data.graphs`), the
`data.dataset` folder inside `data.data_dir`. Which loss: cross-entropy on the labelled training
nodes only (20 per class). Which metric: accuracy, on the 500 validation nodes to pick the best
checkpoint and stop early, on the 1,000 test nodes to report.

Transductive and full-batch, as in GCN and GAT: every step runs the model over the whole graph,
features of every node included, and only the training nodes' labels reach the loss. A training
"batch" is the index of the training nodes; one step is one epoch.

References: Kipf & Welling 2017 (§5.1); Veličković et al. 2018 (§3.3, the transductive setup).
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.data.graphs import Graph, read_graph
from attnlab.errors import ConfigError, UserError
from attnlab.models.gat import GAT, GATConfig
from attnlab.models.gcn import GCN, GCNConfig
from attnlab.models.node_transformer import NodeTransformer, NodeTransformerConfig
from attnlab.tasks.checks import check_splits, unknown_split

MODEL_KINDS: dict[str, type] = {"gat": GATConfig, "gcn": GCNConfig, "node-transformer": NodeTransformerConfig}
MODELS: dict[type, type[nn.Module]] = {GATConfig: GAT, GCNConfig: GCN, NodeTransformerConfig: NodeTransformer}
NodeModelConfig = GATConfig | GCNConfig | NodeTransformerConfig


@dataclass(frozen=True)
class NodesDataConfig:
    """Which graph."""

    path_fields: ClassVar[tuple[str, ...]] = ("data_dir",)
    """The fields that name files or folders: stored absolute (`attnlab.train.config.resolve`)."""

    data_dir: str = ""
    """Folder with one folder per data set, e.g. ../shared/data/planetoid (holding cora/ and citeseer/)."""
    dataset: str = "cora"
    """The data set: the name of its folder inside data_dir."""

    def __post_init__(self) -> None:
        if not self.dataset or "/" in self.dataset or "\\" in self.dataset or self.dataset in (".", ".."):
            raise ValueError(f"dataset must be the name of a folder inside data_dir, got {self.dataset!r}")


def dataset_folder(data: NodesDataConfig) -> Path:
    """`data_dir/dataset`, or a `UserError` that says what the folder holds instead."""
    if not data.data_dir:
        raise UserError(
            f"node classification needs its data: pass --data-dir DIR, a folder holding {data.dataset}/ "
            "(e.g. ../shared/data/planetoid)"
        )
    root = Path(data.data_dir).expanduser()
    if not root.is_dir():
        raise UserError(f"--data-dir {root} does not exist; give a folder holding {data.dataset}/")
    folder = root / data.dataset
    if folder.is_dir():
        return folder
    if (root / "edges.tsv").is_file():
        held = f"it holds the files of one data set itself ({root.name})"
    else:
        names = sorted(p.name for p in root.iterdir() if (p / "edges.tsv").is_file())
        held = f"it holds {', '.join(n + '/' for n in names)}" if names else "it holds no graph data set"
    raise UserError(
        f"{root} has no {data.dataset}/ folder: {held}; this run reads data set {data.dataset!r}, so pass the "
        f"folder that holds {data.dataset}/ (e.g. ../shared/data/planetoid), or another preset"
    )


def model_config_class(values: dict[str, Any]) -> type:
    kind = values.get("kind", "gat")
    if kind not in MODEL_KINDS:
        raise ConfigError(
            f"unknown model.kind {kind!r} for node classification; choose one of {', '.join(MODEL_KINDS)}"
        )
    return MODEL_KINDS[kind]


def build_model_from_config(config: NodeModelConfig) -> nn.Module:
    return MODELS[type(config)](config)


def fit_to_graph(model: NodeModelConfig, graph: Graph, folder: Path) -> NodeModelConfig:
    """The model config with the graph's feature and class counts: filled in where they are 0 (a
    new run), checked where a trained run fixed them."""
    wanted = {"n_features": graph.n_features, "n_classes": graph.n_classes}
    fixed = {k: getattr(model, k) for k in wanted if getattr(model, k) != 0}
    if any(fixed[k] != wanted[k] for k in fixed):
        raise UserError(
            f"{folder} has {graph.n_features} features and {graph.n_classes} classes per node, but this run's model "
            f"takes {model.n_features} and {model.n_classes}: the folder holds another data set than the run's"
        )
    return dataclasses.replace(model, **wanted)


class NodeClassification:
    """One label per node of one graph, learned from a few labelled nodes and the edges."""

    name = "node-classification"
    data_config_class = NodesDataConfig
    selection = ("val_accuracy", "max")
    split_names = ("train", "val", "test")
    report_split = "test"
    """The split `attnlab train --seeds` reports (the paper's numbers are test accuracies)."""
    uses_tokenizer = False

    @staticmethod
    def model_config_class(values: dict[str, Any]) -> type:
        return model_config_class(values)

    @staticmethod
    def build_model_from_config(config: NodeModelConfig) -> nn.Module:
        return build_model_from_config(config)

    def __init__(
        self,
        data: NodesDataConfig,
        model: NodeModelConfig,
        run_dir: Path,
        *,
        resume: bool = False,
        batch_size: int = 0,
        splits: Sequence[str] = ("train", "val"),
    ) -> None:
        """Read the graph (all of it, whatever `splits` asks for: the model needs every node's
        features and edges to classify any one of them)."""
        check_splits(splits, self.split_names)
        self.data_config = data
        self.run_dir = run_dir
        folder = dataset_folder(data)
        self.graph = read_graph(folder)
        self.model_config = fit_to_graph(model, self.graph, folder)
        self._device_copies: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def build_model(self) -> nn.Module:
        return build_model_from_config(self.model_config)

    def inputs(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Features `(N, F)` (sparse CSR), edges `(2, 2E)` and labels `(N,)` on `device`, copied once."""
        if device not in self._device_copies:
            g = self.graph
            self._device_copies[device] = (g.features.to(device), g.edge_index.to(device), g.labels.to(device))
        return self._device_copies[device]

    # -- training ------------------------------------------------------------------------------
    def train_batch(self, index: int, generator: torch.Generator) -> tuple[torch.Tensor]:
        """The labelled training nodes `(n,)`, the same at every step: full-batch training."""
        return (self.graph.splits["train"],)

    def batch_tokens(self, batch: tuple[torch.Tensor]) -> int:
        """Nodes the model runs over per step (the whole graph): the trainer's "tokens" per second."""
        return self.graph.n_nodes

    def loss(self, model: nn.Module, batch, device: torch.device, label_smoothing: float = 0.0) -> torch.Tensor:
        (nodes,) = batch
        x, edges, labels = self.inputs(device)
        nodes = nodes.to(device)
        logits = model(x, edges)  # (N, L): every node, the graph's whole
        return F.cross_entropy(logits[nodes].float(), labels[nodes], label_smoothing=label_smoothing)

    # -- evaluation ----------------------------------------------------------------------------
    @torch.no_grad()
    def logits(self, model: nn.Module, device: torch.device) -> torch.Tensor:
        """The model's class scores for every node `(N, L)` float32 on the CPU (dropout as the model's mode)."""
        x, edges, _ = self.inputs(device)
        return model(x, edges).float().cpu()

    @torch.no_grad()
    def split_metrics(self, logits: torch.Tensor, split: str) -> dict[str, float]:
        nodes = self.graph.splits[split]
        labels = self.graph.labels[nodes]
        return {
            "loss": F.cross_entropy(logits[nodes], labels).item(),
            "accuracy": (logits[nodes].argmax(-1) == labels).float().mean().item(),
        }

    def evaluate_during_training(self, model: nn.Module, device: torch.device, **_: Any) -> dict[str, float]:
        m = self.split_metrics(self.logits(model, device), "val")
        return {"val_loss": m["loss"], "val_accuracy": m["accuracy"]}

    def evaluate(self, model: nn.Module, device: torch.device, *, split: str = "test", **_: Any) -> dict[str, Any]:
        if split not in self.split_names:
            raise unknown_split(split, self.split_names)
        m = self.split_metrics(self.logits(model, device), split)
        return {"accuracy": m["accuracy"], f"{split}_loss": m["loss"], "examples": len(self.graph.splits[split])}
