"""lm-evaluation-harness's `LM` over a loaded attnlab language model: the scoring and generation
that `attnlab.studies.harness` registers as the harness's model `attnlab` (which loads the path
it is given, a layer above).

The three methods of the harness's `LM` (EleutherAI's lm-evaluation-harness, docs/model_guide.md):
`loglikelihood` (`TemplateLM`'s: the context and continuation tokenized as its `hf` model does),
`loglikelihood_rolling` (the harness's disjoint rolling windows) and `generate_until` (attnlab's
continuous batching). Each scores its requests `batch_size` at a time.
"""

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text

from attnlab.data.tokenizers import BPETokenizer
from attnlab.errors import UserError
from attnlab.eval.language_model import LanguageModel, encode

MAX_GEN_TOKS = 256
"""New tokens a generation request may take when it does not say: the `hf` model's default."""

Request = tuple[tuple[str, str] | None, list[int], list[int]]
"""What `TemplateLM` hands `_loglikelihood_tokens`: (the strings or None, context ids, continuation ids)."""


def batch_size_of(value: int | str) -> int:
    """The harness's --batch_size: a number, or "auto" / "auto:N", which here is 16 (nothing is
    probed: a row costs what its tokens cost)."""
    text = str(value)
    if text.startswith("auto"):
        return 16
    if not text.isdigit() or int(text) < 1:
        raise UserError(f"batch_size must be a whole number >= 1 or 'auto', got {value!r}")
    return int(text)


def harness_device(device: str | None) -> torch.device:
    """The harness's --device, which defaults to "cuda:0" even where there is no GPU: like its `hf`
    model, a CUDA device on a machine without one means attnlab's choice ("auto")."""
    from attnlab.device import resolve_device

    if device is None or (str(device).startswith("cuda") and not torch.cuda.is_available()):
        return resolve_device("auto")
    return resolve_device(device)


