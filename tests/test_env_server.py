"""A real environment server process (python -m web_env.server) driving real Chromium, reached through the OpenEnv
client."""

import asyncio
import base64
import contextlib
import inspect
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest
from openenv.core.generic_client import GenericEnvClient
from PIL import Image
from playwright._impl import _connection, _sync_base
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

from env_client import BrowserGymEnv, cpu_reading
from helpers import ROOT, chromium_processes, click_the_button
from web_env.models import MAX_SETTLE_MS, BrowserGymAction
from web_env.server import browser_setup


def action(text: str) -> BrowserGymAction:
    return BrowserGymAction(action_str=text)


def test_health_answers_at_once_while_a_session_waits_on_its_browser(env_server, session):
    # A container's health check must not time out because a policy made its browser wait.
    # No clock bound on a machine others may load: the proof is that /health answered inside the session's ten-second
    # wait for its browser, so it waited on no browser.
    session.reset(seed=0)
    with ThreadPoolExecutor(max_workers=1) as background:
        waiting = background.submit(session.step, action("noop(10000)"))
        time.sleep(1.0)
        with urllib.request.urlopen(f"{env_server.url}/health", timeout=30) as response:
            answer = json.load(response)
        assert not waiting.done()
        assert waiting.result().observation.error == ""
    assert answer == {"status": "healthy"}


# What OpenEnv's public BrowserGym client reads: the observation's fields, reward and done beside it, and the
# state's fields (envs/browsergym_env/client.py and models.py upstream).
UPSTREAM_OBSERVATION_FIELDS = {
    "text",
    "url",
    "screenshot",
    "goal",
    "axtree_txt",
    "pruned_html",
    "error",
    "last_action_error",
    "metadata",
}
UPSTREAM_STATE_FIELDS = {
    "episode_id",
    "step_count",
    "benchmark",
    "task_name",
    "task_id",
    "goal",
    "current_url",
    "max_steps",
    "cum_reward",
}


@pytest.mark.parametrize(
    "command, side",
    [(["-m", "web_env.server", "--help"], "web_env.server.app"), (["-c", "import env_client"], "env_client")],
    ids=["server", "client"],
)
def test_neither_side_imports_openenvs_web_interface(command, side):
    # Its Gradio import was 3 to 5 s of every process that imports OpenEnv (a run, an evaluation, a server start).
    started = subprocess.run([sys.executable, "-X", "importtime", *command], cwd=ROOT, capture_output=True, text=True)
    assert started.returncode == 0, started.stderr[-3000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in started.stderr.splitlines() if "|" in line}
    assert {"openenv.core.env_server", side} <= imported
    assert not {name for name in imported if name.startswith("gradio.")}  # its own name: the import it refused


def test_gradio_imports_as_usual_after_the_environment_package():
    # Only OpenEnv's own import goes without it; a logger's dashboard imported later still gets it.
    code = "import sys, env_client, gradio; print(gradio.Blocks.__name__, 'gradio' in sys.modules)"
    imported = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert imported.stdout.split() == ["Blocks", "True"], imported.stderr[-3000:]


def test_openenvs_own_client_plays_an_episode_with_the_upstream_wire_format(env_server):
    # OpenEnv's generic client sends the action as a plain dict and hands back what the server sent, unparsed.
    with GenericEnvClient(base_url=env_server.url).sync() as client:
        first = client.reset(task_name="click-test", seed=3, trace=True)  # a traced episode's fields are extra
        assert first.observation.keys() >= UPSTREAM_OBSERVATION_FIELDS | {"page_image", "action_box"}
        assert (first.reward, first.done) == (0.0, False)
        result = client.step({"action_str": click_the_button(first.observation["axtree_txt"])})
        assert (result.reward, result.done, result.observation["error"]) == (1.0, True, "")
        state = client.state()
        assert state.keys() >= UPSTREAM_STATE_FIELDS
        assert (state["task_name"], state["task_id"], state["step_count"]) == ("click-test", "3", 1)


def test_reset_gives_the_goal_and_an_accessibility_tree_with_the_button(session):
    result = session.reset(seed=0)
    obs = result.observation
    assert obs.goal == "Click the button."
    assert "button 'Click Me!'" in obs.axtree_txt
    assert obs.text == obs.axtree_txt
    assert "Click Me!" in obs.pruned_html
    assert obs.url.endswith("click-test.html")
    assert obs.screenshot is None  # off unless asked for
    assert (result.done, result.reward, obs.error, obs.last_action_error) == (False, 0.0, "", False)


