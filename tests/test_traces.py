"""What the agent did: traces of episodes played on a real server, the viewer opened in Chromium as a person would, and
a training run that traces every trace_every steps, to disk and to TensorBoard, and keeps them across a resume."""

import base64
import contextlib
import io
import json
import sys
from pathlib import Path

import pytest
import wandb
from PIL import Image
from playwright.sync_api import expect, sync_playwright
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import evaluate as evaluate_py
import train
from browser_rl.episode import Episode
from browser_rl.episode_settings import EpisodeSettings
from browser_rl.generation import Reply
from browser_rl.metrics import METRICS_FILE, logged_steps, read_metrics
from browser_rl.rollout import EpisodeRunner
from browser_rl.servers import ServerPool
from browser_rl.tasks import PRESETS
from browser_rl.traces import (
    TRACES_DIR,
    chosen_from_step,
    covers_a_traced_step,
    episode_trace,
    filmstrip,
    write_trace,
    write_viewer,
)
from helpers import RESUMABLE, click_the_button, parse_config
from web_env.server import browser_setup


def scripted_replies(tokenizer, script: dict[int, list[str]]):
    """A policy that plays each episode's script of replies (by its seed): CLICK is click-test's right click."""

    def policy(episodes: list[Episode]) -> list[Reply]:
        replies = []
        for episode in episodes:
            text = script[episode.seed][episode.turns]
            text = click_the_button(episode.observation.axtree_txt) if text == "CLICK" else text
            ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
            replies.append(Reply(ids, [0.0] * len(ids), True))
        return replies

    return policy


# click-test, seed by seed: solved at once; no action then solved; a click beside the button (its area), then no action.
SCRIPT = {1: ["CLICK"], 2: ["I would click it", "CLICK"], 3: ["click('12')", "let me think"]}


@pytest.fixture(scope="module")
def traced_episodes(env_server, tokenizer) -> list[Episode]:
    runner = EpisodeRunner(ServerPool([env_server.url]), tokenizer, EpisodeSettings(max_turns=2))
    try:
        return runner.run([("click-test", seed) for seed in SCRIPT], scripted_replies(tokenizer, SCRIPT), traced=True)
    finally:
        runner.close()


def test_a_trace_holds_each_step_as_the_policy_read_wrote_and_did_it(traced_episodes):
    solved, late, failed = (episode_trace(e, 50, "evaluation") for e in traced_episodes)
    assert [(t["solved"], t["ending"], len(t["steps"])) for t in (solved, late, failed)] == [
        (True, "solved", 1),
        (True, "solved", 2),
        (False, "out of turns", 2),
    ]
    (click,) = solved["steps"]
    assert click["action"] == click_the_button(traced_episodes[0].pages[0]) and click["reward"] == 1.0
    assert click["page"].endswith("[... page truncated]") and len(click["page"]) < 80  # cut as in the prompt
    assert len(click["box"]) == 4 and solved["goal"] == "Click the button."
    first_reply = late["steps"][0]
    assert (first_reply["action"], first_reply["box"]) == (None, None)
    assert first_reply["no_action"] == "the reply holds no allowed action call"
    body, thinking = failed["steps"]
    assert body["action"] == "click('12')" and body["box"] is not None and body["error"] == ""
    assert thinking["box"] is None  # no action: not the last action's box again
    for trace in (solved, late, failed):
        for image in [step["image"] for step in trace["steps"]] + [trace["end"]["image"]]:
            assert Image.open(io.BytesIO(base64.b64decode(image))).format == "JPEG"


def test_a_filmstrip_shows_each_page_and_the_end_side_by_side(traced_episodes):
    strip = filmstrip(episode_trace(traced_episodes[1], 10_000, "step 2"))
    assert strip.shape[2] == 3 and strip.shape[1] >= 3 * 332 and strip.shape[0] > 214  # two steps, the end, captions


@pytest.fixture(scope="module")
def viewer(traced_episodes, tmp_path_factory) -> Path:
    output_dir = tmp_path_factory.mktemp("viewer")
    for index, episode in enumerate(traced_episodes):
        trace = episode_trace(episode, 10_000, f"episode {index}")
        write_trace(trace, output_dir / TRACES_DIR / "click-test" / f"{index}.json")
    return write_viewer(output_dir, "tiny </script> model: evaluation")


