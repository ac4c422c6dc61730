"""One command-line pattern for every command of the recipe (train.py, evaluate.py, warm_start.record,
warm_start.warm_up, modal_app.py): options as dataclasses parsed with TRL's TrlParser, from `--config FILE` (YAML)
and the command line, which overrides the file; and one way to fail. A mistake (an unknown key, with the nearest
known one; a wrong type; a value out of range; invalid YAML) is one line naming the key and the file, before any
model is loaded, and exit status 2; so is any other UsageError; an environment that stays unavailable, or a server
the command started that does not start, is one line and exit status 1.

A recipe file may hold the options of every command (browser_rl.options, TRL's GRPOConfig, SFTConfig, ModelConfig):
a command takes the keys of its own options and passes over the others, so that one file can describe a run from
recording demonstrations to evaluating its model.
"""

import dataclasses
import difflib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml
from trl import GRPOConfig, ModelConfig, SFTConfig, TrlParser

from browser_rl import command_options, options
from browser_rl.errors import ConfigError, EnvironmentUnavailable, UsageError
from browser_rl.metrics import setup_logging
from env_client import ServerDidNotStart

log = logging.getLogger("command_line")

# TRL's `env:` section of a config file sets environment variables.
ENVIRONMENT_KEY = "env"


def recipe_keys() -> set[str]:
    """Every key a recipe file may hold: the options of every command."""
    groups = [t for module in (options, command_options) for t in vars(module).values() if dataclasses.is_dataclass(t)]
    types = [GRPOConfig, SFTConfig, ModelConfig, *groups]
    return {f.name for t in types for f in dataclasses.fields(t)} | {ENVIRONMENT_KEY}


class Parser(TrlParser):
    """TrlParser whose mistakes are a ConfigError naming where they came from, not argparse's usage of several
    hundred options and an exit."""

    def __init__(self, types: Sequence[type], config_file: str | None):
        # --help: this line, then each option group under its heading, the recipe's before TRL's (browser_rl.options).
        super().__init__(
            types, usage="%(prog)s [--config FILE.yaml] [--OPTION VALUE ...]: the command line overrides the file"
        )
        self.config_file = config_file

    def error(self, message: str):
        file = f"{self.config_file} or " if self.config_file else ""
        raise ConfigError(f"{message} (in {file}the command line)")


def parse_command_line(
    types: Sequence[type], args: Sequence[str] | None = None, from_file: Sequence[type] | None = None
) -> tuple:
    """An instance of each of `types`, from `--config FILE` and the command line (sys.argv when args is None).
    `from_file`: the types whose keys the file may set (default: all of `types`); its other keys must be keys of a
    recipe file, and are passed over."""
    args = list(sys.argv[1:] if args is None else args)
    config_file = None
    if "--config" in args[:-1]:
        at = args.index("--config")
        config_file = args[at + 1]
        del args[at : at + 2]
    parser = Parser(types, config_file)
    if config_file:
        own = {f.name for t in (types if from_file is None else from_file) for f in dataclasses.fields(t)}
        parser.set_defaults_with_config(**{k: v for k, v in read_config(config_file, parser).items() if k in own})
    try:
        *parsed, unknown = parser.parse_args_into_dataclasses(args, return_remaining_strings=True)
    except ValueError as error:  # TRL's checks of values, and the project's own (options.py)
        parser.error(str(error))
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return tuple(parsed)


def read_config(config_file: str, parser: Parser) -> dict:
    """The file's keys, each one a recipe file may hold; its `env` section set in the environment, as TRL does."""
    try:
        config = yaml.safe_load(Path(config_file).read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {config_file}") from None
    except yaml.YAMLError as error:
        parser.error(f"not valid YAML: {' '.join(str(error).split())}")
    if not isinstance(config, dict):
        parser.error("a config file holds a mapping of keys to values")
    known = recipe_keys()
    for key in config:
        if key not in known:
            hint = "".join(f" (did you mean {m!r}?)" for m in difflib.get_close_matches(key, known, 1))
            parser.error(
                f"unknown key {key!r}{hint}; keys are TRL's GRPOConfig, SFTConfig and ModelConfig options and "
                "browser_rl/options.py's"
            )
    for name, value in (config.get(ENVIRONMENT_KEY) or {}).items():
        os.environ[name] = str(value)
    return config


def run_command(name: str, command: Callable[[], object]) -> None:
    """Runs a command's body with the recipe's logging, and exits as every command does: 2 with one line on a
    UsageError; 1 with one line once the environment is unavailable, or when a server the command started did not
    start."""
    setup_logging()
    try:
        command()
    except UsageError as error:
        kind = "configuration error: " if isinstance(error, ConfigError) else ""
        print(f"{name}: {kind}{error}", file=sys.stderr)
        sys.exit(2)
    except (EnvironmentUnavailable, ServerDidNotStart) as error:
        log.error("%s: stopping: %s", name, error)
        sys.exit(1)