def test_clicking_the_button_solves_the_task(session):
    obs = session.reset(seed=1).observation
    result = session.step(action(click_the_button(obs.axtree_txt)))
    assert (result.reward, result.done) == (1.0, True)
    assert result.observation.error == ""


def test_a_wrong_bid_is_an_error_observation_and_the_session_keeps_working(session):
    obs = session.reset(seed=2).observation
    wrong = session.step(action("click('9999')"))
    assert wrong.observation.last_action_error
    assert 'Could not find element with bid "9999"' in wrong.observation.error
    assert (wrong.reward, wrong.done) == (0.0, False)
    right = session.step(action(click_the_button(obs.axtree_txt)))
    assert (right.reward, right.done) == (1.0, True)


def test_a_disallowed_action_is_refused_as_an_error(session):
    session.reset(seed=3)
    result = session.step(action("goto('https://example.com')"))
    assert result.observation.last_action_error
    assert "goto" in result.observation.error
    assert result.observation.url.endswith("click-test.html")
    assert (result.reward, result.done) == (0.0, False)


def test_task_is_chosen_per_reset_and_an_unknown_task_is_a_clear_error(session):
    assert session.reset(task_name="enter-text", seed=0).observation.url.endswith("enter-text.html")
    with pytest.raises(RuntimeError, match="unknown task 'no-such-task'"):
        session.reset(task_name="no-such-task")
    assert session.reset(seed=0).observation.url.endswith("click-test.html")  # back to the server's default task


def test_screenshot_on_request(session):
    obs = session.reset(seed=0, screenshot=True).observation
    height, width, channels = len(obs.screenshot), len(obs.screenshot[0]), len(obs.screenshot[0][0])
    assert channels == 3 and height > 100 and width > 100


def test_a_traced_episode_shows_each_page_as_a_jpeg_and_where_each_action_acted(session):
    first = session.reset(task_name="click-test", seed=0, trace=True).observation
    page = Image.open(io.BytesIO(base64.b64decode(first.page_image)))
    assert (page.format, page.size) == ("JPEG", (332, 214))  # MiniWoB's viewport
    clicked = session.step(action(click_the_button(first.axtree_txt)))
    assert clicked.reward == 1.0 and clicked.observation.page_image
    x, y, width, height = clicked.observation.action_box
    button = np.asarray(page.convert("L").crop((x + 2, y + 2, x + width - 2, y + height - 2)))
    assert 20 < width < 160 and 20 < height < 160
    assert button.min() < 100  # the button's black label, inside the box, on the page before the click
    # Measured before the action: the dialog's Close button is gone once clicked.
    dialog = session.reset(task_name="click-dialog", seed=0, trace=True).observation
    close = re.search(r"\[(\d+)\] button 'Close'", dialog.axtree_txt).group(1)
    closed = session.step(action(f"click('{close}')"))
    assert closed.reward == 1.0 and "Close" not in closed.observation.axtree_txt
    assert closed.observation.action_box is not None
    session.reset(task_name="click-test", seed=0, trace=True)
    for no_element in ("scroll(0, 50)", "click('9999')", "goto('https://example.com')"):
        stepped = session.step(action(no_element)).observation
        assert stepped.page_image and stepped.action_box is None, no_element


def test_an_untraced_episode_carries_no_page_image_nor_box(session):
    first = session.reset(task_name="click-test", seed=0, trace=True).observation
    untraced = session.reset(task_name="click-test", seed=0).observation  # trace holds for its episode only
    clicked = session.step(action(click_the_button(first.axtree_txt))).observation
    assert (untraced.page_image, clicked.page_image, clicked.action_box) == (None, None, None)
    with pytest.raises(RuntimeError, match="trace must be true or false"):
        session.reset(seed=0, trace="yes")


def test_the_same_seed_gives_the_same_task_instance(session):
    first = session.reset(task_name="click-button", seed=7).observation
    second = session.reset(task_name="click-button", seed=7).observation
    assert (first.goal, first.axtree_txt) == (second.goal, second.axtree_txt)


def test_concurrent_sessions_do_not_see_each_others_pages(env_server):
    async def scenario():
        a, b = BrowserGymEnv(base_url=env_server.url), BrowserGymEnv(base_url=env_server.url)
        try:
            reset_a, reset_b = await asyncio.gather(a.reset(seed=4), b.reset(task_name="enter-text", seed=4))
            assert reset_a.observation.url.endswith("click-test.html")
            assert reset_b.observation.url.endswith("enter-text.html")
            stepped_a, state_b = await asyncio.gather(
                a.step(action(click_the_button(reset_a.observation.axtree_txt))), b.step(action("noop(10)"))
            )
            assert (stepped_a.reward, stepped_a.done) == (1.0, True)
            assert (state_b.reward, state_b.done) == (0.0, False)
            assert state_b.observation.goal == reset_b.observation.goal
            assert "Click Me!" not in state_b.observation.axtree_txt
        finally:
            await asyncio.gather(a.close(), b.close())

    asyncio.run(scenario())


