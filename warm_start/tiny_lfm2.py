"""Builds a tiny, randomly initialised LFM2 and its tokenizer, for tests and the CPU smoke run.

    python -m warm_start.tiny_lfm2 --output .cache/tiny-lfm2

It has LFM2's architecture (convolution and attention layers with the real layer names), LFM2's chat
template and special-token ids, and a byte-level BPE vocabulary of 466 tokens (all its small corpus, the
action reference and a page, gives), so every code path of the recipe runs on it in seconds, vLLM's included.
It knows nothing: a stand-in for `LiquidAI/LFM2-350M` where the hub cannot be reached. Two layers (a
convolution, then attention), 64 wide by default, attention heads of 64 like the real model's. `miniwob_vocabulary`
(bench/copying.py) adds MiniWoB's words whole, and why not by default: docs/page-reading-experiments.md.
"""

import argparse
import re
from pathlib import Path

import miniwob
import torch
import trl
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Lfm2Config, Lfm2ForCausalLM, PreTrainedTokenizerFast

from web_env.actions import describe_actions

# LFM2's own special tokens, in the order that gives them LFM2's ids (pad 0, bos 1, <|im_end|> 7).
SPECIAL_TOKENS = [
    "<|pad|>",
    "<|startoftext|>",
    "<|endoftext|>",
    "<|fim_pre|>",
    "<|fim_mid|>",
    "<|fim_suf|>",
    "<|im_start|>",
    "<|im_end|>",
]
LFM2_CHAT_TEMPLATE = Path(trl.__file__).parent / "chat_templates" / "lfm2.jinja"
# LFM2-350M's own head size, and one vLLM's CPU attention kernels support (they refuse 16).
HEAD_SIZE = 64


def miniwob_words() -> list[str]:
    """The names and lorem-ipsum words MiniWoB writes its goals and pages from (its ui_utils.js), as written, in
    lower case and capitalised. A real tokenizer holds such words whole; with them the tiny one does too, so that
    copying a name or matching a label is one token's work, not five's."""
    source = (Path(miniwob.__file__).parent / "html" / "common" / "ui_utils.js").read_text()
    words = []
    for name in ("FIFTY_NAMES", "lorem_words"):
        listed = re.search(rf"ui_utils\.{name} = \[(.*?)\];", source, re.DOTALL).group(1)
        words += [word.rstrip(",") for word in re.findall(r"[\"']([^\"']+)[\"']", listed)]
    return sorted({form for word in words for form in (word, word.lower(), word.capitalize())})


def tokenizer_corpus(miniwob_vocabulary: bool) -> list[str]:
    page = "RootWebArea 'Click Test Task', focused\n\t[13] button 'Click Me!'\n\t\tStaticText 'Click Me!'"
    corpus = [describe_actions(), page, "Goal: Click the button.", "click('13')", "fill('5', 'hello')"]
    if miniwob_vocabulary:
        corpus += [f"[{bid}] '{bid}'" for bid in range(200)]  # element ids, one token each like the words
        corpus += [f"'{word}' \"{word}\" {word}" for word in miniwob_words()]
    return corpus * 10


def build_tokenizer(miniwob_vocabulary: bool = False, vocab_size: int = 4096) -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(tokenizer_corpus(miniwob_vocabulary), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|startoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        chat_template=LFM2_CHAT_TEMPLATE.read_text(),
    )


def build_model(
    tokenizer: PreTrainedTokenizerFast, hidden_size: int = 64, layers: int = 2, seed: int = 0
) -> Lfm2ForCausalLM:
    """`layers` alternate a convolution and attention, as LFM2's own do in the main."""
    torch.manual_seed(seed)
    heads = max(1, hidden_size // HEAD_SIZE)
    config = Lfm2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        block_auto_adjust_ff_dim=False,
        # vLLM reads the widths of LFM2's blocks and convolutions from these (the real config has both).
        block_dim=hidden_size,
        conv_dim=hidden_size,
        num_hidden_layers=layers,
        layer_types=["conv", "full_attention"] * (layers // 2),
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=32_768,  # LFM2-350M's own context: a book-flight episode holds some 10,000 tokens here
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return Lfm2ForCausalLM(config)


def build_tiny_lfm2(
    output_dir: str | Path, hidden_size: int = 64, layers: int = 2, miniwob_vocabulary: bool = False
) -> Path:
    output_dir = Path(output_dir)
    tokenizer = build_tokenizer(miniwob_vocabulary)
    build_model(tokenizer, hidden_size, layers).save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return output_dir


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default=".cache/tiny-lfm2")
    path = build_tiny_lfm2(parser.parse_args().output)
    print(f"tiny LFM2 written to {path}")
