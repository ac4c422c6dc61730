"""A task on your app where it already runs: the origins a task module lists in ALLOWED_ORIGINS (or the server's
--allowed_origins) are the pages' only way out; every other origin, loopback's other ports included, stays closed. The
app runs in a process of its own on a loopback port, standing in for a staging host."""

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from openenv.core.generic_client import GenericEnvClient

from browser_rl.command_options import AgentArguments
from env_client import LocalEnvServer
from helpers import ROOT, run_agent
from web_env import task_modules
from web_env.server import browser_setup
from web_env.server.browsers import BrowserPool
from web_env.server.check_tasks import OtherOrigin, reach_out
from web_env.server.environment import BrowserTaskEnvironment

NOTES = ROOT / "tests" / "own_tasks" / "notes_task.py"


@pytest.fixture(scope="module")
def notes_app():
    """The notes app served by a process of its own, on a loopback port of its own."""
    with socket.socket() as probe:  # a port free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=NOTES.with_name("notes_app"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        while app.poll() is None:
            try:
                urllib.request.urlopen(url, timeout=5)
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        app.terminate()
        app.wait(timeout=30)


def test_an_episode_plays_on_the_app_where_it_runs_and_its_reset_names_the_origins_allowed(notes_app, monkeypatch):
    monkeypatch.setenv("NOTES_APP_URL", notes_app)  # the module reads it, in the server's process
    with LocalEnvServer(max_sessions=1, task_modules=[str(NOTES)], server_args=["--browsers", "1"]) as server:
        with GenericEnvClient(base_url=server.url).sync() as client:
            first = client.reset(task_name="save-note", seed=0).observation
            assert first["metadata"]["allowed_origins"] == [notes_app.rstrip("/")]
            button = re.search(r"\[(\d+)\] button 'Save'", first["axtree_txt"]).group(1)
            result = client.step({"action_str": f"click('{button}')"})
            assert (result.reward, result.done) == (1.0, True)
            # MiniWoB's pages, served beside it, are told the same
            assert client.reset(task_name="click-test", seed=0).observation["metadata"]["allowed_origins"]


def test_a_page_reaches_the_origin_allowed_and_no_other_port_of_the_same_host():
    browser_setup.prepare()
    allowed, other = OtherOrigin(), OtherOrigin()
    env = BrowserTaskEnvironment(BrowserPool(1, allowed_origins=(task_modules.as_origin(allowed.url),)))
    try:
        env.reset(task_name="click-test", seed=0)
        env.act_with(reach_out(allowed.url))
        env.reset(task_name="click-test", seed=1)
        env.act_with(reach_out(other.url))
    finally:
        env.close()
        allowed.close()
        other.close()
    assert allowed.hits and other.hits == []


@pytest.mark.parametrize(
    "url, origin",
    [
        ("http://127.0.0.1:8321/", "http://127.0.0.1:8321"),
        ("https://staging.example.com", "https://staging.example.com"),
    ],
)
def test_an_allowed_origin_is_a_scheme_a_host_and_a_port(url, origin):
    assert task_modules.as_origin(url) == origin


@pytest.mark.parametrize("url", ["http://127.0.0.1:8321/admin", "file:///etc/passwd", "staging.example.com", "*"])
def test_a_url_that_is_no_origin_is_refused(url):
    with pytest.raises(ValueError, match=re.escape(f"{url!r} is not an origin: http(s)://host[:port], no path")):
        task_modules.as_origin(url)


def test_the_server_refuses_an_allowed_origin_that_is_no_origin_in_one_line():
    url = "http://127.0.0.1:8321/admin"
    server = subprocess.run(
        [sys.executable, "-m", "web_env.server", "--allowed_origins", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert server.returncode == 2 and f"{url!r} is not an origin" in server.stderr.strip().splitlines()[-1]


def test_run_agent_plays_a_goal_of_yours_on_a_page_you_name(notes_app, half_right_model, tmp_path):
    arguments = ("--model", half_right_model, "--url", notes_app, "--goal", "Save the note.", "--max_steps", "2")
    played = run_agent(*arguments, "--output_dir", str(tmp_path))
    assert played.returncode == 0, played.stderr[-3000:]
    assert f"{half_right_model} plays {notes_app}, seed 1000000, at most 2 steps" in played.stdout
    (trace_file,) = (tmp_path / "traces" / "url").glob("*.json")
    trace = json.loads(trace_file.read_text())
    assert f"ended (a URL has no checker) after {len(trace['steps'])} step" in played.stdout
    assert trace["goal"] == "Save the note." and "button 'Save'" in trace["steps"][0]["page"]


@pytest.mark.parametrize(
    "given, error",
    [
        (dict(url="http://127.0.0.1:8321/"), "url and goal go together"),
        (dict(url="file:///etc/passwd", goal="Read it."), "'file://' is not an origin"),
    ],
)
def test_a_url_to_play_is_a_web_page_with_a_goal(given, error):
    with pytest.raises(ValueError, match=re.escape(error)):
        AgentArguments(model="m", **given)
