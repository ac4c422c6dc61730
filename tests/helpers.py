import ast
import importlib.metadata
import re
import sys
from pathlib import Path

from trl import ModelConfig

from train import EnvArguments, RecipeConfig, parse_args

ROOT = Path(__file__).resolve().parents[1]


def parse_config(config: str, *overrides: str) -> tuple[EnvArguments, RecipeConfig, ModelConfig]:
    """Parses a recipe YAML plus command-line overrides exactly as `python train.py` does."""
    env_args, training_args, model_args, _modal_args = parse_args(["--config", str(ROOT / config), *overrides])
    return env_args, training_args, model_args


def button_bid(page_text: str) -> str:
    """The bid of click-test's button on the (last) page in the text."""
    return re.findall(r"\[(\w+)\] button 'Click Me!'", page_text)[-1]


def click_the_button(page_text: str) -> str:
    """A scripted policy for click-test: read the button's bid off the page."""
    return f"click('{button_bid(page_text)}')"


def third_party_distributions(*files: str) -> dict[str, set[str]]:
    """For each third-party module the files import: the distributions that provide it (lower-cased)."""
    modules = set()
    for path in files:
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules.add(node.module.split(".")[0])
    providers = importlib.metadata.packages_distributions()
    return {
        m: {d.lower() for d in providers[m]}
        for m in modules
        if m not in sys.stdlib_module_names and not (ROOT / f"{m}.py").exists()
    }


def local_modules(*files: str) -> set[str]:
    """The project's own modules that the files import."""
    modules = set()
    for path in files:
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            modules |= {n.split(".")[0] for n in names if (ROOT / f"{n.split('.')[0]}.py").exists()}
    return modules
