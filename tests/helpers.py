import ast
import importlib.metadata
import logging
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import torch
from safetensors.torch import load_file

import train
from browser_rl import episode_settings, generation, run_config
from browser_rl.command_line import parse_command_line
from browser_rl.episode_settings import DEFAULTS
from browser_rl.generation import Reply
from browser_rl.prompts import ChatTurns
from browser_rl.rollout import EpisodeRunner
from browser_rl.servers import ServerPool
from env_client import BrowserGymEnv, LocalEnvServer
from warm_start.plans import plan
from web_env.models import BrowserGymObservation

ROOT = Path(__file__).resolve().parents[1]


def run_agent(*arguments: str, answers: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "run_agent.py", *arguments],
        cwd=ROOT,
        input=answers,
        capture_output=True,
        text=True,
        timeout=300,
    )


def parse_config(config: str, *overrides: str) -> tuple:
    """Parses a recipe YAML plus command-line overrides exactly as `python train.py` does: train.OPTIONS, what
    train.main takes."""
    return parse_command_line(train.OPTIONS, ["--config", str(ROOT / config), *overrides])


# A small but real training run: 2 turns, 2 episodes per task instance, 4 per step.
FAST = ("--max_turns", "2", "--num_generations", "2", "--per_device_train_batch_size", "4")


# A run that learns and replays exactly, for the resume tests: 4 steps of two groups of four one-action episodes,
# in lock step, a checkpoint after every step. With a policy right about half the time nearly every group
# disagrees, so every step moves the weights.
RESUMABLE = (
    "--max_turns",
    "1",
    "--num_generations",
    "4",
    "--per_device_train_batch_size",
    "8",
    "--lockstep",
    "true",
    "--max_steps",
    "4",
    "--save_steps",
    "1",
)


# RESUMABLE with SFT phases (browser_rl/sft_phases.py): a phase of two steps after every two GRPO steps, over five
# steps. The half-right model solves about half its episodes, so the phase comes at steps 3 and 4 and a checkpoint falls
# inside it.
RESUMABLE_WITH_PHASES = (*RESUMABLE, "--max_steps", "5", "--sft_phase_steps", "2", "--sft_phase_every", "2")


def built_trainer(tokenizer, env_url: str, *overrides: str) -> tuple:
    """(trainer, runner) as train.main builds them for the smoke config and `overrides`, on the server at env_url,
    without training; the runner is the caller's to close."""
    tasks, episodes, _, phases, training_args, model_args = parse_config(
        "configs/smoke.yaml", "--env_url", env_url, *overrides
    )
    config = run_config.run_config(tasks, episodes, phases, training_args, model_args)
    settings = episode_settings.resolve(episodes, None, "the test").settings
    runner = EpisodeRunner(ServerPool([env_url]), tokenizer, settings, lockstep=episodes.lockstep)
    trainer = train.build_trainer(tasks, phases, training_args, model_args, tokenizer, runner, config)
    return trainer, runner


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / "model.safetensors")


def train_command(model: str, output_dir, *extra: str) -> list[str]:
    """`python train.py` on the smoke config with a given model and output directory, FAST."""
    return [
        sys.executable,
        str(ROOT / "train.py"),
        "--config",
        str(ROOT / "configs/smoke.yaml"),
        "--model_name_or_path",
        model,
        "--output_dir",
        str(output_dir),
        *FAST,
        *extra,
    ]


def train_here(model: str, output_dir, *extra: str, callbacks=(), new_server=LocalEnvServer) -> str:
    """train.main on train_command's arguments, with `callbacks` and the servers `new_server` makes, in this process
    (where the run's process is not what a test is about, it would add only its imports, about 16 s), bounded by
    `within` at 300 s; the log it wrote, one record a line."""
    args = parse_config(
        "configs/smoke.yaml", "--model_name_or_path", model, "--output_dir", str(output_dir), *FAST, *extra
    )
    lines = []
    collect = logging.Handler(logging.INFO)
    collect.emit = lambda record: lines.append(f"{record.name} {record.getMessage()}")
    root, level = logging.getLogger(), logging.getLogger().level
    root.addHandler(collect)
    root.setLevel(logging.INFO)
    try:
        within(300, lambda: train.main(*args, callbacks=list(callbacks), new_server=new_server))
    finally:
        root.removeHandler(collect)
        root.setLevel(level)
    return "\n".join(lines) + "\n"


def click_the_button(page: str) -> str:
    """click-test's right action, read off its page's accessibility tree."""
    (action,) = plan("click-test", "Click the button.", page).right
    return action


def first_prompt(env_server, tokenizer, task: str, seed: int) -> tuple[BrowserGymObservation, list[int]]:
    """A task instance's first observation, and the first prompt the policy reads of it."""
    with BrowserGymEnv(base_url=env_server.url).sync() as session:
        observation = session.reset(task_name=task, seed=seed).observation
    return observation, ChatTurns(tokenizer, DEFAULTS.max_page_chars).first_prompt(observation)


def third_party_distributions(*files: str) -> dict[str, set[str]]:
    """For each third-party module the files import: the distributions that provide it (lower-cased)."""
    providers = importlib.metadata.packages_distributions()
    return {
        m: {d.lower() for d in providers[m]}
        for m in imported_modules(*files)
        if m not in sys.stdlib_module_names and not is_local(m)
    }


def is_local(module: str) -> bool:
    """Whether a top-level module name is the project's own: a module or a package at the root."""
    return (ROOT / f"{module}.py").exists() or (ROOT / module / "__init__.py").exists()


