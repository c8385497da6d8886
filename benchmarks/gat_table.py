"""Graph attention on the citation graphs: GAT, GCN and a Transformer (graph-blind, and masked to
the graph) on Cora and Citeseer over 10 seeds; and attnlab's GAT beside PyTorch Geometric's GATConv.

Part 1, accuracy (`attnlab train PRESET --seeds N` as a function): each model's preset, trained with
seeds 1337.. into a scratch folder by attnlab's trainer (Adam with L2, full batch, patience 100 on
validation accuracy and loss, GAT's rule; citeseer-gat: on accuracy alone, ties included, the
authors' Citeseer rule), its best checkpoint evaluated on the 1,000 test nodes.
Reported: test accuracy mean ± sample sd, epochs, wall seconds per run (training, the evaluation
of every epoch and the checkpoints).

Part 2, the peer (skipped when torch_geometric is not importable): the paper's two-layer GAT built
from PyG's `GATConv` (the model of PyG's examples/gat.py: 8 heads of 8 with ELU, 1 output head,
dropout 0.6 on each layer's input, one mask for all heads, and on the coefficients) and from
attnlab's `GAT` twice: with those same dropouts and no score bias (`per_head_dropout = false,
feature_dropout = 0, score_bias = false`: the same model, so the times compare implementations)
and as the preset (the reference code's dropouts, a mask per head and on W h as well, and its
score bias). All trained by one plain loop with the protocol of part 1 (the data set's GAT
preset's stopping rule), the same seeds and the same input (the row-normalised features, sparse CSR: both
layers take it; `--dense` adds the dense matrix too). Reported: test accuracy, the median time of
a training step (forward, backward, Adam) and of an evaluation forward pass, and the ratios to
PyG. The models alternate seed by seed, so that a change in the machine's load falls on all.

    python benchmarks/gat_table.py --data-dir ../shared/data/planetoid --seeds 10 --threads 1 \
        --out benchmarks/results/gat-table.json
"""

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from run_info import run_info
from torch import nn

from attnlab.config import load_preset_or_file
from attnlab.data.graphs import Graph, read_graph
from attnlab.models import GAT, GATConfig
from attnlab.nn import dropout
from attnlab.studies.seeds import mean_sd, train_seeds
from attnlab.train import resolve
from attnlab.train.config import TrainConfig, apply_overrides
from attnlab.train.selection import Selection

PAPER = {  # test accuracy, %: Veličković et al. 2018, Table 2 (GCN as reported there)
    ("gat", "cora"): "83.0 ± 0.7",
    ("gat", "citeseer"): "72.5 ± 0.7",
    ("gcn", "cora"): "81.5",
    ("gcn", "citeseer"): "70.3",
}
MODELS = {  # row name -> preset (its Cora version; Citeseer via data.dataset)
    "GAT": "cora-gat",
    "GCN": "cora-gcn",
    "Transformer, full attention": "cora-transformer",
    "Transformer, attention along edges": "cora-transformer-masked",
}
MAX_EPOCHS = 100_000


def accuracy_table(data_dir: Path, datasets: list[str], n_seeds: int, scratch: Path, models: list[str]) -> list[dict]:
    rows = []
    for model, preset in MODELS.items():
        if preset not in models:
            continue
        for dataset in datasets:
            name, doc = load_preset_or_file("citeseer-gat" if (preset, dataset) == ("cora-gat", "citeseer") else preset)
            config = resolve(apply_overrides(doc, {"data": {"data_dir": str(data_dir), "dataset": dataset}}))
            start = time.perf_counter()
            runs = train_seeds(config, scratch / f"{name}-{dataset}", n_seeds, split="test", progress=False)
            wall = time.perf_counter() - start
            acc = [100 * r.evaluation["accuracy"] for r in runs]
            epochs = [r.result.step for r in runs]
            row = {
                "model": model,
                "preset": name if name.startswith(dataset) else f"{name} --set data.dataset={dataset}",
                "dataset": dataset,
                "kind": config.model.kind,
                "seeds": [r.seed for r in runs],
                "test_accuracy": acc,
                "mean": mean_sd(acc)[0],
                "sd": mean_sd(acc)[1],
                "epochs": epochs,
                "train_sec": [r.result.elapsed_sec for r in runs],
                "wall_sec_per_run": wall / len(runs),
                "paper": PAPER.get((config.model.kind, dataset), ""),
            }
            rows.append(row)
            print(
                f"{model:36s} {dataset:9s} {row['mean']:.1f} ± {row['sd']:.1f}  "
                f"(epochs {statistics.median(epochs):.0f}, {row['wall_sec_per_run']:.0f} s/run)",
                flush=True,
            )
    return rows


# -- part 2: the same GAT from PyG's GATConv ---------------------------------------------------------
class PygGAT(nn.Module):
    """PyG's examples/gat.py model with the paper's Cora/Citeseer sizes."""

    def __init__(self, n_features: int, n_classes: int) -> None:
        super().__init__()
        from torch_geometric.nn import GATConv

        self.conv1 = GATConv(n_features, 8, heads=8, dropout=0.6)
        self.conv2 = GATConv(8 * 8, n_classes, heads=1, concat=False, dropout=0.6)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = dropout(x, 0.6, self.training)  # dropout of a sparse matrix's stored values, as attnlab's
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, 0.6, self.training)
        return self.conv2(x, edge_index)


def preset_training(dataset: str) -> TrainConfig:
    """The training settings of the data set's GAT preset, whose stopping rule the loop follows
    (Cora: val accuracy or loss, GAT's execute_cora.py; Citeseer: val accuracy alone, ties included)."""
    return resolve(load_preset_or_file(f"{dataset}-gat")[1]).train


