"""Write a trained policy as one GGUF file, for llama.cpp, Ollama or LM Studio, and back into this recipe:

    python export_gguf.py --model outputs/real/grpo --output agent.gguf          # --outtype f32, f16 or q8_0
    ollama create agent -f agent.Modelfile

The file holds the model, its tokenizer and chat template, and the episode settings it was trained with, so that
`evaluate.py --model agent.gguf` plays it as it was trained. agent.Modelfile gives Ollama the system prompt those
settings call for (browser_rl/gguf_export.py; docs/guide.md says what else a player outside the recipe must do).
"""

import logging
from pathlib import Path

from browser_rl import episode_settings
from browser_rl.command_line import parse_command_line, run_command
from browser_rl.command_options import ExportArguments
from browser_rl.episode_settings import DEFAULTS
from browser_rl.generation import load_policy
from browser_rl.gguf_export import export
from browser_rl.model_source import resolve_model
from browser_rl.prompts import INSTRUCTIONS, SYSTEM_PROMPT

log = logging.getLogger("export_gguf")

# Ollama's default context is shorter than an episode of the recipe's defaults (the action reference and a page of
# 2,000 characters, three times).
MODELFILE = '''# ollama create NAME -f {modelfile}
FROM ./{gguf}
SYSTEM """{system}"""
PARAMETER temperature 0
PARAMETER num_ctx 8192
'''


def main() -> None:
    (args,) = parse_command_line((ExportArguments,))
    model_dir = resolve_model(args.model, "--model")
    settings = episode_settings.saved_with(model_dir)
    if settings is None:
        log.warning(
            "%s has no saved episode settings: the file carries the defaults (%s)", args.model, DEFAULTS.describe()
        )
    model, tokenizer = load_policy(model_dir)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    settings = settings or DEFAULTS
    export(model.cpu(), tokenizer, settings, output, args.outtype)
    modelfile = output.with_suffix(".Modelfile")
    system = SYSTEM_PROMPT if settings.action_reference else INSTRUCTIONS
    modelfile.write_text(MODELFILE.format(modelfile=modelfile.name, gguf=output.name, system=system))
    size = output.stat().st_size / 1e6
    log.info("wrote %s (%.1f MB, %s; %s) and %s", output, size, args.outtype, settings.describe(), modelfile)


if __name__ == "__main__":
    run_command("export_gguf.py", main)
