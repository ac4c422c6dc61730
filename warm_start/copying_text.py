"""Synthetic text from which the tiny LFM2 can learn to copy, as reading a page takes, and the accuracy it is scored
by: three skills (repeat, quote, lookup), each example its tokens and which of them are supervised, in MiniWoB's words
and element ids only (`miniwob_vocabulary`). bench/copying.py trains on it; docs/learning.md says what it taught."""

import functools
import random
import string

import torch
from transformers import PreTrainedTokenizerFast

from warm_start.tiny_lfm2 import build_tokenizer, miniwob_words

ALPHANUMERIC = string.ascii_letters + string.digits
ROLES = ["button", "link", "textbox", "tab", "radio", "checkbox", "StaticText", "heading", "option"]

WORDS = miniwob_words()
Example = tuple[list[int], list[bool]]  # tokens, and which of them are supervised


@functools.cache
def tokenizer() -> PreTrainedTokenizerFast:
    """The tiny LFM2's tokenizer with MiniWoB's words whole, trained once, when first asked for."""
    return build_tokenizer(miniwob_vocabulary=True)


def encode(text: str) -> list[int]:
    return tokenizer().encode(text, add_special_tokens=False)


def join(parts: list[tuple[str, bool]]) -> Example:
    tokens, supervised = [tokenizer().bos_token_id], [False]
    for text, answer in parts:
        ids = encode(text)
        tokens += ids
        supervised += [answer] * len(ids)
    return tokens, supervised


def label(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.choice([1, 1, 1, 2, 3])))


def code(rng: random.Random) -> str:
    """Two to six random letters and digits, as MiniWoB's generateString writes a password."""
    return "".join(rng.choice(ALPHANUMERIC) for _ in range(rng.randint(2, 6)))


def repeat(rng: random.Random) -> Example:
    items = " " + " ".join(
        rng.choice(WORDS) if rng.random() < 0.8 else str(rng.randrange(200)) for _ in range(rng.randint(4, 24))
    )
    return join([(items, False), (" |", False), (items, True)])


def quote(rng: random.Random) -> Example:
    parts = []
    for _ in range(rng.randint(2, 6)):
        text = label(rng) if rng.random() < 2 / 3 else code(rng)
        parts += [(f'Say "{text}": \'', False), (text, True), ("'\n", False)]
    return join(parts)


def lookup(rng: random.Random) -> Example:
    n = rng.randint(3, 12)
    labels = list(dict.fromkeys(label(rng) for _ in range(3 * n)))[:n]
    ids = rng.sample(range(10, 200), len(labels))
    parts = [("".join(f"\t[{i}] {rng.choice(ROLES)} '{text}'\n" for i, text in zip(ids, labels)), False)]
    for k in rng.sample(range(len(labels)), rng.randint(2, len(labels))):
        parts += [(f'Click "{labels[k]}": click(\'', False), (str(ids[k]), True), ("')\n", False)]
    return join(parts)


SKILLS = {"repeat": repeat, "quote": quote, "lookup": lookup}


def batch(examples: list[Example]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded tokens, attention mask, and labels: the supervised tokens, -100 elsewhere."""
    length = max(len(tokens) for tokens, _ in examples)
    input_ids = torch.full((len(examples), length), tokenizer().pad_token_id)
    attention_mask = torch.zeros_like(input_ids)
    labels = torch.full_like(input_ids, -100)
    for row, (tokens, supervised) in enumerate(examples):
        input_ids[row, : len(tokens)] = torch.tensor(tokens)
        attention_mask[row, : len(tokens)] = 1
        labels[row, : len(tokens)] = torch.tensor([t if s else -100 for t, s in zip(tokens, supervised)])
    return input_ids, attention_mask, labels


def accuracy(model, examples: list[Example]) -> float:
    """The share of supervised tokens that are the model's most likely next token."""
    input_ids, attention_mask, labels = batch(examples)
    with torch.no_grad():
        predicted = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].argmax(-1)
    labels = labels[:, 1:]
    scored = labels != -100
    return (predicted[scored] == labels[scored]).float().mean().item()
