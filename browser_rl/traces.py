"""What the agent did, step by step: an episode's trace, which episodes to trace, and the viewer that shows them.

A trace is one episode of a traced run (rollout.EpisodeRunner.run's `traced`) as JSON: for each step the page as the
policy read it (cut as in its prompt) and as it looked (a JPEG), the policy's reply, the action parsed from it or why
there was none, the element the action acted on (its box on the page), the environment's error and the reward; then how
the episode ended (only its last step can end it) and the page it ended on. evaluate.py (`--traces`) and train.py
(`trace_every`) write traces under OUTPUT_DIR/traces and the viewer, OUTPUT_DIR/viewer.html: one file holding every
trace of the directory, which opens from disk in any browser, with no server and nothing to install (viewer.html
beside this module is its page).
"""

import base64
import io
import json
import logging
import shutil
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from transformers.integrations import TensorBoardCallback, WandbCallback

from browser_rl.episode import Episode
from browser_rl.prompts import cut_page

log = logging.getLogger("traces")

TRACES_DIR = "traces"
VIEWER_FILE = "viewer.html"
VIEWER_PAGE = Path(__file__).with_name("viewer.html")
TRACES_MARK = "/*TRACES*/null"  # where viewer.html takes the traces
TITLE_MARK = "<!--TITLE-->"


def why_no_action(episode: Episode, turn: int) -> str:
    if not episode.ended[turn]:
        return "the reply was cut off by the length limit before it ended"
    return "the reply holds no allowed action call"


def ending(episode: Episode) -> str:
    if episode.solved:
        return "solved"
    if episode.out_of_context:
        return "out of context: no room for another reply"
    if episode.done:
        return "ended unsolved"
    return "out of turns"


def episode_trace(episode: Episode, max_page_chars: int, label: str) -> dict:
    """The trace of a traced episode; `label` says where it was played (evaluation, a training step)."""
    steps = [
        {
            "page": cut_page(episode.pages[turn], max_page_chars),
            "image": episode.images[turn],
            "reply": episode.replies[turn],
            "action": action,
            "no_action": None if action is not None else why_no_action(episode, turn),
            "box": episode.boxes[turn],
            "error": episode.errors[turn],
            "reward": episode.rewards[turn],
            "guided": turn < episode.guide_turns,  # the guide's reply, not the policy's (browser_rl.guidance)
        }
        for turn, action in enumerate(episode.actions)
    ]
    last = episode.observation
    return {
        "task": episode.task_name,
        "seed": episode.seed,
        "label": label,
        "solved": episode.solved,
        "ending": ending(episode),
        "reward": episode.env_reward,
        "goal": episode.first_observation.goal,
        "steps": steps,
        # The page after its last action (the first page, for an episode that ended before its first reply).
        "end": {"page": cut_page(last.axtree_txt, max_page_chars), "image": episode.images[-1]},
    }


def write_trace(trace: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace))
    return path


def write_viewer(output_dir: Path, title: str) -> Path:
    """OUTPUT_DIR/viewer.html, holding every trace under OUTPUT_DIR/traces (in the order of their paths)."""
    traces = [json.loads(path.read_text()) for path in sorted((Path(output_dir) / TRACES_DIR).rglob("*.json"))]
    # Inside a <script>, "</" would end it early: JSON may write the slash escaped, and means the same.
    data = json.dumps(traces).replace("</", "<\\/")
    page = VIEWER_PAGE.read_text().replace(TRACES_MARK, data).replace(TITLE_MARK, escape_html(title))
    viewer = Path(output_dir) / VIEWER_FILE
    viewer.write_text(page)
    return viewer


def escape_html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def traced_in_evaluation(which: str, solved: bool, traced_of_task: int) -> bool:
    """Whether evaluate.py's `--traces WHICH` keeps an episode's trace: all, failures, or N (the first N of each
    task), `traced_of_task` of its task being kept already."""
    if which == "all":
        return True
    if which == "failures":
        return not solved
    return traced_of_task < int(which)


def chosen_from_step(episodes: list[Episode], count: int) -> list[Episode]:
    """Up to `count` of a training step's episodes, to show how the policy plays: a success and a failure in turn
    where the step has both, each from a task not shown yet where one is left."""
    groups = [[e for e in episodes if e.solved], [e for e in episodes if not e.solved]]
    chosen, tasks = [], set()
    while len(chosen) < count and any(groups):
        for group in groups:
            if group and len(chosen) < count:
                pick = next((e for e in group if e.task_name not in tasks), group[0])
                group.remove(pick)
                chosen.append(pick)
                tasks.add(pick.task_name)
    return chosen


