import re
from pathlib import Path

from trl import ModelConfig, TrlParser

from train import EnvArguments, RecipeConfig

ROOT = Path(__file__).resolve().parents[1]


def parse_config(config: str, *overrides: str) -> tuple[EnvArguments, RecipeConfig, ModelConfig]:
    """Parses a recipe YAML plus command-line overrides exactly as `python train.py` does."""
    parser = TrlParser((EnvArguments, RecipeConfig, ModelConfig))
    return parser.parse_args_and_config(args=["--config", str(ROOT / config), *overrides])


def click_the_button(page_text: str) -> str:
    """A scripted policy for click-test: read the button's bid off the page."""
    return "click('{}')".format(re.findall(r"\[(\w+)\] button 'Click Me!'", page_text)[-1])
