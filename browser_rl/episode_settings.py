"""What the policy sees, from one source: the turns an episode has, the characters of each page it is shown, the wait
before each page is read, and the version of the prompt around them. A policy learns these; played otherwise, it fails
silently. So they have one default each (DEFAULTS), travel with every artefact they shaped (episode_settings.json
beside a saved model or checkpoint, a `settings` entry in each row of a demonstrations file), and a command that starts
from such an artefact takes them from it: a value set otherwise is refused with one line naming both, unless
`override_episode_settings` says it is on purpose, which the command then reports.
"""

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from huggingface_hub import hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
)

from browser_rl.errors import ConfigError
from browser_rl.options import EpisodeArguments
from browser_rl.prompts import PROMPT_VERSION

SETTINGS_FILE = "episode_settings.json"


@dataclass(frozen=True)
class EpisodeSettings:
    max_turns: int = 10
    max_page_chars: int = 2000
    settle_ms: int = 0
    action_reference: bool = True  # the system prompt's list of actions (browser_rl.prompts)
    prompt_version: int = PROMPT_VERSION

    def save(self, directory: str | Path) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / SETTINGS_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    def describe(self) -> str:
        return ", ".join(f"{name} {value}" for name, value in asdict(self).items())


DEFAULTS = EpisodeSettings()


def saved_with(model: str) -> EpisodeSettings | None:
    """The settings saved beside a model, checkpoint or adapter: a directory's file, or a Hub id's (downloaded, or
    from the local cache offline); None where none was saved (a base model), or where the Hub cannot say (loading
    the model then says why)."""
    path = Path(model) / SETTINGS_FILE
    if path.is_file():
        return EpisodeSettings(**json.loads(path.read_text()))
    if Path(model).expanduser().exists():
        return None
    try:
        path = Path(hf_hub_download(model, SETTINGS_FILE))
    except (HFValidationError, EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError):
        return None
    return EpisodeSettings(**json.loads(path.read_text()))


@dataclass(frozen=True)
class Resolved:
    """The settings a command plays with, and those it was told to play with otherwise than `made_with` says
    (each 'name value, not the N it was made with'): empty unless overridden on purpose."""

    settings: EpisodeSettings
    overridden: tuple[str, ...] = ()


def resolve(given: EpisodeArguments, made_with: EpisodeSettings | None, artefact: str) -> Resolved:
    """The settings to play with: each one `given` sets, else the one `artefact` was made with, else the default. A
    given value unlike the artefact's, or an artefact made with another prompt than this code's, is a ConfigError
    naming both, unless given.override_episode_settings."""
    base = made_with or DEFAULTS
    names = ("max_turns", "max_page_chars", "settle_ms", "action_reference")
    chosen = {name: value for name in names if (value := getattr(given, name)) is not None}
    settings = replace(base, prompt_version=PROMPT_VERSION, **chosen)
    if made_with is None:
        return Resolved(settings)
    differing = [
        f"{f.name} {getattr(settings, f.name)}, not the {getattr(made_with, f.name)} it was made with"
        for f in fields(EpisodeSettings)
        if getattr(settings, f.name) != getattr(made_with, f.name)
    ]
    if differing and not given.override_episode_settings:
        raise ConfigError(
            f"{artefact} was made with {made_with.describe()}; asked to play with {'; '.join(differing)}. Leave them "
            "unset to play as it was made, or set override_episode_settings to play otherwise on purpose"
        )
    return Resolved(settings, tuple(differing))
