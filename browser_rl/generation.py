"""Sampling a policy's replies: with transformers or the trainer's colocated vLLM engine, and loading a policy
(a model, a checkpoint or a LoRA adapter) to sample from.

Every way of generating here is a GenerateFn: token contexts in, one Reply per context out, each cut at its
first end-of-turn token with the log-probability of every sampled token. train.py, evaluate.py, the recorder and
the benchmarks take their generation from this module.
"""

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from peft import AutoPeftModelForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer, Cache, GenerationConfig
from trl.models import unwrap_model_for_generation

from browser_rl.errors import ModelUnavailable

if TYPE_CHECKING:
    # For the annotations only: TRL's trainer module imports vLLM wherever it is installed, about 4 s that evaluating,
    # recording and playing (which sample without a trainer) would pay at every start.
    from trl import GRPOTrainer


@dataclass
class Reply:
    """One sampled reply: its tokens up to and including the first end-of-turn token, their log-probabilities,
    and whether it ended with that token rather than being cut off by the length limit. A guide's reply (an expert
    playing an episode's first turns: browser_rl.guidance) is shown to the policy and never trained on."""

    ids: list[int]
    logprobs: list[float]
    ended: bool
    guided: bool = False


def reply_of_text(tokenizer, text: str) -> Reply:
    """`text` as a reply the policy wrote and ended: what a scripted policy or a demonstration replies."""
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    return Reply(ids, [0.0] * len(ids), ended=True)


# Token ids of the contexts to continue -> one sampled reply per context.
GenerateFn = Callable[[list[list[int]]], list[Reply]]


def until_end_of_turn(sampled: list[list[int]], logprobs: list[list[float]], eos_token_ids: list[int]) -> list[Reply]:
    """Each sample up to and including its first end-of-turn token. `eos_token_ids` are the ids generation
    stops on (TRL's `trainer.eos_token_ids`), so the same rule holds whichever engine sampled."""
    replies = []
    for ids, lps in zip(sampled, logprobs, strict=True):
        end = next((i + 1 for i, token in enumerate(ids) if token in eos_token_ids), None)
        replies.append(Reply(ids[:end], lps[:end], ended=end is not None))
    return replies


def sample_replies(
    model, contexts: list[list[int]], generation_config, pad_token_id: int, eos_token_ids: list[int], temperature: float
) -> list[Reply]:
    """One batched `generate` over left-padded contexts (sampled_replies)."""
    width = max(map(len, contexts))
    input_ids = torch.tensor([[pad_token_id] * (width - len(c)) + c for c in contexts], device=model.device)
    attention_mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts], device=model.device)
    generation_config = copy.deepcopy(generation_config)
    generation_config.update(output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config)
    return sampled_replies(out, width, eos_token_ids, temperature)


def sampled_replies(out, width: int, eos_token_ids: list[int], temperature: float) -> list[Reply]:
    """The replies of a `generate` output past the contexts' `width`, each sampled token with its log-probability
    under log_softmax(logits / temperature), the distribution the trainer scores (greedy decoding when temperature
    is 0: log-probs at temperature 1)."""
    sampled = out.sequences[:, width:]
    logits = torch.stack(out.logits, dim=1).float() / (temperature or 1.0)
    logprobs = logits.log_softmax(-1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    return until_end_of_turn(sampled.tolist(), logprobs.tolist(), eos_token_ids)


def load_policy(path: str):
    """(model, tokenizer) of a model directory, hub id or checkpoint, or of a LoRA adapter directory merged into
    the base model it names; on the GPU when there is one."""
    try:
        if (Path(path) / "adapter_config.json").exists():
            model = AutoPeftModelForCausalLM.from_pretrained(path, dtype="auto").merge_and_unload()
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype="auto")
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as error:  # neither a directory here nor a model the hub gave
        raise ModelUnavailable(f"{path!r}: {str(error).splitlines()[0]}") from None
    model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
    return model, tokenizer