class HarnessLM(TemplateLM):
    """A loaded attnlab language model (`attnlab.eval.language_model.LanguageModel`) as the harness's
    `LM`: what the registered model `attnlab` (`attnlab.studies.harness.AttnlabLM`) is once it has
    loaded its path.

    batch_size: the harness's --batch_size (a number or "auto"), capped by max_batch_size;
    max_length: the most tokens read at once (default the model's context); prefix_token_id: what an
    empty context conditions on (default the tokenizer's beginning-, else end-of-text token).
    """

    def __init__(
        self,
        lm: LanguageModel,
        batch_size: int | str = 1,
        max_batch_size: int | None = None,
        max_length: int | None = None,
        prefix_token_id: int | None = None,
    ) -> None:
        super().__init__()
        self.lm = lm
        self.batch_size = batch_size_of(batch_size)
        if max_batch_size is not None:
            self.batch_size = min(self.batch_size, int(max_batch_size))
        self._max_length = self._checked_max_length(max_length)
        self.custom_prefix_token_id = None if prefix_token_id is None else int(prefix_token_id)

    def _checked_max_length(self, max_length: int | None) -> int:
        if max_length is None:
            return self.lm.context
        if self.lm.max_context is not None and not 1 <= int(max_length) <= self.lm.max_context:
            raise UserError(f"max_length must be in [1, {self.lm.max_context}] for {self.lm.path}, got {max_length}")
        return int(max_length)

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def device(self) -> torch.device:
        return next(self.lm.model.parameters()).device

    @property
    def eot_token_id(self) -> int | None:
        return self.lm.tokenizer.eos_id

    def _prefix_token(self) -> int | None:
        """prefix_token_id as given, else the tokenizer's beginning-of-text token, else its end-of-text one."""
        for token in (self.custom_prefix_token_id, getattr(self.lm.tokenizer, "bos_id", None), self.eot_token_id):
            if token is not None:
                return int(token)
        return None

    @property
    def prefix_token_id(self) -> int:
        token = self._prefix_token()
        if token is None:
            raise UserError(
                f"{self.lm.path}'s tokenizer has no beginning- or end-of-text token for an empty context (or a "
                "rolling window's first token) to follow; pass one as prefix_token_id=ID in --model_args"
            )
        return token

    @property
    def tokenizer_name(self) -> str:
        return str(self.lm.path)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """As the `hf` model encodes: the tokenizer's own special tokens unless asked otherwise, and
        none when the text already starts with the prefix token's text."""
        prefix = self._prefix_token()
        if add_special_tokens is None and prefix is not None:
            prefix_text = self.lm.tokenizer.decode([prefix])
            if prefix_text and string.startswith(prefix_text):
                add_special_tokens = False
        return encode(self.lm.tokenizer, string, special=add_special_tokens)

    def tok_decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        if isinstance(self.lm.tokenizer, BPETokenizer):
            return self.lm.tokenizer.decode(tokens, skip_special=skip_special_tokens)
        return self.lm.tokenizer.decode(tokens)

    # -- scoring ---------------------------------------------------------------------------------

    def _loglikelihood_tokens(
        self, requests: list[Request], disable_tqdm: bool = False, **kwargs
    ) -> list[tuple[float, bool]]:
        """Per request: the continuation's summed log-probability and whether greedy decoding
        would give it. Longest first, `batch_size` at a time."""
        too_long = max((len(continuation) for _, _, continuation in requests), default=0)
        if too_long > self.max_length:
            raise UserError(f"a continuation of {too_long} tokens is longer than max_length {self.max_length}")
        order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][1]) + len(requests[i][2])))
        answers: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            for i, answer in zip(chunk, self._score_batch([requests[i] for i in chunk]), strict=True):
                answers[i] = answer
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], answer)
        return answers

    @torch.no_grad()
    def _score_batch(self, batch: list[Request]) -> list[tuple[float, bool]]:
        """One forward over the batch's context + continuation, right-padded: a causal model's
        positions never see what comes after them, padding included. Too long a pair loses tokens
        from the left, as the `hf` model's do."""
        inputs = [(context + continuation)[-(self.max_length + 1) :][:-1] for _, context, continuation in batch]
        x = torch.zeros(len(inputs), max(map(len, inputs)), dtype=torch.long, device=self.device)  # (B, T)
        for row, ids in enumerate(inputs):
            x[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        logits = self.lm.model(x)  # (B, T, V)
        answers = []
        for row, ((_, _, continuation), ids) in enumerate(zip(batch, inputs, strict=True)):
            # logits at position t predict token t + 1: the continuation's come from the last len(continuation) inputs.
            logp = F.log_softmax(logits[row, len(ids) - len(continuation) : len(ids)].float(), dim=-1)  # (n, V)
            target = torch.tensor(continuation, dtype=torch.long, device=self.device)
            total = logp.gather(-1, target[:, None]).sum().item()
            answers.append((total, bool((logp.argmax(-1) == target).all())))
        return answers

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The log-likelihood of each whole text: the harness's disjoint rolling windows of
        max_length tokens (the first conditioned on the prefix token), all texts' windows batched
        together."""
        windows: list[Request] = []
        owners: list[int] = []
        for i, (string,) in enumerate(request.args for request in requests):
            rolling = lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(string),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            for context, continuation in map(lm_utils.make_disjoint_window, rolling):
                windows.append((None, context, continuation))
                owners.append(i)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owners, self._loglikelihood_tokens(windows), strict=True):
            totals[i] += logprob
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    # -- generation ------------------------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Continue each context until one of its stop strings, the end-of-text token or its
        max_gen_toks; requests with the same generation settings decoded together."""
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(repr(sorted(request.args[1].items())), []).append(i)
        texts = [""] * len(requests)
        for indices in groups.values():
            settings = requests[indices[0]].args[1]
            for i, text in zip(indices, self._generate([requests[i].args[0] for i in indices], settings), strict=True):
                texts[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return texts

    def _generate(self, contexts: list[str], settings: dict) -> list[str]:
        """`contexts` continued under one request's generation settings (the harness's names:
        until, max_gen_toks, do_sample, temperature, top_k, top_p)."""
        from attnlab.decode import sampling_picker

        kwargs = normalize_gen_kwargs(settings, MAX_GEN_TOKS)
        eos = None if self.eot_token_id is None else self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
        max_new = int(kwargs.pop("max_gen_toks"))
        room = self.max_length - max_new  # the context keeps its last tokens, leaving room for the new ones
        if room < 1:
            raise UserError(f"max_gen_toks {max_new} leaves no room for a context in max_length {self.max_length}")
        pick = None  # greedy
        if kwargs.get("do_sample") and kwargs.get("temperature", 1.0) > 0:
            # Drawn from torch's generator, which the harness seeds (--seed).
            generator = torch.Generator(device=self.device).manual_seed(int(torch.randint(2**62, ()).item()))
            pick = sampling_picker(kwargs.get("temperature", 1.0), kwargs.get("top_k"), kwargs.get("top_p"), generator)
        prompts = [self.tok_encode(context)[-room:] or [self.prefix_token_id] for context in contexts]
        generated = self._decode_all(prompts, max_new, pick, [s for s in until if s])
        return [postprocess_generated_text(self.tok_decode(tokens), until, None) for tokens in generated]

    @torch.no_grad()
    def _decode_all(self, prompts: list[list[int]], max_new: int, pick, stops: list[str]) -> list[list[int]]:
        """The prompts decoded by continuous batching, `batch_size` rows at a time: a sequence
        leaves at the end-of-text token, at max_new tokens, or as soon as its text holds a stop string."""
        from attnlab.decode.batching import Batcher, Sequence

        batcher = Batcher(self.lm.model, max_batch=min(self.batch_size, len(prompts)))
        seqs = [Sequence(prompt, max_new, pick, self.eot_token_id) for prompt in prompts]
        waiting: Iterator[Sequence] = iter(seqs)
        while True:
            joining = [seq for _, seq in zip(range(batcher.scheduler.max_batch - len(batcher)), waiting, strict=False)]
            if joining:
                batcher.join_all(joining)
            for seq in [*batcher.scheduler.cached, *batcher.scheduler.windowed]:
                if any(stop in self.tok_decode(seq.tokens) for stop in stops):
                    batcher.leave(seq)
            if not len(batcher) and not joining:
                return [seq.tokens for seq in seqs]
            batcher.step()
