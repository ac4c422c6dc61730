"""What a training run was configured with, saved in each of its checkpoints, so that a rerun in the same output_dir
with another configuration (a learning rate, a task list, a model) is refused with the keys that differ rather than
silently going on with the old run's optimizer state and the new settings mixed. `--changed_config resume` goes on
from the checkpoint with the new settings; `--changed_config restart` moves the earlier run's files aside (into
OUTPUT_DIR/earlier-N) and starts afresh."""

import dataclasses
import json
from pathlib import Path

RUN_CONFIG_FILE = "run_config.json"
CHANGED_CONFIG = ("refuse", "resume", "restart")
# Options that say how a run is kept, logged, resumed or served, not what it learns: a resumed run may change them
# (a larger max_steps trains further). Servers' options are left out altogether (ServerArguments).
OPERATIONAL = {
    *("output_dir", "logging_dir", "run_name", "report_to", "logging_steps", "logging_first_step", "disable_tqdm"),
    *("save_steps", "save_total_limit", "save_strategy", "trace_every", "max_steps", "num_train_epochs"),
    *("resume_from_checkpoint", "changed_config", "local_rank", "lockstep", "log_level", "log_level_replica"),
    *("push_to_hub", "hub_model_id", "hub_strategy", "hub_token", "hub_private_repo"),
}


def run_config(*groups) -> dict:
    """The options of a run, one dict over its option groups, as JSON holds them (values it cannot hold, as text)."""
    values = {f.name: getattr(group, f.name) for group in groups for f in dataclasses.fields(group)}
    return json.loads(json.dumps({k: v for k, v in values.items() if k not in OPERATIONAL}, default=str))


def save(config: dict, checkpoint: str | Path) -> None:
    Path(checkpoint, RUN_CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def changes(checkpoint: str | Path, config: dict) -> list[str]:
    """Each option that `config` sets otherwise than the run that wrote `checkpoint`, as "key: before -> now"; none
    for a checkpoint that kept no configuration (written before it was kept)."""
    saved = Path(checkpoint, RUN_CONFIG_FILE)
    if not saved.exists():
        return []
    before = json.loads(saved.read_text())
    keys = sorted(k for k in before.keys() | config.keys() if k not in OPERATIONAL and before.get(k) != config.get(k))
    return [f"{key}: {before.get(key)!r} -> {config.get(key)!r}" for key in keys]


def set_aside(output_dir: str | Path) -> Path:
    """Moves what an earlier run wrote in output_dir (its checkpoints, metrics, traces, model) into a new
    OUTPUT_DIR/earlier-N, where it stays as it was."""
    earlier = [p for p in Path(output_dir).iterdir() if p.name.startswith("earlier-") and p.name[8:].isdigit()]
    aside = Path(output_dir, f"earlier-{max((int(p.name[8:]) for p in earlier), default=0) + 1}")
    aside.mkdir()
    for path in Path(output_dir).iterdir():
        if path != aside and path not in earlier:
            path.rename(aside / path.name)
    return aside
