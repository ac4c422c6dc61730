"""A GGUF file as a policy. Wherever the recipe takes a model (train.py's model_name_or_path, evaluate.py's --model,
the recorder, the warm-up), a path ending in `.gguf` is converted once, through transformers' GGUF loader, into an
ordinary checkpoint directory, and that directory is the policy from then on.

Why a directory and not the loaded model: transformers keeps a model loaded from GGUF flagged as quantized, so it can
neither be saved nor trained, and vLLM, TRL and PEFT all start from a path. The weights are dequantized to float32 and
rebuilt into a plain model of the same architecture; the tokenizer and its chat template come from the file too, and
the episode settings where the file carries them (export_gguf.py writes them: browser_rl.gguf_export).
"""

import hashlib
import logging
import os
import shutil
from pathlib import Path

import torch
from gguf import GGUFReader
from transformers import AutoModelForCausalLM, AutoTokenizer

from browser_rl.episode_settings import DEFAULTS, EpisodeSettings
from browser_rl.errors import ModelUnavailable

log = logging.getLogger(__name__)
SETTINGS_KEY = "browser_rl.{}"  # each episode setting a GGUF file carries, e.g. browser_rl.max_page_chars


def is_gguf(path: str) -> bool:
    return str(path).lower().endswith(".gguf")


def converted_dir() -> Path:
    """Where converted GGUF files are kept: the user's cache, as the Hugging Face Hub keeps its downloads."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "browser-rl" / "gguf"


def as_checkpoint(path: str) -> str:
    """`path` itself, or for a `.gguf` file the checkpoint directory converted from it: made the first time, found
    by the file's content afterwards (a file changed in place is converted again)."""
    if not is_gguf(path):
        return path
    gguf = Path(path).expanduser()
    if not gguf.is_file():
        raise ModelUnavailable(f"{path!r}: no such GGUF file")
    checkpoint = converted_dir() / f"{gguf.stem}-{sha256(gguf)[:16]}"
    if not (checkpoint / "config.json").exists():
        log.info("converting %s into an ordinary checkpoint in %s (once)", gguf, checkpoint)
        convert(gguf, checkpoint)
    return str(checkpoint)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def convert(gguf: Path, output: Path) -> None:
    """Writes `gguf`'s model, dequantized to float32, and its tokenizer as a checkpoint directory `output`.
    Written beside it first and renamed into place, so that a conversion cut short leaves nothing half-written, and
    several ranks converting at once keep the first one done."""
    model, tokenizer = read_gguf(gguf)
    partial = output.with_name(f"{output.name}.partial-{os.getpid()}")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    if settings := settings_in(gguf):
        settings.save(partial)
    try:
        partial.rename(output)
    except OSError:  # another process finished first: its checkpoint is the same
        shutil.rmtree(partial)


def read_gguf(gguf: Path):
    """(model, tokenizer) of a GGUF file as transformers reads it, the model rebuilt without the quantization flag.
    A file transformers cannot read (not GGUF, an architecture or a quantization it does not know) is a
    ModelUnavailable saying so in one line."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as error:  # the file is the user's, not ours: whatever transformers raised, say it in one line
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelUnavailable(f"{str(gguf)!r}: transformers cannot load this GGUF file: {reason}") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):  # a file of float32 matrices only is not flagged
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return model, tokenizer


def settings_in(gguf: Path) -> EpisodeSettings | None:
    """The episode settings a GGUF file carries; None for a file that carries none (one made elsewhere)."""
    fields = GGUFReader(gguf).fields
    keys = {name: SETTINGS_KEY.format(name) for name in DEFAULTS.__dict__}
    values = {name: fields[key].contents() for name, key in keys.items() if key in fields}
    return EpisodeSettings(**values) if values else None