@contextlib.contextmanager
def opened_chromium():
    """Chromium through Playwright's sync API, whose event loop runs in this thread while it is open: an EpisodeRunner's
    own loop cannot run meanwhile."""
    browser_setup.ensure_chromium()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch()
        yield browser
        browser.close()


@pytest.fixture
def chromium():
    with opened_chromium() as browser:
        yield browser


def test_the_viewer_opens_from_disk_and_steps_through_an_episode_with_its_page_and_action(viewer, chromium):
    page = chromium.new_page(viewport={"width": 1400, "height": 900})
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(viewer.as_uri())
    assert page.title() == "tiny </script> model: evaluation"
    expect(page.locator("#summary")).to_have_text("3 episodes of 1 task(s), 2 solved")
    expect(page.locator(".episode")).to_have_count(3)
    expect(page.locator(".task-heading")).to_contain_text("click-test 2/3 solved")
    page.locator(".episode", has_text="seed 1").click()
    expect(page.locator("#step-counter")).to_have_text("step 1 of 1")
    screenshot = page.locator("#screenshot")
    expect(screenshot).to_be_visible()
    expect(page.locator("#no-image")).to_be_hidden()
    assert screenshot.evaluate("img => img.complete && img.naturalWidth") == 332
    assert screenshot.bounding_box()["width"] == pytest.approx(1.5 * 332)  # shown half as large again
    box = page.locator("#action-box")
    expect(box).to_be_visible()  # the button the action clicked, outlined on the page
    drawn = box.evaluate("b => [b.offsetLeft, b.offsetTop, b.offsetWidth, b.offsetHeight]")
    trace = json.loads(next(viewer.parent.rglob("0.json")).read_text())
    assert drawn == pytest.approx([1.5 * value for value in trace["steps"][0]["box"]], abs=1)
    assert within(box.bounding_box(), screenshot.bounding_box())
    expect(page.locator("#step-text")).to_contain_text(trace["steps"][0]["action"])
    page.locator("#next").click()
    expect(page.locator("#step-counter")).to_have_text("end (after 1 step(s))")
    expect(page.locator("#next")).to_be_disabled()
    expect(box).to_be_hidden()
    page.locator("#prev").click()
    expect(page.locator("#step-counter")).to_have_text("step 1 of 1")
    page.keyboard.press("ArrowDown")  # the next episode: seed 2, its first reply without an action
    expect(page.locator("#episode-heading")).to_contain_text("seed 2")
    expect(page.locator("#step-text")).to_contain_text("no action: the reply holds no allowed action call")
    expect(box).to_be_hidden()
    page.keyboard.press("ArrowRight")
    expect(page.locator("#step-counter")).to_have_text("step 2 of 2")
    expect(box).to_be_visible()
    assert errors == []


def within(inner: dict, outer: dict) -> bool:
    """Whether a bounding box lies inside another (to a pixel)."""
    return (
        inner["x"] >= outer["x"] - 1
        and inner["y"] >= outer["y"] - 1
        and inner["x"] + inner["width"] <= outer["x"] + outer["width"] + 1
        and inner["y"] + inner["height"] <= outer["y"] + outer["height"] + 1
    )


def test_a_step_without_a_screenshot_says_so_and_shows_no_other_page(traced_episodes, chromium, tmp_path):
    # A server that sends no page images (OpenEnv's public one): the trace's first step of seed 2 has none, its
    # second has one. Stepping from the step with an image to the one without must not leave the first image shown.
    trace = episode_trace(traced_episodes[1], 10_000, "episode 1")
    trace["steps"][1]["image"] = None
    write_trace(trace, tmp_path / TRACES_DIR / "click-test" / "1.json")
    page = chromium.new_page(viewport={"width": 1400, "height": 900})
    page.goto(write_viewer(tmp_path, "no images").as_uri())
    page.locator(".episode", has_text="seed 2").click()
    expect(page.locator("#screenshot")).to_be_visible()
    page.locator("#next").click()
    expect(page.locator("#step-counter")).to_have_text("step 2 of 2")
    expect(page.locator("#no-image")).to_be_visible()
    expect(page.locator("#no-image")).to_have_text("no screenshot of this page")
    expect(page.locator("#screenshot")).to_be_hidden()
    expect(page.locator("#action-box")).to_be_hidden()


