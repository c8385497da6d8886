"""The model families. Each model file reads like its paper; shared blocks live in attnlab.nn.

Every family is a `torch.nn.Module` built from one frozen config dataclass, which it keeps as
`.config` (what a run folder saves):

- text: `GPT` (and `PixelGPTConfig`, a GPT over pixels), `Seq2SeqTransformer`, `Bert` (and `Electra`,
  a BERT generator and discriminator pre-trained together), and the recurrent baselines
  `GRUSeq2Seq` and `AttentionGRUSeq2Seq` (`RNNConfig`) and `BiLSTM`;
- images: `ViT` and the `CNN` it is measured against, `PixelCNN` and `GatedPixelCNN`;
- audio: `WaveNet`, and `SpectrogramCNN`, the spoken-digit classifier that judges its samples;
- graphs: `GAT` (`GraphAttention` its layer), `GCN` (`GraphConvolution`), `NodeTransformer`.
"""

from attnlab.models.audio_cnn import SpectrogramCNN, SpectrogramCNNConfig
from attnlab.models.bert import Bert, BertConfig
from attnlab.models.bilstm import BiLSTM, BiLSTMConfig
from attnlab.models.electra import Electra, ElectraConfig
from attnlab.models.gat import GAT, GATConfig, GraphAttention
from attnlab.models.gated_pixelcnn import GatedPixelCNN, GatedPixelCNNConfig
from attnlab.models.gcn import GCN, GCNConfig, GraphConvolution
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.node_transformer import NodeTransformer, NodeTransformerConfig
from attnlab.models.pixelcnn import PixelCNN, PixelCNNConfig
from attnlab.models.pixels import PixelGPTConfig
from attnlab.models.rnn import AttentionGRUSeq2Seq, GRUSeq2Seq, RNNConfig
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.models.vit import CNN, CNNConfig, ViT, ViTConfig
from attnlab.models.wavenet import WaveNet, WaveNetConfig

__all__ = [
    "CNN",
    "GAT",
    "GCN",
    "GPT",
    "AttentionGRUSeq2Seq",
    "Bert",
    "BertConfig",
    "BiLSTM",
    "BiLSTMConfig",
    "CNNConfig",
    "Electra",
    "ElectraConfig",
    "GATConfig",
    "GCNConfig",
    "GPTConfig",
    "GRUSeq2Seq",
    "GatedPixelCNN",
    "GatedPixelCNNConfig",
    "GraphAttention",
    "GraphConvolution",
    "NodeTransformer",
    "NodeTransformerConfig",
    "PixelCNN",
    "PixelCNNConfig",
    "PixelGPTConfig",
    "RNNConfig",
    "Seq2SeqConfig",
    "Seq2SeqTransformer",
    "SpectrogramCNN",
    "SpectrogramCNNConfig",
    "ViT",
    "ViTConfig",
    "WaveNet",
    "WaveNetConfig",
]
