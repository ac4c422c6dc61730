"""The model card a trained policy carries (README.md beside it, the page the Hub shows): what it was trained from and
on, its held-out success with intervals (each evaluate.py output directory beside it), the episode settings and prompt
version it plays with, and how to run it. train.py writes it with each save and push (in place of TRL's generic card),
the warm-up with its model, and evaluate.py again after evaluating a model directory that carries one: what it was
trained on is kept in the card's metadata, so that the card can be written again from the directory alone."""

import json
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from browser_rl.episode_settings import EpisodeSettings, saved_with

CARD_FILE = "README.md"
TRAINING_KEY = "browser_rl"  # the card metadata's entry that says how the policy was trained
TAGS = ["browser-rl", "web-agent", "browsergym", "reinforcement-learning"]


def write_model_card(
    directory: str | Path,
    settings: EpisodeSettings,
    base_model: str,
    method: str,
    tasks: list[str],
    hub_model_id: str | None = None,
) -> Path:
    """README.md in `directory`: `method` (GRPO, a warm-up) from `base_model` on `tasks`, with the evaluations found
    beside it; the snippets name the policy by `hub_model_id` where it is pushed, else by its directory."""
    training = {"method": method, "base_model": base_model, "tasks": tasks, "hub_model_id": hub_model_id}
    on_hub = not Path(base_model).expanduser().exists()  # a local path says nothing to the Hub's readers
    data = ModelCardData(
        base_model=base_model if on_hub else None, library_name="transformers", tags=TAGS, **{TRAINING_KEY: training}
    )
    name = hub_model_id or str(directory)
    body = "\n".join(
        [
            f"# {name}: a web agent trained with browser-rl",
            "",
            f"{method} from `{base_model}` on {', '.join(tasks)}: BrowserGym tasks in real Chromium, each action one",
            "call such as `click('12')` written after the page's accessibility tree, rewarded 1.0 only when the task",
            "ends truly solved.",
            "",
            "## Held-out success",
            "",
            *evaluations(Path(directory), name, tasks),
            "",
            "## Episode settings",
            "",
            f"It plays with {settings.describe()}. They are saved beside it (`episode_settings.json`) and every",
            "command of the recipe plays it with them; played otherwise (another prompt, a longer page), it fails.",
            "",
            "## Run it",
            "",
            "```bash",
            f"python run_agent.py --model {name} --task_name {tasks[0]} --dry_run   # each action shown first",
            f"python evaluate.py --model {name} --tasks {' '.join(tasks)} --episodes 50",
            f"python export_gguf.py --model {name} --output agent.gguf              # llama.cpp, Ollama",
            "```",
            "",
        ]
    )
    path = Path(directory, CARD_FILE)
    ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}").save(path)
    return path


def evaluations(directory: Path, name: str, tasks: list[str]) -> list[str]:
    """A table row for each evaluate.py summary beside the model, on held-out seeds; or the command that measures."""
    rows = []
    for summary_file in sorted(directory.glob("*/summary.json")):
        summary = json.loads(summary_file.read_text())
        arguments = summary.get("arguments", {})
        low, high = summary["ci95"]
        decoding = f"temperature {arguments['temperature']}" if arguments.get("temperature") else "greedy"
        rows.append(
            f"| {', '.join(summary['tasks'])} | {summary['episodes']} | {decoding} | "
            f"{100 * summary['success_rate']:.1f}% ({summary['solved']}/{summary['episodes']}, "
            f"{100 * low:.1f}-{100 * high:.1f}%) | `{summary_file.parent.name}` |"
        )
    if not rows:
        return [f"Not measured yet: `python evaluate.py --model {name} --tasks {' '.join(tasks)} --episodes 50`."]
    header = ["| tasks | episodes | decoding | success (95% CI) | evaluation |", "| --- | --- | --- | --- | --- |"]
    return header + rows


def rewrite_model_card(directory: str | Path) -> Path | None:
    """The card of a model directory written again, with the evaluations beside it now; None where the directory
    holds no card of this recipe (a base model's, or none)."""
    path = Path(directory, CARD_FILE)
    if not path.is_file():
        return None
    training = ModelCard.load(path).data.to_dict().get(TRAINING_KEY)
    settings = saved_with(str(directory))
    if not training or settings is None:
        return None
    return write_model_card(directory, settings, **training)
