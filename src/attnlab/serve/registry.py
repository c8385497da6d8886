"""The models a server holds: run folders loaded by name, and what each one can answer.

The run's task decides its endpoints (`ENDPOINTS`): a language model completes text, a translation
model translates, an encoder classifies or tags; every text model with attention shows it, every
BERT encoder embeds (`/v1/embeddings`), a Hugging Face encoder folder too. A request that names a
model with the wrong endpoint gets a 400 naming the endpoints it has.

Every path is read by `attnlab.train.load.load_any` (what `attnlab serve` does not take is refused
there, in `attnlab.sources.refusal`'s words). A Hugging Face causal-LM folder or a GGUF file is
served as a language-model run (`HFCausalLM`), whose prompts are as long as its context; with a
chat template (the GGUF file's own, else the folder's files) it also answers
`POST /v1/chat/completions`.
"""

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool

from attnlab.errors import UserError
from attnlab.names import API, TASKS
from attnlab.serve.errors import APIError

SENTENCE_EMBEDDING = "sentence-embedding"
"""A Hugging Face BERT folder's task, as the server holds it: no task of training, so not in the
table of tasks; it embeds and shows its attention."""
SERVED = {name: task for name, task in TASKS.items() if task.served_as is not None}
"""The tasks whose runs the server takes, read from the one table of tasks."""
ENDPOINTS = {name: task.endpoint for name, task in SERVED.items()} | {SENTENCE_EMBEDDING: None}
"""Each served task's endpoint of its own (`attnlab.names.API`); None: it embeds and shows attention."""
KINDS = {name: task.served_as for name, task in SERVED.items()} | {SENTENCE_EMBEDDING: "sentence encoder"}
"""What the server's messages call a model of each task."""
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def parse_model_spec(spec: str) -> tuple[str, Path]:
    """`NAME=PATH`, or a `PATH` named after its folder: "tiny=runs/demo" -> ("tiny", runs/demo),
    "runs/demo/" -> ("demo", runs/demo)."""
    name, sep, path = spec.partition("=")
    if sep and path and NAME.fullmatch(name):
        return name, Path(path)
    path = Path(spec)
    return path.resolve().name, path


def load_runs(specs: Sequence[str], *, device: str = "cpu", checkpoint: str = "best") -> dict[str, Any]:
    """Each `NAME=PATH` or `PATH` loaded by `attnlab.train.load.load_any`, by name; a `UserError`
    for a path serve does not take, a broken checkpoint, a run of a task the server has no endpoint
    for, or two models of one name."""
    from attnlab.train.load import load_any

    runs: dict[str, Any] = {}
    for spec in specs:
        name, path = parse_model_spec(spec)
        if name in runs:
            raise UserError(f"two models are named {name!r}; tell them apart with NAME=PATH")
        loaded = load_any(path, command="serve", device=device, checkpoint=checkpoint)
        if loaded.run is None or loaded.chat_template is not None:  # a chat run is served as a folder is
            run = _published(path, loaded)
        else:
            run = loaded.run
        if run.config.task not in ENDPOINTS:
            raise UserError(
                f"{path} is a {run.config.task!r} run; attnlab serve serves runs of the text tasks "
                f"({', '.join(ENDPOINTS)})"
            )
        runs[name] = run
    return runs


def _published(path: Path, loaded: Any) -> "BertFolder | HFCausalLM":
    """A Hugging Face folder or GGUF file (`attnlab.tasks.sources.Loaded`) dressed as a run."""
    from attnlab.families import ENCODER

    if loaded.kind == ENCODER:
        from attnlab.tasks.embeddings import SentenceEncoder, read_pooling

        return BertFolder(Path(path), SentenceEncoder(loaded.model, loaded.tokenizer, read_pooling(path)))
    return hf_causal_lm(Path(path), loaded)


@dataclass(frozen=True)
class FolderConfig:
    """What the server reads of a run's config, for a Hugging Face folder held in a run's place: its
    task and, for a causal LM, attnlab's config of the imported model."""

    task: str
    model: Any = None  # a GPTConfig for a causal LM


@dataclass
class BertFolder:
    """A Hugging Face BERT folder as the server holds it: the encoder and its sentence-transformers
    pooling (`attnlab.tasks.embeddings`), in the place of a run."""

    path: Path
    encoder: Any  # SentenceEncoder
    config: FolderConfig = FolderConfig(SENTENCE_EMBEDDING)

    @property
    def model(self):
        return self.encoder.model

    @property
    def tokenizer(self):
        return self.encoder.tokenizer


@dataclass
class HFCausalLM:
    """A Hugging Face causal-LM folder dressed as a language-model run (`attnlab.load`'s `Run`):
    the server decodes it like any other. context: the longest prompt, the model's positions.
    chat: the folder's chat template, or None."""

    path: Path
    config: FolderConfig
    tokenizer: Any  # BPETokenizer
    model: Any  # GPT, in eval mode
    context: int
    chat: Any = None  # ChatTemplate
    step: int = 0
    stored_weights: str | None = None
    """The fused step's format of the file's own weights (`attnlab.tasks.sources.Loaded`'s), its
    weights when the server is given none."""