def test_the_viewers_filters_show_a_tasks_failures_in_one_click(viewer, chromium):
    page = chromium.new_page(viewport={"width": 1400, "height": 900})
    page.goto(viewer.as_uri())
    page.locator(".failures-of").click()
    expect(page.locator(".episode")).to_have_count(1)
    expect(page.locator("#episode-heading")).to_contain_text("seed 3")
    expect(page.locator("#episode-heading")).to_contain_text("out of turns")
    page.locator("#outcome-filter").select_option("solved")
    expect(page.locator(".episode")).to_have_count(2)
    page.locator("#task-filter").select_option("")
    page.locator("#outcome-filter").select_option("all")
    expect(page.locator(".episode")).to_have_count(3)
    page.locator("#task-filter").select_option("click-test")
    expect(page.locator(".episode")).to_have_count(3)


def test_the_viewer_folds_a_long_page_and_says_its_length(traced_episodes, chromium, tmp_path):
    trace = episode_trace(traced_episodes[0], 10_000, "episode 0")
    trace["steps"][0]["page"] = "\n".join(f"[{n}] StaticText 'line {n}'" for n in range(40))
    write_trace(trace, tmp_path / TRACES_DIR / "click-test" / "0.json")
    page = chromium.new_page()
    page.goto(write_viewer(tmp_path, "a long page").as_uri())
    expect(page.locator("#page summary")).to_have_text("page as the policy read it (40 lines)")
    assert not page.locator("#page").evaluate("details => details.open")
    page.locator("#next").click()  # the page it ended on: click-test's few lines, open
    assert page.locator("#page").evaluate("details => details.open")


def test_a_training_step_covers_a_traced_step_whatever_the_steps_per_generation():
    assert [step for step in range(1, 13) if covers_a_traced_step(step, 1, 5)] == [5, 10]
    assert [step for step in range(1, 13, 4) if covers_a_traced_step(step, 4, 5)] == [5, 9]  # serving 5-8, 9-12
    assert not any(covers_a_traced_step(step, 1, 0) for step in range(1, 10))


def test_a_steps_traces_are_a_success_and_a_failure_in_turn_across_tasks():
    def episode(task: str, solved: bool) -> Episode:
        return Episode(task, 0, done=solved, env_reward=float(solved), raw_reward=float(solved))

    step = [episode("a", False), episode("a", True), episode("b", False), episode("b", True), episode("c", False)]
    chosen = chosen_from_step(step, 3)
    assert [(e.task_name, e.solved) for e in chosen] == [("a", True), ("b", False), ("b", True)]
    assert [e.solved for e in chosen_from_step(step[:1], 4)] == [False]


