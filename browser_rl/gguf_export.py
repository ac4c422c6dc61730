"""A trained policy written as one GGUF file, for llama.cpp, Ollama and LM Studio (export_gguf.py), and read back by
this recipe as any `.gguf` policy is (browser_rl.gguf). Tensor and key names come from the `gguf` package's own maps
(the ones llama.cpp and transformers' GGUF loader use); the vocabulary from its BPE reader. The file carries the
policy's episode settings as `browser_rl.*` keys, so that it plays as it was trained wherever this recipe reads it.
Llama-architecture models (the real model, SmolLM2) and LFM2 are covered; others are refused by name.
"""

import json
import logging
import tempfile
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, GGMLQuantizationType, GGUFWriter, LlamaFileType

from browser_rl.episode_settings import EpisodeSettings
from browser_rl.errors import ModelUnavailable
from browser_rl.gguf import SETTINGS_KEY

log = logging.getLogger(__name__)
ARCHITECTURES = {"llama": MODEL_ARCH.LLAMA, "lfm2": MODEL_ARCH.LFM2}
# --outtype: how the file stores each matrix (vectors, and matrices whose rows do not split into Q8_0's blocks of
# 32, stay float32, as llama.cpp's own converter keeps them).
OUTTYPES = {
    "f32": (LlamaFileType.ALL_F32, GGMLQuantizationType.F32),
    "f16": (LlamaFileType.MOSTLY_F16, GGMLQuantizationType.F16),
    "q8_0": (LlamaFileType.MOSTLY_Q8_0, GGMLQuantizationType.Q8_0),
}


def export(model, tokenizer, settings: EpisodeSettings, output: Path, outtype: str) -> None:
    """Writes `model` (a loaded causal LM, on the CPU) with `tokenizer`, its chat template and `settings` as the
    GGUF file `output`."""
    arch = ARCHITECTURES.get(model.config.model_type)
    if arch is None:
        raise ModelUnavailable(
            f"the GGUF export writes {' and '.join(ARCHITECTURES)} models; this one is {model.config.model_type!r}"
        )
    file_type, tensor_type = OUTTYPES[outtype]
    writer = GGUFWriter(output, MODEL_ARCH_NAMES[arch])
    writer.add_name(Path(model.config.name_or_path).name or "policy")
    writer.add_file_type(file_type)
    add_hyperparameters(writer, model, arch)
    add_vocabulary(writer, tokenizer)
    for name, value in settings.__dict__.items():
        writer.add_key_value(SETTINGS_KEY.format(name), value, gguf_value_type(value))
    for name, tensor in gguf_tensors(model, arch):
        writer.add_tensor(name, *stored(tensor, tensor_type))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def add_hyperparameters(writer: GGUFWriter, model, arch: MODEL_ARCH) -> None:
    """The keys transformers' GGUF loader and llama.cpp build the model from."""
    config = model.config
    writer.add_vocab_size(config.vocab_size)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(config.num_attention_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    if arch == MODEL_ARCH.LLAMA:
        writer.add_feed_forward_length(config.intermediate_size)
        writer.add_head_count_kv(config.num_key_value_heads)
        writer.add_rope_dimension_count(config.head_dim)
        writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    else:  # LFM2: convolution layers have no attention heads, and the feed-forward width is the one built
        writer.add_feed_forward_length(model.model.layers[0].feed_forward.w1.out_features)
        heads = [config.num_key_value_heads if kind == "full_attention" else 0 for kind in config.layer_types]
        writer.add_head_count_kv(heads)
        writer.add_layer_norm_rms_eps(config.norm_eps)
        writer.add_shortconv_l_cache(config.conv_L_cache)


# How text is split before BPE merges, as llama.cpp names it (tokenizer.ggml.pre): GPT-2's byte-level rule, the one
# the real model's tokenizer has. Another rule is written as llama.cpp's default, with a warning.
GPT2_SPLIT = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def add_vocabulary(writer: GGUFWriter, tokenizer) -> None:
    """The byte-level BPE vocabulary, merges, special tokens and chat template, read by the `gguf` package from the
    tokenizer's own files. Tokens the tokenizer treats as special are CONTROL tokens, so llama.cpp parses
    `<|im_end|>` in a prompt as the one token it is."""
    with tempfile.TemporaryDirectory() as files:
        tokenizer.save_pretrained(files)
        try:
            vocab = gguf.vocab.BpeVocab(Path(files))
        except FileNotFoundError as error:
            raise ModelUnavailable(f"the GGUF export writes byte-level BPE vocabularies: {error}") from None
        special = gguf.vocab.SpecialVocab(files, load_merges=True, n_vocab=vocab.vocab_size)
        split = json.loads(Path(files, "tokenizer.json").read_text())["pre_tokenizer"]
    if split == GPT2_SPLIT:
        writer.add_tokenizer_pre("gpt-2")
    else:
        log.warning("llama.cpp will split text by its default rule, not this tokenizer's %s", split)
    control = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
    tokens = [text for text, _, _ in vocab.all_tokens()]
    writer.add_tokenizer_model(vocab.tokenizer_model)
    writer.add_token_list(tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if i in control else kind for i, (_, _, kind) in enumerate(vocab.all_tokens())]
    )
    special.add_to_gguf(writer, quiet=True)


def gguf_tensors(model, arch: MODEL_ARCH):
    """(GGUF name, float32 array) of every weight, named by the `gguf` package's map for the architecture; a tied
    output layer is left to the embedding, as llama.cpp reads it."""
    names = gguf.get_tensor_name_map(arch, model.config.num_hidden_layers)
    config = model.config
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ModelUnavailable(f"the gguf package has no name for {hf_name!r} in {MODEL_ARCH_NAMES[arch]} models")
        array = tensor.detach().to(torch.float32).numpy()
        if arch == MODEL_ARCH.LLAMA and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_attention_heads if "attn_q" in name else config.num_key_value_heads
            array = rotary_halves_interleaved(array, heads)
        if arch == MODEL_ARCH.LFM2 and name.endswith("shortconv.conv.weight"):
            array = array.squeeze(1)  # (channels, 1, L) as PyTorch's grouped convolution holds it: (channels, L)
        yield name, array


def rotary_halves_interleaved(weights: np.ndarray, heads: int) -> np.ndarray:
    """A query or key projection with each head's rows in llama.cpp's rotary order: transformers rotates the two
    halves of a head's dimensions, llama.cpp pairs of neighbours. The inverse of what transformers' loader undoes."""
    rows = weights.shape[0] // heads // 2
    return weights.reshape(heads, 2, rows, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def stored(array: np.ndarray, tensor_type: GGMLQuantizationType) -> tuple[np.ndarray, ...]:
    """(data, raw_shape, raw_dtype) for GGUFWriter.add_tensor: `array` in `tensor_type` where it applies."""
    if array.ndim == 1 or tensor_type == GGMLQuantizationType.F32:
        return (array,)
    if tensor_type == GGMLQuantizationType.F16:
        return (array.astype(np.float16),)
    if array.shape[-1] % gguf.GGML_QUANT_SIZES[tensor_type][0]:
        return (array,)
    return gguf.quants.quantize(array, tensor_type), None, tensor_type


def gguf_value_type(value) -> gguf.GGUFValueType:
    return gguf.GGUFValueType.BOOL if isinstance(value, bool) else gguf.GGUFValueType.INT32
