"""lm-evaluation-harness's model `attnlab`: any language model attnlab reads (a `language-model`
run, a Hugging Face folder of a causal family of `attnlab.families`, or a GGUF file: what
`attnlab.studies.language_model.load_language_model` loads) evaluated on the harness's tasks.

    python -m attnlab.studies.harness --model attnlab --model_args pretrained=RUN_OR_FOLDER --tasks ...

lm-eval 0.4 finds models in its own registry and reads no plugin entry points, so `lm_eval
--model attnlab` alone cannot see this one: the command above is lm-eval's own command line (every
option as `lm_eval` takes it) with this module imported first, which registers `attnlab`. From
Python, `import attnlab.studies.harness` and then `lm_eval.simple_evaluate(model="attnlab", ...)`.

The three methods of the harness's `LM` (EleutherAI's lm-evaluation-harness, docs/model_guide.md):
`loglikelihood` (`TemplateLM`'s: the context and continuation tokenized as its `hf` model does),
`loglikelihood_rolling` (the harness's disjoint rolling windows) and `generate_until` (attnlab's
continuous batching). Each scores its requests `batch_size` at a time: `attnlab.eval.harness.HarnessLM`, the
evaluation. This module is the loading: it stays with the studies because it loads any source
through `attnlab.train` (the layer below), which the evaluation layer may not import.
"""

import lm_eval.models  # noqa: F401  the harness's own models first: it imports them only while its registry is empty
from lm_eval.api.registry import register_model

from attnlab.eval.harness import HarnessLM, harness_device
from attnlab.studies.language_model import load_language_model


@register_model("attnlab")
class AttnlabLM(HarnessLM):
    """An attnlab language model as the harness's `LM`, loaded from the path it is given.

    model_args: pretrained (a run folder or a Hugging Face causal-LM folder), checkpoint (a run's
    "best", "last" or a step), max_length (the most tokens read at once; default the model's
    context), prefix_token_id (what an empty context conditions on; default the tokenizer's
    beginning-, else end-of-text token), device, batch_size.
    """

    def __init__(
        self,
        pretrained: str,
        device: str | None = None,
        batch_size: int | str = 1,
        max_batch_size: int | None = None,
        checkpoint: str | int = "best",
        max_length: int | None = None,
        prefix_token_id: int | None = None,
    ) -> None:
        lm = load_language_model(pretrained, device=harness_device(device), checkpoint=checkpoint)
        super().__init__(lm, batch_size, max_batch_size, max_length, prefix_token_id)
