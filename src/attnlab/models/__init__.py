"""The model families. Each model file reads like its paper; shared blocks live in attnlab.nn."""

from attnlab.models.bert import Bert, BertConfig
from attnlab.models.bilstm import BiLSTM, BiLSTMConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.rnn import RNNConfig
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

__all__ = [
    "GPT",
    "Bert",
    "BertConfig",
    "BiLSTM",
    "BiLSTMConfig",
    "GPTConfig",
    "RNNConfig",
    "Seq2SeqConfig",
    "Seq2SeqTransformer",
]