def local_modules(*files: str) -> set[str]:
    """The project's own modules that the files import."""
    return {m for m in imported_modules(*files) if is_local(m)}


def imported_modules(*files: str) -> set[str]:
    """The top-level names of every module the files import (absolute imports; paths relative to the root)."""
    modules = set()
    for path in files:
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules.add(node.module.split(".")[0])
    return modules


def lines_of(process, stream, timeout_s: float):
    """The lines a child process writes to `stream`, as they come, until it closes; a child silent for `timeout_s` is
    killed and fails the test (AssertionError) rather than hanging it. A thread reads, so that the wait can end."""
    lines = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=timeout_s)
        except queue.Empty:
            process.kill()
            raise AssertionError(f"the process wrote nothing for {timeout_s:.0f}s") from None
        if line is None:
            return
        yield line


def within(timeout_s: float, run):
    """run(), in a thread, failing the test (AssertionError) if it has not returned after `timeout_s`, rather than
    hanging it: a run in the test's own process cannot be killed as a child is (lines_of). What it raises is raised
    here; what it returns, returned."""
    outcome = {}

    def target() -> None:
        try:
            outcome["returned"] = run()
        except BaseException as error:
            outcome["raised"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise AssertionError(f"still running after {timeout_s:.0f}s")
    if "raised" in outcome:
        raise outcome["raised"]
    return outcome["returned"]


def process_tree(root: int) -> set[int]:
    """A process and all its descendants (none if it is gone)."""
    try:
        parent = psutil.Process(root)
        return {root, *(child.pid for child in parent.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting for its parent."""
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
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


def segments(ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """Runs of equal mask value: [(mask value, token ids), ...]."""
    runs = []
    for token, bit in zip(ids, mask):
        if runs and runs[-1][0] == bit:
            runs[-1][1].append(token)
        else:
            runs.append((bit, [token]))
    return runs


def recorded_generation(monkeypatch, name: str) -> list[tuple[list[int], Reply]]:
    """Every (context, reply) that the trainer's generation `name` ("transformers_generate" or "vllm_generate",
    of browser_rl/generation.py) sampled from here on, whatever batches they came in."""
    sampled, original = [], getattr(generation, name)

    def make(trainer):
        generate = original(trainer)

        def recorded(contexts):
            replies = generate(contexts)
            sampled.extend(zip(contexts, replies))
            return replies

        return recorded

    monkeypatch.setattr(generation, name, make)
    return sampled


def policy_turns(out: dict, row: int) -> list[tuple[list[int], list[int]]]:
    """Each run of tokens that env_mask marks as the policy's in a row of the trainer's batch, with the context
    that precedes it: the row's prompt and its completion up to there."""
    prompt = out["prompt_ids"][row][out["prompt_mask"][row].bool()].tolist()
    length = int(out["completion_mask"][row].sum())
    ids, mask = out["completion_ids"][row, :length].tolist(), out["tool_mask"][row, :length].tolist()
    turns, position = [], 0
    for bit, tokens in segments(ids, mask):
        if bit == 1:
            turns.append((prompt + ids[:position], tokens))
        position += len(tokens)
    return turns


def make_lora_adapter_nonzero(trainer, std: float) -> None:
    """An adapter as after some updates: a fresh one (B = 0) changes nothing, and would hide a missing sync."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, std)


def recomputed_logprobs(trainer, out: dict) -> torch.Tensor:
    """The trainer's own per-token log-probabilities of a scored batch's completions, computed as its loss does."""
    input_ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
    attention_mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
    with torch.no_grad():
        return trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, attention_mask, out["completion_ids"].size(1)
        )[0]


def scored_episodes(trainer, runner, lora_std: float | None = None) -> dict:
    """Two episodes of the trainer's first dataset row, through its own path from rows to the tensors its loss
    consumes; with `lora_std`, from an adapter as after some updates. Closes `runner`."""
    try:
        if lora_std is not None:
            make_lora_adapter_nonzero(trainer, lora_std)
        trainer.model.train()
        return trainer._generate_and_score_completions([trainer.train_dataset[0]] * 2)
    finally:
        runner.close()


def side_by_side(tasks: list[str], play_in_order, sequences: int) -> dict:
    """`play_in_order` on every `sequences`-th task from each of the first `sequences`, in as many threads (its
    results by task, merged): each sequence plays its tasks in a fixed order, while the others wait on their pages."""
    with ThreadPoolExecutor(max_workers=sequences) as running:
        parts = running.map(play_in_order, [tasks[start::sequences] for start in range(sequences)])
        return {task: result for part in parts for task, result in part.items()}


# A page that keeps its renderer busy 100 ms a frame, as a busy machine keeps it, whatever the machine's load: each of
# the dozen round trips of BrowserGym's element calls waits for the renderer, and they run out of BrowserGym's 500 ms.
BUSY_FRAMES = """ms => {
  const started = window.busyFrameMs !== undefined;
  window.busyFrameMs = ms;
  if (started) return;
  const busy = () => {
    const end = performance.now() + window.busyFrameMs;
    while (performance.now() < end);
    requestAnimationFrame(busy);
  };
  requestAnimationFrame(busy);
}"""


def keep_renderer_busy(page, ms: int = 100) -> None:
    """Keep the renderer of `page`'s document busy `ms` of every frame from now on (0: idle again; a new document
    is not busy)."""
    page.evaluate(BUSY_FRAMES, ms)
