"""The model families. Each model file reads like its paper; shared blocks live in attnlab.nn."""

from attnlab.models.bert import Bert, BertConfig
from attnlab.models.bilstm import BiLSTM, BiLSTMConfig
from attnlab.models.gat import GAT, GATConfig, GraphAttention
from attnlab.models.gcn import GCN, GCNConfig, GraphConvolution
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.node_transformer import NodeTransformer, NodeTransformerConfig
from attnlab.models.rnn import RNNConfig
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

__all__ = [
    "GAT",
    "GCN",
    "GPT",
    "Bert",
    "BertConfig",
    "BiLSTM",
    "BiLSTMConfig",
    "GATConfig",
    "GCNConfig",
    "GPTConfig",
    "GraphAttention",
    "GraphConvolution",
    "NodeTransformer",
    "NodeTransformerConfig",
    "RNNConfig",
    "Seq2SeqConfig",
    "Seq2SeqTransformer",
]