def end_of_turn_ids(model, tokenizer) -> list[int]:
    """The ids that end a reply, by the rule training stops on (TRL's): the tokenizer's and the model's own."""
    declared = model.generation_config.eos_token_id
    declared = [] if declared is None else [declared] if isinstance(declared, int) else list(declared)
    return list(dict.fromkeys([tokenizer.eos_token_id, *declared]))


def policy_generation_config(tokenizer, eos_token_ids: list[int], temperature: float, max_new_tokens: int):
    """A loaded policy's sampling at `temperature` (0: greedy)."""
    # top_k=0 and top_p=1: sample from the whole distribution, as training does by default.
    sampling_options = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature else {}
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos_token_ids,
        **(sampling_options or {"do_sample": False}),
    )


def model_generate(model, tokenizer, temperature: float, max_new_tokens: int) -> GenerateFn:
    """Sampling from a loaded policy at `temperature` (0: greedy), the contexts in one batched `generate`."""
    eos_token_ids = end_of_turn_ids(model, tokenizer)
    config = policy_generation_config(tokenizer, eos_token_ids, temperature, max_new_tokens)
    return lambda contexts: sample_replies(model, contexts, config, tokenizer.pad_token_id, eos_token_ids, temperature)


class TurnCachedGeneration:
    """Sampling each context on its own, keeping the key/value cache of each from the last call, and prefilling once
    what the contexts of a call begin with alike.

    An episode's next context extends its last one (the reply and the next page appended), so its next turn
    prefills only the new tokens, where a batched `generate` prefills the whole stream again: on a 10-turn episode,
    about six times the tokens (docs/real_model.md). A context goes on from the cache whose tokens it begins with,
    and takes it. Contexts that no cache continues and that begin alike (every first prompt with the system prompt;
    a GRPO group's episodes, or repeated samples of one seed, with their whole first page) share a prefix cache,
    prefilled once and copied for each. The caches of episodes that ended stay until this object goes, so make one
    for a batch of episodes whose weights do not change meanwhile: an evaluation's batch, or a training step's
    rollout."""

    def __init__(self, generation_config: GenerationConfig, eos_token_ids: list[int], temperature: float):
        self.temperature = temperature
        self.eos_token_ids = eos_token_ids
        self.config = copy.deepcopy(generation_config)
        self.config.update(output_logits=True, return_dict_in_generate=True)
        self.caches: list[tuple[list[int], Cache]] = []  # the tokens each cache holds, and the cache
        self.prefixes: list[tuple[list[int], Cache]] = []  # shared prefixes' caches: copied, never taken

    def replies(self, model, contexts: list[list[int]]) -> list[Reply]:
        fresh = [context for context in contexts if self._episode_cache(context) is None]
        for prefix in shared_prefixes(fresh):
            self._prefill_prefix(model, prefix)
        return [self._continue(model, context) for context in contexts]

    def _continue(self, model, context: list[int]) -> Reply:
        input_ids = torch.tensor([context], device=model.device)
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                cache=self._cache_of(context),
                generation_config=self.config,
            )
        tokens = out.sequences[0].tolist()
        self.caches.append((tokens[: out.cache.get_seq_length()], out.cache))  # all but the last token sampled
        return sampled_replies(out, len(context), self.eos_token_ids, self.temperature)[0]

    def _prefill_prefix(self, model, prefix: list[int]) -> None:
        if any(tokens == prefix for tokens, _ in self.prefixes):
            return
        cache = self._prefix_cache(prefix)
        start = cache.get_seq_length() if cache is not None else 0
        with torch.no_grad():
            out = model(input_ids=torch.tensor([prefix[start:]], device=model.device), cache=cache, use_cache=True)
        self.prefixes.append((prefix, out.cache))

    def _episode_cache(self, context: list[int]) -> int | None:
        """The index of the episode's cache whose tokens `context` begins with (and goes beyond), if any."""
        return next((i for i, (tokens, _) in enumerate(self.caches) if extends(context, tokens)), None)

    def _prefix_cache(self, context: list[int]) -> Cache | None:
        """A copy of the longest shared prefix's cache that `context` begins with (and goes beyond), if any."""
        prefixes = [(tokens, cache) for tokens, cache in self.prefixes if extends(context, tokens)]
        return copy.deepcopy(max(prefixes, key=lambda p: len(p[0]))[1]) if prefixes else None

    def _cache_of(self, context: list[int]) -> Cache | None:
        """Takes the episode's own cache that `context` continues; else a copy of a shared prefix's; else None."""
        index = self._episode_cache(context)
        if index is not None:
            return self.caches.pop(index)[1]
        return self._prefix_cache(context)