def stopping_rule(tc: TrainConfig) -> Selection:
    """A fresh judge for one run, by `tc`'s patience and rule."""
    return Selection(("val_accuracy", "max"), tc.patience, tc.watch_loss, "nodes", tc.ties_count)


def fit(model: nn.Module, graph: Graph, x: torch.Tensor, selection: Selection) -> dict:
    """attnlab's recipe in a plain loop: Adam(lr 0.005, L2 5e-4 on all parameters), one full-batch
    step per epoch, evaluation after each, stopped and the weights kept by the preset's rule."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    edges, labels, splits = graph.edge_index, graph.labels, graph.splits
    best_state = None
    step_sec, eval_sec = [], []
    while len(step_sec) < MAX_EPOCHS and not selection.patience_spent():
        start = time.perf_counter()
        model.train()
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x, edges)[splits["train"]], labels[splits["train"]]).backward()
        optimizer.step()
        step_sec.append(time.perf_counter() - start)
        start = time.perf_counter()
        model.eval()
        with torch.no_grad():
            logits = model(x, edges)
        eval_sec.append(time.perf_counter() - start)
        val = splits["val"]
        acc = (logits[val].argmax(-1) == labels[val]).float().mean().item()
        loss = F.cross_entropy(logits[val], labels[val]).item()
        if selection.judge({"val_accuracy": acc, "val_loss": loss}):
            best_state = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    model.eval()
    with torch.no_grad():
        test = splits["test"]
        accuracy = (model(x, edges)[test].argmax(-1) == labels[test]).float().mean().item()
    return {
        "accuracy": 100 * accuracy,
        "epochs": len(step_sec),
        "step_ms": 1000 * statistics.median(step_sec),
        "eval_ms": 1000 * statistics.median(eval_sec),
    }


IMPLEMENTATIONS = {  # name -> model builder (n_features, n_classes)
    "attnlab, PyG's dropouts": lambda f, c: GAT(
        GATConfig(n_features=f, n_classes=c, per_head_dropout=False, feature_dropout=0.0, score_bias=False)
    ),
    "PyG GATConv": PygGAT,
    "attnlab, preset": lambda f, c: GAT(GATConfig(n_features=f, n_classes=c)),
}


def peer_table(data_dir: Path, datasets: list[str], n_seeds: int, dense: bool) -> list[dict]:
    rows = []
    for dataset in datasets:
        graph = read_graph(data_dir / dataset)
        tc = preset_training(dataset)
        inputs = {"sparse CSR": graph.features} | ({"dense": graph.features.to_dense()} if dense else {})
        for layout, x in inputs.items():
            results: dict[str, list[dict]] = {name: [] for name in IMPLEMENTATIONS}
            for seed in range(1337, 1337 + n_seeds):
                for name, build in IMPLEMENTATIONS.items():  # alternating: the machine's load falls on all
                    torch.manual_seed(seed)
                    model = build(graph.n_features, graph.n_classes)
                    results[name].append(fit(model, graph, x, stopping_rule(tc)))
            row = {"dataset": dataset, "input": layout}
            for name, runs in results.items():
                acc = [r["accuracy"] for r in runs]
                row[name] = {
                    "test_accuracy": acc,
                    "mean": mean_sd(acc)[0],
                    "sd": mean_sd(acc)[1],
                    "epochs": [r["epochs"] for r in runs],
                    "step_ms": statistics.median(r["step_ms"] for r in runs),
                    "eval_ms": statistics.median(r["eval_ms"] for r in runs),
                }
            pyg = row["PyG GATConv"]
            for name in IMPLEMENTATIONS:
                row[name]["step_ratio_pyg_over_this"] = pyg["step_ms"] / row[name]["step_ms"]
                row[name]["eval_ratio_pyg_over_this"] = pyg["eval_ms"] / row[name]["eval_ms"]
            rows.append(row)
            for name in IMPLEMENTATIONS:
                r = row[name]
                print(
                    f"{dataset:9s} {layout:10s} {name:26s} {r['mean']:.1f} ± {r['sd']:.1f}  step {r['step_ms']:.1f} ms "
                    f"eval {r['eval_ms']:.1f} ms  PyG/this {r['step_ratio_pyg_over_this']:.2f}",
                    flush=True,
                )
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, required=True, help="the Planetoid folder (holding cora/ and citeseer/)")
    p.add_argument("--datasets", nargs="+", default=["cora", "citeseer"])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (at most 2 on the shared machine)")
    p.add_argument("--parts", nargs="+", choices=["accuracy", "peer"], default=["accuracy", "peer"])
    p.add_argument("--models", nargs="+", choices=list(MODELS.values()), default=list(MODELS.values()))
    p.add_argument("--dense", action="store_true", help="part 2: also feed both models the dense feature matrix")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    report: dict = {"info": run_info(), "seeds": args.seeds, "command": " ".join(sys.argv)}
    if "accuracy" in args.parts:
        with tempfile.TemporaryDirectory() as scratch:
            report["accuracy"] = accuracy_table(args.data_dir, args.datasets, args.seeds, Path(scratch), args.models)
    if "peer" in args.parts:
        if importlib.util.find_spec("torch_geometric") is None:
            print("torch_geometric is not installed: no PyG comparison (pip install torch-geometric)")
        else:
            import torch_geometric

            report["torch_geometric"] = torch_geometric.__version__
            report["peer"] = peer_table(args.data_dir, args.datasets, args.seeds, args.dense)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