def hf_causal_lm(path: Path, loaded: Any) -> HFCausalLM:
    """A loaded causal LM (`attnlab.tasks.sources.Loaded`) with its chat template: the one the
    checkpoint carries (a GGUF file's), else the one in the folder's files, else none."""
    from attnlab.serve.chat_template import carried_chat_template, read_chat_template

    model, tokenizer = loaded.model, loaded.tokenizer
    if loaded.chat_template is not None:
        chat = carried_chat_template(loaded.chat_template, tokenizer)
    else:
        chat = read_chat_template(path, tokenizer.decode) if path.is_dir() else None
    config = FolderConfig("language-model", model.config)
    return HFCausalLM(
        path, config, tokenizer, model, model.config.block_size, chat, stored_weights=loaded.stored_weights
    )


@dataclass
class ServedModel:
    """One loaded run (`attnlab.load`) and what the server keeps beside it.

    helper: the run's task object (`attnlab.tasks.open_task`) for translation, classification and
        tagging, which know how to apply the model to text; None for the others.
    worker: the decoding thread of a language model (continuous batching); None for the others.
    embedder: the `SentenceEncoder` of a BERT encoder (`/v1/embeddings`); None for the others.
    """

    name: str
    run: Any
    helper: Any = None
    worker: Any = None
    embedder: Any = None
    created: int = 0
    # Model calls other than decoding run one at a time per model, in a thread of the pool; the
    # count of those running or waiting is bounded like the worker's queue.
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0

    @property
    def task(self) -> str:
        return self.run.config.task

    @property
    def device(self):
        return next(self.run.model.parameters()).device

    @property
    def endpoints(self) -> list[str]:
        from attnlab.viz.maps import has_attention

        own = [ENDPOINTS[self.task]] if ENDPOINTS[self.task] else []
        own += [API.embeddings] if self.embedder is not None else []
        chat = [API.chat] if self.chat is not None else []
        return own + chat + ([API.attention] if has_attention(self.run.model) else [])

    @property
    def chat(self):
        """The chat template (`attnlab.serve.chat_template.ChatTemplate`) of a Hugging Face folder
        that has one; None for the others (attnlab's runs were never taught a chat format)."""
        return getattr(self.run, "chat", None)

    @property
    def context(self) -> int | None:
        """The longest prompt or text the model takes, in tokens."""
        if self.worker is not None:
            return self.worker.context
        if self.task == "translation":
            return self.helper.data_config.max_len
        if self.helper is not None:  # classification, tagging: [CLS] text [SEP]
            return self.helper.max_len - 2
        if self.embedder is not None:
            return self.embedder.max_tokens
        config = self.run.model.config
        return config.max_len - 2 if hasattr(config, "max_len") else None

    def require(self, endpoint: str) -> None:
        """A 400 naming the endpoints this model has, unless it has `endpoint`."""
        if endpoint not in self.endpoints:
            has = " and ".join(f"POST {e}" for e in self.endpoints) or "nothing"
            why = f"model {self.name!r} is a {KINDS[self.task]}: it answers {has}, not POST {endpoint}"
            if endpoint == API.embeddings:
                why += " (sentence vectors come from a BERT encoder: a Hugging Face BERT folder or an encoder run)"
            raise APIError(400, why, param="model")

    async def call(self, bound: int, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` in a thread of the pool, one call of this model at a time; a 429 when `bound`
        calls are already running or waiting."""
        if self.in_flight >= bound:
            raise APIError(429, f"model {self.name!r} is busy; try again shortly", headers={"Retry-After": "1"})
        self.in_flight += 1  # only ever changed on the event loop's thread
        try:
            return await run_in_threadpool(self._locked, fn, *args)
        finally:
            self.in_flight -= 1

    def _locked(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self.lock:
            return fn(*args)


def served_models(runs: dict[str, Any], *, worker_options: dict[str, Any]) -> dict[str, ServedModel]:
    """Each run with its task helper, or its decoding worker (not started) for a language model."""
    from attnlab.serve.embeddings import sentence_encoder
    from attnlab.tasks import open_task

    served = {}
    for name, run in runs.items():
        model = ServedModel(name, run, created=_created(run.path), embedder=sentence_encoder(run))
        if model.task == "language-model":
            from attnlab.serve.worker import ModelWorker

            options = dict(worker_options)
            if options.get("weights") is None:  # none asked for: a Q8_0 GGUF's own int8 blocks, else fp32
                from attnlab.tasks.sources import default_weights

                stored = run.stored_weights if isinstance(run, HFCausalLM) else None
                options["weights"] = default_weights(run.model, stored, fused=options.get("fused"))
            if isinstance(run, HFCausalLM):  # a published checkpoint's prompts are at most its context
                options["max_prompt_tokens"] = min(options.get("max_prompt_tokens", run.context), run.context)
            model.worker = ModelWorker(run.model, run.tokenizer, **options)
        elif ENDPOINTS[model.task] is not None:  # translation, classification, tagging
            model.helper = open_task(run)
        served[name] = model
    return served


def _created(path: Path) -> int:
    """When the run's weights were written (Unix time), for the `created` field of /v1/models."""
    weights = Path(path) / "model.safetensors"
    return int(weights.stat().st_mtime) if weights.exists() else 0
