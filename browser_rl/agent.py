"""A trained policy as one object, loaded from any name a command takes and played as it was trained.

A name is what browser_rl.model_source resolves (a model directory, a checkpoint, a LoRA adapter, a Hub id, a `.gguf`
file), or the URL of an OpenAI-compatible server (`vllm serve`, llama.cpp's `llama-server`) that serves such a model.
Either way the agent holds the tokenizer that renders its prompts, the episode settings it was trained with (saved
beside it) and a way to continue token contexts; browser_rl.episode turns its replies into actions. evaluate.py and
run_agent.py load their policy here.
"""

from collections.abc import Callable
from dataclasses import dataclass

import openai
from transformers import AutoTokenizer

from browser_rl.episode_settings import EpisodeSettings, saved_with
from browser_rl.errors import ConfigError, ModelUnavailable
from browser_rl.generation import GenerateFn, Reply, cached_generate, load_policy
from browser_rl.model_source import resolve_model
from browser_rl.rollout import Policy, model_policy

ENDPOINT_SCHEMES = ("http://", "https://")
# How long a reply from a served model may take; a server that does not answer at all fails at once.
ENDPOINT_TIMEOUT_S = 300.0


@dataclass
class Agent:
    """A policy ready to play: `source` is where its tokenizer and settings were read (a local directory, or the
    Hub id a served model names); `made_with` its saved episode settings, None for a model saved without them."""

    name: str
    source: str
    tokenizer: object
    made_with: EpisodeSettings | None
    max_context_tokens: int | None  # the longest context that leaves room for a reply; None: the server says
    new_generate: Callable[[], GenerateFn]  # a fresh generation for each batch of episodes (it keeps their caches)

    def policy(self) -> Policy:
        """The policy for one batch of episodes."""
        return model_policy(self.new_generate())


def is_endpoint(name: str) -> bool:
    return name.startswith(ENDPOINT_SCHEMES)


def load_agent(name: str, option: str, temperature: float, max_new_tokens: int, tokenizer: str | None = None) -> Agent:
    """The agent `name` names (`option` is the option that named it, for errors), sampling at `temperature` (0:
    greedy) at most `max_new_tokens` a reply. `tokenizer` names a served model's directory or Hub id where the server
    names it otherwise (Ollama's tags)."""
    if is_endpoint(name):
        return served_agent(name, temperature, max_new_tokens, tokenizer)
    source = resolve_model(name, option)
    model, model_tokenizer = load_policy(source)
    return Agent(
        name,
        source,
        model_tokenizer,
        saved_with(source),
        model.config.max_position_embeddings - max_new_tokens,
        lambda: cached_generate(model, model_tokenizer, temperature, max_new_tokens),
    )


def served_agent(url: str, temperature: float, max_new_tokens: int, tokenizer: str | None) -> Agent:
    """The model an OpenAI-compatible server at `url` serves (its first), with the tokenizer and settings of the
    model it names, or of `tokenizer`."""
    client = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="none", timeout=ENDPOINT_TIMEOUT_S, max_retries=0)
    try:
        served = client.models.list().data[0]
    except (openai.APIError, IndexError) as error:
        raise ModelUnavailable(f"{url}: no OpenAI-compatible server serving a model there ({error})") from None
    try:
        # A .gguf file (llama-server names the one it serves) holds the tokenizer and the settings too.
        source = resolve_model(tokenizer or served.id, "--tokenizer")
        served_tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ConfigError, ModelUnavailable):
        raise ModelUnavailable(
            f"{url} serves {served.id!r}, which names no tokenizer here: give the model's directory, Hub id or "
            ".gguf file as --tokenizer"
        ) from None
    max_model_len = getattr(served, "max_model_len", None)  # vLLM says it; others do not
    return Agent(
        url,
        source,
        served_tokenizer,
        saved_with(source),
        max_model_len - max_new_tokens if max_model_len else None,
        lambda: served_generate(client, served.id, served_tokenizer, temperature, max_new_tokens),
    )


def served_generate(client: openai.OpenAI, model: str, tokenizer, temperature: float, max_new_tokens: int):
    """Continuing token contexts on the server, all of a batch in one completions request. The contexts go as token
    ids, so the server sees exactly the tokens the recipe renders; each reply comes back as text and is tokenized
    again, ended by the end-of-turn token where the server stopped on it."""

    def generate(contexts: list[list[int]]) -> list[Reply]:
        try:
            completion = client.completions.create(
                model=model, prompt=contexts, max_tokens=max_new_tokens, temperature=temperature
            )
        except openai.APIError as error:
            raise ModelUnavailable(f"{client.base_url}: {error}") from None
        replies = []
        for choice in sorted(completion.choices, key=lambda c: c.index):
            ended = choice.finish_reason == "stop"
            ids = tokenizer.encode(choice.text, add_special_tokens=False) + [tokenizer.eos_token_id] * ended
            replies.append(Reply(ids, [0.0] * len(ids), ended))
        return replies

    return generate