def test_playwright_calls_skip_the_source_lookup_and_their_errors_still_name_the_call(monkeypatch):
    source_reads = []
    findsource = inspect.findsource
    monkeypatch.setattr(inspect, "findsource", lambda obj: source_reads.append(obj) or findsource(obj))
    # Playwright's own stack recording, whichever test in this process recorded cheaply before; undone after the test.
    monkeypatch.setattr(_sync_base, "inspect", inspect)
    monkeypatch.setattr(_connection, "inspect", inspect)
    browser_setup.ensure_chromium()

    def reads_per_call():  # on a thread of its own: sync Playwright must not claim the test runner's thread
        with sync_playwright() as pw:
            browser = pw.chromium.launch()
            page = browser.new_page()
            page.evaluate("1")
            before = len(source_reads)
            browser_setup.record_playwright_stacks_cheaply()
            page.evaluate("1")
            after = len(source_reads) - before
            with pytest.raises(PlaywrightError, match=r"^Page.click: Timeout 1ms exceeded"):
                page.click("#missing", timeout=1)
            browser.close()
        return before, after

    with ThreadPoolExecutor(max_workers=1) as thread:
        before, after = thread.submit(reads_per_call).result()
    assert before > 0 and after == 0


def test_a_client_gets_the_fields_it_asks_for_and_every_field_when_it_asks_for_none(session):
    chosen = session.reset(task_name="enter-text", seed=5, fields=["goal", "axtree_txt"]).observation
    assert chosen.goal and "textbox" in chosen.axtree_txt
    assert (chosen.text, chosen.pruned_html, chosen.url) == ("", "", "")
    every = session.reset(task_name="enter-text", seed=5).observation
    assert every.axtree_txt == chosen.axtree_txt and every.text == every.axtree_txt
    assert "<input" in every.pruned_html and every.url.endswith("enter-text.html")
    with pytest.raises(RuntimeError, match="fields must be a list of observation fields"):
        session.reset(task_name="enter-text", seed=5, fields=["cookies"])


def test_a_client_picks_its_episode_s_wait_before_each_observation_and_the_next_reset_has_the_server_s(session):
    def step_seconds() -> float:
        start = time.perf_counter()
        session.step(action("noop(0)"))
        return time.perf_counter() - start

    session.reset(task_name="click-test", seed=1, settle_ms=MAX_SETTLE_MS)
    assert step_seconds() >= MAX_SETTLE_MS / 1000
    session.reset(task_name="click-test", seed=2)  # the server's wait: 0
    assert step_seconds() < MAX_SETTLE_MS / 1000


def test_a_reset_to_the_task_the_page_holds_restarts_it_in_place_and_another_task_loads(session):
    first = session.reset(task_name="click-test", seed=1).observation
    again = session.reset(task_name="click-test", seed=2).observation
    other = session.reset(task_name="enter-text", seed=2).observation
    assert again.metadata["restarted_in_page"] and not other.metadata["restarted_in_page"]
    assert first.url == again.url and again.url != other.url


def open_sessions(url: str) -> int:
    with urllib.request.urlopen(f"{url}/cpu", timeout=5) as response:
        return json.load(response)["sessions"]


def wait_until_sessions_open_are(url: str, count: int, deadline_s: float = 30.0) -> None:
    """A client's close returns before the server ends its session (and keeps its page), so what comes next in a
    test waits for the server's count."""
    deadline = time.monotonic() + deadline_s
    while (sessions := open_sessions(url)) != count:
        assert time.monotonic() < deadline, f"the server has {sessions} sessions open, not {count}"
        time.sleep(0.05)


def test_a_new_session_restarts_its_first_episode_in_the_page_a_closed_session_left(env_server):
    # Each waits for the earlier sessions to end, so that the new session joins the closed one's browser: with no
    # session on either, the pool picks the first.
    wait_until_sessions_open_are(env_server.url, 0)
    with BrowserGymEnv(base_url=env_server.url).sync() as closed:
        closed.reset(task_name="click-test", seed=1)
    wait_until_sessions_open_are(env_server.url, 0)
    with BrowserGymEnv(base_url=env_server.url).sync() as new:
        first = new.reset(task_name="click-test", seed=2).observation
        second = new.reset(task_name="click-test", seed=3).observation
    assert first.metadata["page_of_a_closed_session"] and first.metadata["restarted_in_page"]
    assert first.goal == "Click the button." and "page_of_a_closed_session" not in second.metadata