def extends(context: list[int], tokens: list[int]) -> bool:
    return len(tokens) < len(context) and context[: len(tokens)] == tokens


def shared_prefixes(contexts: list[list[int]]) -> list[list[int]]:
    """What contexts prefill once, shortest first: the prefix they all share (the system prompt, for first prompts),
    and each context that comes more than once but for its last token, which its own generation prefills."""
    if len(contexts) < 2:
        return []
    shortest = min(contexts, key=len)
    common = next((i for i, token in enumerate(shortest) if any(c[i] != token for c in contexts)), len(shortest))
    common = min(common, len(shortest) - 1)
    prefixes = {tuple(contexts[0][:common])} | {tuple(c[:-1]) for c in contexts if contexts.count(c) > 1}
    return [list(prefix) for prefix in sorted(prefixes, key=len) if prefix]


def cached_generate(model, tokenizer, temperature: float, max_new_tokens: int) -> GenerateFn:
    """Sampling from a loaded policy at `temperature` (0: greedy), each episode going on from its cache of its
    last turn (TurnCachedGeneration): make one for a batch of episodes."""
    eos_token_ids = end_of_turn_ids(model, tokenizer)
    config = policy_generation_config(tokenizer, eos_token_ids, temperature, max_new_tokens)
    cached = TurnCachedGeneration(config, eos_token_ids, temperature)
    return lambda contexts: cached.replies(model, contexts)


def trainer_generate(trainer: "GRPOTrainer") -> GenerateFn:
    """The trainer's own sampling: its colocated vLLM engine, or the training model itself."""
    return vllm_generate(trainer) if trainer.use_vllm else transformers_generate(trainer)


def transformers_generate(trainer: "GRPOTrainer") -> GenerateFn:
    """Sampling with the training model at the trainer's generation settings, each episode going on from its cache
    of its last turn (TurnCachedGeneration): a rollout makes one, and the weights do not change during it."""
    cached = TurnCachedGeneration(trainer.generation_config, trainer.eos_token_ids, trainer.temperature)

    def generate(contexts: list[list[int]]) -> list[Reply]:
        with unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator, generation_kwargs=trainer.generation_kwargs
        ) as model:
            return cached.replies(model, contexts)

    return generate


def vllm_generate(trainer: "GRPOTrainer") -> GenerateFn:
    """Batched sampling with the colocated vLLM engine, whose weights the trainer syncs before each rollout."""

    def generate(contexts: list[list[int]]) -> list[Reply]:
        _, completion_ids, logprobs, _ = trainer.vllm_generation.generate(
            prompts=contexts, images=None, num_generations=1
        )
        sampled_logprobs = [[top[0] for top in token] for token in logprobs]  # the sampled token's comes first
        return until_end_of_turn(completion_ids, sampled_logprobs, trainer.eos_token_ids)

    return generate


def keep_vllm_cpu_weights_as_loaded() -> None:
    """vLLM's CPU build repacks each linear layer's weight into its kernels' layout once loaded, and drops the
    weight as loaded. TRL's colocated weight sync writes into the weights as loaded, so on a CPU it would have
    nowhere to write (and LFM2's convolution would read its repacked weight in the wrong shape). Kept as loaded
    and multiplied with torch's own linear, a CPU engine syncs exactly as a GPU one does."""
    from vllm.model_executor.layers import utils

    def as_loaded(layer, remove_weight: bool) -> None:
        layer.cpu_linear = torch.nn.functional.linear

    utils.dispatch_cpu_unquantized_gemm = as_loaded
