import ast
import importlib.metadata
import re
import sys
import time
from pathlib import Path

from trl import ModelConfig

from bench.env_throughput import process_tree
from train import EnvArguments, RecipeConfig, parse_args

ROOT = Path(__file__).resolve().parents[1]


def parse_config(config: str, *overrides: str) -> tuple[EnvArguments, RecipeConfig, ModelConfig]:
    """Parses a recipe YAML plus command-line overrides exactly as `python train.py` does."""
    env_args, training_args, model_args, _modal_args = parse_args(["--config", str(ROOT / config), *overrides])
    return env_args, training_args, model_args


# A small but real training run: 2 turns, 2 episodes per task instance, 4 per step.
FAST = ("--max_turns", "2", "--num_generations", "2", "--per_device_train_batch_size", "4")


def train_command(model: str, output_dir, *extra: str) -> list[str]:
    """`python train.py` on the smoke config with a given model and output directory, FAST."""
    return [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs/smoke.yaml"),
            "--model_name_or_path", model, "--output_dir", str(output_dir), *FAST, *extra]  # fmt: skip


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


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting for its parent."""
    try:
        return "Z" != (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0])
    except OSError:
        return False


def chromium_processes(server_pid: int) -> set[int]:
    """The live Chromium processes (browsers and their renderers) under an environment server."""
    found = set()
    for pid in process_tree(server_pid):
        try:
            if alive(pid) and b"chrom" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(pid)
        except OSError:
            pass
    return found


def wait_for(condition, timeout_s: float = 30.0) -> bool:
    """Polls until condition() is true; whether it became true in time."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True