def test_the_server_reports_its_cpu_the_episodes_begun_on_it_and_its_open_sessions(env_server, session):
    before_cpu, before_episodes = cpu_reading(env_server.url)
    for seed in range(3):
        session.reset(seed=seed)
    after_cpu, after_episodes = cpu_reading(env_server.url)
    assert after_episodes >= before_episodes + 3 and after_cpu > before_cpu
    wait_until_sessions_open_are(env_server.url, 1)  # this test's; the earlier tests' ended
    with BrowserGymEnv(base_url=env_server.url).sync() as second:
        second.reset(seed=3)
        assert open_sessions(env_server.url) == 2
    wait_until_sessions_open_are(env_server.url, 1)


def cpu_seconds(pids: set[int]) -> dict[int, float]:
    """Each live process's CPU seconds so far."""
    seconds = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            seconds[pid] = times.user + times.system
    return seconds


def test_the_servers_browsers_are_chromiums_headless_shell_where_the_system_has_one(env_server, session):
    """make setup installs Debian's chromium-headless-shell where apt-get is, and the server takes it before any full
    Chromium on the machine."""
    if shutil.which("apt-get") is None:
        pytest.skip("make setup installs chromium-headless-shell with apt-get, and there is none here")
    assert shutil.which("chromium-headless-shell"), "make setup installs chromium-headless-shell"
    session.reset(task_name="click-test", seed=0)
    # Debian's chromium-headless-shell is a shell script that starts /usr/lib/chromium/chromium-headless-shell.
    programs = {Path(f"/proc/{pid}/exe").resolve().name for pid in chromium_processes(env_server.pid)}
    assert "chromium-headless-shell" in programs and "chromium" not in programs, programs


def test_the_servers_cpu_counts_its_browsers_not_only_its_own_python(env_server, session):
    reported_before, python_before = cpu_reading(env_server.url)[0], cpu_seconds({env_server.pid})
    chromium_before = cpu_seconds(chromium_processes(env_server.pid))
    for seed in range(8):  # page loads: most of their work is Chromium's
        session.reset(task_name=("click-test", "enter-text")[seed % 2], seed=seed)
    reported = cpu_reading(env_server.url)[0] - reported_before
    python = cpu_seconds({env_server.pid})[env_server.pid] - python_before[env_server.pid]
    chromium_after = cpu_seconds(chromium_processes(env_server.pid))
    chromium = sum(seconds - chromium_before.get(pid, 0.0) for pid, seconds in chromium_after.items())
    assert chromium > 0.2
    assert reported >= python + 0.8 * chromium


def docker_engine_answers() -> bool:
    """Whether a Docker engine runs here (a docker command alone, without its engine, builds and runs nothing)."""
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not docker_engine_answers(), reason="no Docker engine here: the image can be neither built nor run")
def test_openenvs_from_docker_image_starts_the_container_with_the_token_the_client_sends(monkeypatch):
    # A container listens beyond loopback, so its server refuses to start without a token: the client's own
    # ($BROWSER_RL_ENV_TOKEN) is handed to the container as README.md shows.
    image = "browser-rl-env:test"
    build = ["docker", "build", "-q", "-t", image, "-f", "web_env/server/Dockerfile", "web_env"]
    subprocess.run(build, cwd=ROOT, check=True, capture_output=True)
    monkeypatch.setenv("BROWSER_RL_ENV_TOKEN", "a-token-for-this-test")
    env = BrowserGymEnv.from_docker_image(image, env_vars={"BROWSER_RL_ENV_TOKEN": "a-token-for-this-test"}).sync()
    try:
        result = env.reset(task_name="click-test", seed=0)
        assert "Click" in result.observation.goal
    finally:
        env.close()


def test_without_playwrights_own_chromium_the_lightest_system_build_on_path_is_linked_and_the_full_one_for_a_window(
    tmp_path, monkeypatch
):
    # No machine here has both builds: stand-ins on a PATH of their own, the full browser and the headless shell.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("chromium", "chromium-headless-shell"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(tmp_path / "no-playwright-builds"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    browser_setup.ensure_chromium()
    links = [path for path in (tmp_path / "home").rglob("*") if path.is_symlink()]
    assert [path.readlink() for path in links] == [bin_dir / "chromium-headless-shell"]
    browser_setup.ensure_chromium(windowed=True)  # a window needs the full browser: the shell draws none
    windowed = [path for path in (tmp_path / "home").rglob("*") if path.is_symlink() and path not in links]
    assert [path.readlink() for path in windowed] == [bin_dir / "chromium"]