def covers_a_traced_step(step: int, steps: int, every: int) -> bool:
    """Whether a rollout that serves the `steps` optimizer steps from `step` on (TRL's steps_per_generation) serves a
    multiple of `every`: so that no traced step is skipped whatever the two are."""
    return every > 0 and (step + steps - 1) // every > (step - 1) // every


class TrainingTraces:
    """A training run's traces: at a traced step, a few of its episodes (chosen_from_step) in
    OUTPUT_DIR/traces/step-NNNNNN/, the viewer rewritten with every step's, and the episodes sent to the run's trackers:
    to TensorBoard each as a strip of its pages with the acted-on elements outlined (filmstrip) and its steps as text,
    to Weights & Biases as a table with the strips. A step played again after a resume replaces what it wrote before
    the crash; earlier steps' traces stay as they are."""

    def __init__(self, output_dir: str, max_page_chars: int, per_step: int = 4):
        self.output_dir = Path(output_dir)
        self.max_page_chars = max_page_chars
        self.per_step = per_step

    def write(self, step: int, episodes: list[Episode], callbacks: list) -> list[dict]:
        directory = self.output_dir / TRACES_DIR / f"step-{step:06d}"
        if directory.exists():
            shutil.rmtree(directory)
        traces = []
        for number, episode in enumerate(chosen_from_step(episodes, self.per_step)):
            traces.append(episode_trace(episode, self.max_page_chars, f"step {step}"))
            write_trace(traces[-1], directory / f"{number}-{episode.task_name}-seed-{episode.seed}.json")
        viewer = write_viewer(self.output_dir, f"{self.output_dir.name}: training")
        log.info("step %d: %d episode traces in %s, shown by %s", step, len(traces), directory, viewer)
        for callback in callbacks:
            if isinstance(callback, TensorBoardCallback) and callback.tb_writer is not None:
                send_to_tensorboard(callback.tb_writer, step, traces)
            if isinstance(callback, WandbCallback):
                send_to_wandb(step, traces)
        return traces


def send_to_tensorboard(writer, step: int, traces: list[dict]) -> None:
    for number, trace in enumerate(traces):
        tag = f"traces/episode {number}"
        writer.add_image(tag, filmstrip(trace), step, dataformats="HWC")
        writer.add_text(tag, as_markdown(trace), step)
    writer.flush()


def send_to_wandb(step: int, traces: list[dict]) -> None:
    """A table of the step's traced episodes, logged with the step's metrics (the trainer's next log commits it)."""
    import wandb  # the tracker's own package, there when report_to names it

    if wandb.run is None:  # the callback starts the run at the training's start, on the first rank
        return
    table = wandb.Table(columns=["step", "task", "seed", "ending", "steps", "pages"])
    for trace in traces:
        table.add_data(
            step, trace["task"], trace["seed"], trace["ending"], as_markdown(trace), wandb.Image(filmstrip(trace))
        )
    wandb.log({"traces": table}, commit=False)


def as_markdown(trace: dict) -> str:
    lines = [
        f"**{trace['task']}** seed {trace['seed']}: {trace['ending']} (reward {trace['reward']})",
        "",
        f"Goal: {trace['goal']}",
        "",
        "| step | action | error |",
        "| --- | --- | --- |",
    ]
    for number, step in enumerate(trace["steps"], 1):
        action = f"`{step['action']}`" if step["action"] is not None else f"no action: {step['no_action']}"
        lines.append(f"| {number} | {action} | {step['error'].splitlines()[0] if step['error'] else ''} |")
    return "\n".join(lines)


FILMSTRIP_OUTLINE = (229, 0, 122)  # the viewer's outline colour
FILMSTRIP_CAPTION_PX = 16


def filmstrip(trace: dict) -> np.ndarray:
    """An episode's pages side by side, each with the element its action acted on outlined and the action below it,
    the page it ended on last: an RGB array (height, width, 3)."""
    frames = []
    for step in [*trace["steps"], {**trace["end"], "box": None, "action": trace["ending"], "no_action": None}]:
        page = Image.open(io.BytesIO(base64.b64decode(step["image"]))).convert("RGB")
        frame = Image.new("RGB", (page.width, page.height + FILMSTRIP_CAPTION_PX), "white")
        frame.paste(page)
        draw = ImageDraw.Draw(frame)
        if step["box"]:
            x, y, width, height = step["box"]
            draw.rectangle([x, y, x + width, y + height], outline=FILMSTRIP_OUTLINE, width=3)
        draw.text((3, page.height + 2), step["action"] or "no action", fill="black")
        frames.append(frame)
    strip = Image.new("RGB", (sum(f.width + 4 for f in frames), max(f.height for f in frames)), (200, 200, 200))
    left = 0
    for frame in frames:
        strip.paste(frame, (left, 0))
        left += frame.width + 4
    return np.asarray(strip)
