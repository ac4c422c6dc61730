"""The trace viewer's picture in the docs (docs/trace_viewer.png): the page-reading tasks played by the scripted plans
(warm_start.plans), which take a wrong action at the last step of every third seed, traced as evaluate.py traces, the
viewer written and opened in Chromium on a login-user episode, and its screenshot taken.

    python bench/viewer_picture.py                      # writes docs/trace_viewer.png, a minute on two cores
    python bench/viewer_picture.py --viewer outputs/eval/viewer.html --episode "seed 1000001" --steps 1 \
        --output docs/picture.png                       # a viewer an evaluation wrote, at one of its episodes
"""

import argparse
import contextlib
import tempfile
from dataclasses import replace
from pathlib import Path

from playwright.sync_api import sync_playwright

from browser_rl.episode_settings import DEFAULTS
from browser_rl.generation import reply_of_text
from browser_rl.options import ServerArguments
from browser_rl.rollout import EpisodeRunner
from browser_rl.servers import open_server_pool
from browser_rl.tasks import PRESETS
from browser_rl.traces import TRACES_DIR, episode_trace, write_trace, write_viewer
from warm_start.plans import plan_of
from warm_start.tiny_lfm2 import build_tokenizer
from web_env.server import browser_setup

ROOT = Path(__file__).resolve().parent.parent


def wrong_at_the_end_of_every_third_seed(tokenizer):
    def policy(episodes):
        replies = []
        for episode in episodes:
            plan = plan_of(episode)
            step = min(episode.turns, len(plan.right) - 1)
            wrong = episode.seed % 3 == 0 and episode.turns >= len(plan.right) - 1
            replies.append(reply_of_text(tokenizer, (plan.wrong if wrong else plan.right)[step]))
        return replies

    return policy


def photograph(viewer: Path, output: str, episode: str, steps: int) -> None:
    """A screenshot of `viewer` opened in Chromium at the last episode whose entry holds `episode`, `steps` steps on."""
    browser_setup.ensure_chromium()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch()
        page = browser.new_page(viewport={"width": 1280, "height": 760})
        page.goto(viewer.resolve().as_uri())
        page.locator(".episode", has_text=episode).last.click()
        for _ in range(steps):
            page.keyboard.press("ArrowRight")
        page.screenshot(path=output)
        browser.close()
    print(f"wrote {output}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default=str(ROOT / "docs/trace_viewer.png"))
    parser.add_argument("--viewer", type=Path, help="an evaluation's viewer.html, instead of the scripted plans'")
    parser.add_argument("--episode", default="seed 1000001", help="text of the episode's entry in the list")
    parser.add_argument("--steps", type=int, default=1, help="steps to move on from the episode's first")
    args = parser.parse_args()
    if args.viewer:
        photograph(args.viewer, args.output, args.episode, args.steps)
        return
    tokenizer = build_tokenizer()
    instances = [(task, 1_000_000 + seed) for task in PRESETS["page-reading"] for seed in range(6)]
    with contextlib.ExitStack() as stack:
        servers = open_server_pool(stack, ServerArguments(env_servers=1), max_sessions=len(instances))
        runner = EpisodeRunner(servers, tokenizer, replace(DEFAULTS, max_turns=5))
        stack.callback(runner.close)
        episodes = runner.run(instances, wrong_at_the_end_of_every_third_seed(tokenizer), traced=True)
    with tempfile.TemporaryDirectory() as directory:
        for index, episode in enumerate(episodes):
            trace = episode_trace(episode, DEFAULTS.max_page_chars, f"episode {index}")
            write_trace(trace, Path(directory) / TRACES_DIR / episode.task_name / f"episode-{index:05d}.json")
        viewer = write_viewer(Path(directory), "outputs/page-reading: evaluation")
        # login-user's solved episode of seed 1000001, at its second step: the password typed into its box
        photograph(viewer, args.output, args.episode, args.steps)


if __name__ == "__main__":
    main()