def train_with_two_trackers(model: str, output_dir: Path, *extra: str) -> None:
    args = parse_config("configs/smoke.yaml", "--model_name_or_path", model, "--output_dir", str(output_dir), *extra)
    args[4].report_to = ["tensorboard", "wandb"]  # a list, which the command line does not take
    train.main(*args)


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """Weights & Biases writing its files into tmp_path, sending nothing; its run, which the trainer's callback leaves
    open in this process, finished after the test."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    yield
    wandb.finish()


def test_training_traces_every_trace_every_steps_and_a_resumed_run_keeps_them(
    half_right_model, env_server, tmp_path, offline_wandb
):
    run = (*RESUMABLE, "--env_url", env_server.url, "--trace_every", "2")
    train_with_two_trackers(half_right_model, tmp_path, *run, "--max_steps", "2")
    before = {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in (tmp_path / TRACES_DIR).rglob("*.json")}
    train_with_two_trackers(half_right_model, tmp_path, *run, "--max_steps", "4")  # resumes from checkpoint-2
    assert [row["step"] for row in read_metrics(tmp_path / METRICS_FILE) if "reward" in row] == [1, 2, 3, 4]
    traces = {}
    for path in sorted((tmp_path / TRACES_DIR).rglob("*.json")):
        traces.setdefault(path.parent.name, []).append(json.loads(path.read_text()))
    assert list(traces) == ["step-000002", "step-000004"]
    assert all((path.read_bytes(), path.stat().st_mtime_ns) == kept for path, kept in before.items())
    steps = logged_steps(tmp_path / METRICS_FILE)
    for step, of_step in zip((2, 4), traces.values(), strict=True):
        assert 1 <= len(of_step) <= 4 and {trace["label"] for trace in of_step} == {f"step {step}"}
        if 0 < steps[step]["episodes/success_rate"] < 1:  # the step has both: both are shown
            assert {trace["solved"] for trace in of_step} == {True, False}
        for trace in of_step:
            (played,) = trace["steps"]  # one action an episode
            assert played["image"]
            assert (played["box"] is not None) == trace["solved"]  # the button, or a bid the page does not have
    viewer = (tmp_path / "viewer.html").read_text()
    assert viewer.count('"label": "step 2"') == len(traces["step-000002"])
    assert viewer.count('"label": "step 4"') == len(traces["step-000004"])
    # Each run's TensorBoard log holds its traced step's episodes: a strip of pages, and the steps as text.
    logged = []
    for run_dir in sorted((tmp_path / "runs").iterdir()):
        events = EventAccumulator(str(run_dir), size_guidance={"images": 0, "tensors": 0})
        events.Reload()
        images = [tag for tag in events.Tags()["images"] if tag.startswith("traces/")]
        logged.append(sorted({event.step for tag in images for event in events.Images(tag)}))
        assert len(images) == len(traces[f"step-00000{logged[-1][0]}"])
        assert {tag for tag in events.Tags()["tensors"] if tag.startswith("traces/")}  # add_text's
    assert logged == [[2], [4]]
    # And Weights & Biases a table of each traced step's episodes, each with its strip of pages (one process: one
    # wandb run, which both trainings log into).
    tables = [json.loads(path.read_text()) for path in tmp_path.glob("wandb/offline-run-*/files/media/table/*.json")]
    assert all(table["columns"] == ["step", "task", "seed", "ending", "steps", "pages"] for table in tables)
    rows = sorted((row for table in tables for row in table["data"]), key=lambda row: row[0])
    assert [row[0] for row in rows] == [2] * len(traces["step-000002"]) + [4] * len(traces["step-000004"])
    assert all(row[5] == "Image" for row in rows)  # a wandb.Image: offline, the table's file names its type alone


@pytest.mark.slow
def test_evaluate_writes_a_viewer_of_its_failures_that_chromium_shows(
    tiny_model, env_server, tmp_path, monkeypatch, capsys
):
    # evaluate.py's own main, in this process: a process of its own would add only its imports, some 10 s.
    command = ["evaluate.py", "--model", tiny_model, "--tasks", "page-reading", "--episodes", "8"]
    command += ["--traces", "failures", "--max_turns", "2", "--env_url", env_server.url, "--output_dir", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", command)
    evaluate_py.main()
    assert f"traces (failures) shown by {tmp_path / 'viewer.html'}" in capsys.readouterr().out
    failed = [r for r in map(json.loads, (tmp_path / "episodes.jsonl").read_text().splitlines()) if not r["success"]]
    assert len(failed) == 48  # the tiny model reads nothing: it solves none
    with opened_chromium() as chromium:
        check_the_failures_viewer(chromium.new_page(viewport={"width": 1400, "height": 900}), tmp_path, failed)


def check_the_failures_viewer(page, output_dir: Path, failed: list[dict]) -> None:
    page.goto((output_dir / "viewer.html").as_uri())
    expect(page.locator(".episode")).to_have_count(len(failed))
    expect(page.locator(".task-heading")).to_have_count(len(PRESETS["page-reading"]))
    page.locator("#task-filter").select_option("login-user")
    expect(page.locator(".episode")).to_have_count(8)
    page.locator(".episode").nth(3).click()
    expect(page.locator("#goal")).to_contain_text("Enter the username")
    assert page.locator("#screenshot").evaluate("img => img.complete && img.naturalWidth") == 332
    page.locator("#next").click()
    expect(page.locator("#step-counter")).to_have_text("step 2 of 2")
    page.keyboard.press("ArrowLeft")
    expect(page.locator("#step-counter")).to_have_text("step 1 of 2")
    expect(page.locator("#page")).to_contain_text("textbox")  # login-user's page, as the policy read it
