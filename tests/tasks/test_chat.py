"""task = "chat": the first step's loss is the mean, over the assistant's tokens of the batch's
conversations, of the next-token loss, written out here position by position on each unpadded
conversation; the run folder keeps its template and tokens for the loaders."""

import torch
import torch.nn.functional as F

from attnlab.data.chat_templates import read_template
from attnlab.data.conversations import ATTNLAB_TEMPLATE
from attnlab.models import GPTConfig
from attnlab.tasks.chat import Chat, ChatDataConfig

FIXTURE = "tests/fixtures/chat/conversations.jsonl"


def test_first_step_loss_is_the_loop_over_assistant_tokens(tmp_path, capsys):
    data = ChatDataConfig(path=FIXTURE, vocab_size=400, val_fraction=0.2)
    task = Chat(data, GPTConfig(block_size=96, n_layers=2, n_heads=2, d_model=32), tmp_path, batch_size=4)
    assert "skipped 1 conversations longer than 97 tokens" in capsys.readouterr().err
    torch.manual_seed(0)
    model = task.build_model().eval()
    gen = torch.Generator().manual_seed(3)
    picks = torch.randint(len(task.rows["train"]), (4,), generator=torch.Generator().manual_seed(3)).tolist()
    got = task.loss(model, task.train_batch(0, gen), torch.device("cpu"))
    losses = []
    with torch.no_grad():
        for r in (task.rows["train"][i] for i in picks):
            logits = model(torch.tensor([r.ids]))[0]  # (T, V), the conversation alone
            for t in range(1, len(r.ids)):
                if r.mask[t]:
                    losses.append(-F.log_softmax(logits[t - 1], -1)[r.ids[t]])
    assert len(losses) > 10
    torch.testing.assert_close(got, torch.stack(losses).mean(), rtol=1e-5, atol=1e-6)


def test_the_run_folder_keeps_its_template_and_tokens(tmp_path):
    data = ChatDataConfig(path=FIXTURE, vocab_size=400, val_fraction=0.2)
    task = Chat(data, GPTConfig(block_size=128, n_layers=1, n_heads=2, d_model=16), tmp_path)
    source, special = read_template(tmp_path)
    assert source == ATTNLAB_TEMPLATE and special["eos_token"] == "<|im_end|>"
    assert task.tokenizer.decode([task.tokenizer.eos_id]) == "<|im_end|>"
    assert task.tokenizer.encode("<|im_start|>user") == [
        task.tokenizer.tokenizer.token_to_id("<|im_start|>"),
        *task.tokenizer.encode("user"),
    ]
