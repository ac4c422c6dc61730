"""What a model name given to a command points at, and what the command loads for it: one function, `resolve_model`,
for every command (train.py's model_name_or_path, evaluate.py's --model, the recorder's model and --sampled_by, the
warm-up's model). A name is a model directory or a checkpoint (transformers loads it), a LoRA adapter directory as
`train.py --use_peft` saves it (loaded over the base model it names), a Hugging Face Hub id (loading finds out
whether it exists), or a `.gguf` file (converted once into a checkpoint: browser_rl.gguf). A local path that names
nothing fails at once with what to do, before anything is loaded; the parsed options keep the name as given."""

from pathlib import Path

from browser_rl.errors import ConfigError
from browser_rl.gguf import as_checkpoint


def missing_model(name: str) -> str | None:
    """Why `name` names no model, where it is plainly a local path (it starts with '.', '/' or '~', or holds more
    than one '/') that does not exist; None for a directory, or for what may be a hub id (loading finds out)."""
    if Path(name).expanduser().exists() or not (name.startswith((".", "/", "~")) or name.count("/") > 1):
        return None
    return (
        f"model {name!r} does not exist. `make setup` builds the tiny test model (.cache/tiny-lfm2) and `make smoke` "
        "the smoke run's start (.cache/smoke-start); a run's output_dir holds the model it trained; or name a model "
        "on the Hugging Face Hub, such as LiquidAI/LFM2-350M"
    )


def resolve_model(name: str, option: str) -> str:
    """The directory or Hub id to load for the model `name` that `option` gave: the name itself, or for a `.gguf`
    file the checkpoint converted from it. A local path that does not exist is a ConfigError naming `option`."""
    if missing := missing_model(name):
        raise ConfigError(f"{option}: {missing}")
    return as_checkpoint(name)
