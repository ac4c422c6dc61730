"""The environment server under hostile and broken clients: real server processes, real Chromium."""

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from env_client import BrowserGymEnv, LocalEnvServer
from helpers import ROOT, chromium_processes, click_the_button, lines_of, wait_for
from web_env.models import TOKEN_VARIABLE, BrowserGymAction

PWNED = Path("/tmp/browser-rl-pwned")

# (action the model wrote, what the error observation must say)
HOSTILE_ACTIONS = [
    ("", "empty action"),
    ("   \n", "empty action"),
    ("x" * 1_000_000, "action of 1000000 characters refused"),
    ("click('13", "not a single call to an allowed action"),
    ("click(\"13')", "not a single call to an allowed action"),
    (f"__import__('os').system('touch {PWNED}')", "not a single call to an allowed action"),
    (f"exec(\"open('{PWNED}', 'w')\")", "Invalid action type 'exec'"),
    ("goto('file:///etc/passwd')", "Invalid action type 'goto'"),
    ("goto('https://example.com')", "Invalid action type 'goto'"),
    ("new_tab()", "Invalid action type 'new_tab'"),
    ("tab_focus(0)", "Invalid action type 'tab_focus'"),
    ("upload_file('13', '/etc/passwd')", "Invalid action type 'upload_file'"),
    ("send_msg_to_user('hi')", "Invalid action type 'send_msg_to_user'"),
    ("click('13'); click('13')", "not a single call to an allowed action"),
    ("click('13')\nclick('13')", "only single-actions are allowed"),
    ("click('a' * 10)", "not a single call to an allowed action"),
    ("noop(100000000)", "noop may wait at most 10000 ms"),
    ("noop(wait_ms=1e12)", "noop may wait at most 10000 ms"),
    ("fill('13', '\udcff\ud800')", "surrogates not allowed"),  # lone surrogates: text that is not valid UTF-8
    ("click('\x00')", "cannot contain null bytes"),
    # The quote escapes nothing: the whole string reaches Playwright as one argument, which refuses it.
    ("click('13', button='\\'); alert(1); //')", "button: expected one of (left|right|middle)"),
]


@pytest.mark.parametrize("action, error", HOSTILE_ACTIONS, ids=[f"{a[:30]!r}" for a, _ in HOSTILE_ACTIONS])
def test_a_hostile_action_is_an_error_observation_and_the_session_stays_usable(session, env_server, action, error):
    page = session.reset(seed=0).observation.axtree_txt
    result = session.step(BrowserGymAction(action_str=action))
    assert result.observation.last_action_error
    assert error in result.observation.error
    assert (result.reward, result.done) == (0.0, False)
    assert result.observation.url.endswith("click-test.html")
    assert not PWNED.exists()
    solved = session.step(BrowserGymAction(action_str=click_the_button(page)))
    assert (solved.reward, solved.done) == (1.0, True)


@pytest.mark.parametrize(
    "options, error",
    [
        ({"task_name": "no-such-task"}, "unknown task 'no-such-task'"),
        ({"task_name": "../../etc/passwd"}, "unknown task '../../etc/passwd'"),
        ({"seed": -1}, "seed must be an integer from 0 to 4294967295, got -1"),
        ({"seed": 2**64}, "seed must be an integer from 0 to 4294967295"),
        ({"seed": "7"}, "seed must be an integer"),
        ({"seed": 1.5}, "seed must be an integer"),
        ({"settle_ms": 60_000}, "settle_ms must be an integer from 0 to 2000, got 60000"),
        ({"settle_ms": -1}, "settle_ms must be an integer from 0 to 2000"),
        ({"settle_ms": "500"}, "settle_ms must be an integer"),
    ],
)
def test_a_bad_reset_is_a_clear_error_and_the_session_stays_usable(session, options, error):
    with pytest.raises(RuntimeError, match=error):
        session.reset(**options)
    assert session.reset(seed=4294967295).observation.goal == "Click the button."


# (raw WebSocket frame, what the server's error answer must say)
MALFORMED_FRAMES = [
    ("{not json", "Invalid JSON"),
    ("", "Invalid JSON"),
    ('{"type": "step"}', "Invalid message"),
    ('{"type": "step", "data": {"action_str": 5}}', "Invalid message"),
    ('{"type": "step", "data": {}}', "Invalid message"),
    ('{"type": "reset", "data": "seed"}', "Invalid message"),
    ('{"type": "launch_missiles"}', "Unknown message type"),
    ('{"type": "step", "data": {"action_str": "noop()"}}', "call reset before step"),
]


def test_malformed_frames_get_error_answers_and_the_session_stays_usable(env_server):
    async def scenario():
        async with connect(env_server.url.replace("http", "ws") + "/ws") as ws:
            for frame, error in MALFORMED_FRAMES:
                await ws.send(frame)
                answer = json.loads(await ws.recv())
                assert answer["type"] == "error" and error in json.dumps(answer["data"]), (frame, answer)
            await ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
            assert json.loads(await ws.recv())["data"]["observation"]["goal"] == "Click the button."

    asyncio.run(scenario())


@pytest.mark.parametrize("frame", [b"\xff\xfe\x00 not text", "[1, 2, 3]", '"a string"', "null"])
def test_a_frame_that_is_no_message_at_all_ends_only_its_own_session(env_server, session, frame):
    session.reset(seed=0)

    async def send_frame():
        async with connect(env_server.url.replace("http", "ws") + "/ws") as ws:
            await ws.send(frame)
            answer = json.loads(await ws.recv())
            assert answer["type"] == "error" and answer["data"]["code"] == "SESSION_ERROR"
            with pytest.raises(ConnectionClosed):
                await ws.recv()

    asyncio.run(send_frame())
    assert session.step(BrowserGymAction(action_str="noop()")).observation.error == ""


def start_both_browsers(server) -> None:
    """Browsers start with the first session assigned to them; two sessions at once start two. Both resets go at
    once: a session that waited for the other's (a browser starting) would sit idle, past a server's short
    --idle_timeout_s on a busy machine."""

    async def both():
        async with BrowserGymEnv(base_url=server.url) as first, BrowserGymEnv(base_url=server.url) as second:
            await asyncio.gather(first.reset(seed=0), second.reset(seed=0))

    asyncio.run(both())


def test_hostile_sessions_leave_no_browser_processes_behind(env_server):
    start_both_browsers(env_server)
    before = len(chromium_processes(env_server.pid))
    for action, _ in HOSTILE_ACTIONS:
        with BrowserGymEnv(base_url=env_server.url).sync() as client:
            client.reset(seed=0)
            client.step(BrowserGymAction(action_str=action))
    assert wait_for(lambda: len(chromium_processes(env_server.pid)) <= before)


def test_beyond_max_sessions_a_client_gets_a_busy_error():
    with LocalEnvServer(max_sessions=2) as server:
        first, second = BrowserGymEnv(base_url=server.url).sync(), BrowserGymEnv(base_url=server.url).sync()
        with first, second:
            first.reset(seed=0)
            second.reset(seed=0)
            with BrowserGymEnv(base_url=server.url).sync() as third:
                with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
                    third.reset(seed=0)
        with BrowserGymEnv(base_url=server.url).sync() as later:  # closed sessions free their places
            assert later.reset(seed=0).observation.goal == "Click the button."


def test_an_idle_session_is_closed_with_its_browser_context():
    with LocalEnvServer(max_sessions=2, server_args=["--idle_timeout_s", "1"]) as server:
        with BrowserGymEnv(base_url=server.url).sync() as client:
            client.reset(seed=0)
            with_session = len(chromium_processes(server.pid))
            # Idle from here on; the server looks for idle sessions every 5 s.
            assert wait_for(lambda: len(chromium_processes(server.pid)) < with_session, timeout_s=20)
            closed = "closed: idle past the server's --idle_timeout_s of 1 s. Connect again"
            with pytest.raises(RuntimeError, match=closed):
                client.step(BrowserGymAction(action_str="noop()"))


def test_a_server_this_process_starts_never_closes_its_sessions_as_idle(capfd):
    # Its sessions are this process's alone, whose policy may think longer than any timeout between two actions (a
    # real model's turn on a CPU took over the default 600 s); a server_args timeout still applies, as above.
    with LocalEnvServer(max_sessions=1, server_args=["--browsers", "1"]):
        pass
    assert "idle ones never closed" in capfd.readouterr().err


@pytest.mark.slow
def test_clients_that_vanish_without_closing_leave_no_browser_processes():
    code = (
        "import asyncio, sys\n"
        "from env_client import BrowserGymEnv\n"
        "async def main():\n"
        "    clients = [BrowserGymEnv(base_url=sys.argv[1]) for _ in range(20)]\n"
        "    await asyncio.gather(*(c.reset(seed=i) for i, c in enumerate(clients)))\n"
        "    print('ready', flush=True)\n"
        "    await asyncio.sleep(600)\n"
        "asyncio.run(main())\n"
    )
    # Their pages are kept for the next sessions no longer than an idle session lives: a second here.
    with LocalEnvServer(max_sessions=20, server_args=["--browsers", "2", "--idle_timeout_s", "1"]) as server:
        start_both_browsers(server)
        before = len(chromium_processes(server.pid))
        clients = subprocess.Popen(
            [sys.executable, "-c", code, server.url], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        assert next(lines_of(clients, clients.stdout, timeout_s=120)).strip() == "ready"
        assert len(chromium_processes(server.pid)) > before  # the 20 sessions' pages have renderers
        clients.kill()  # no close frames, no FIN handshake of ours: the sockets just die
        clients.wait()
        assert wait_for(lambda: len(chromium_processes(server.pid)) <= before), chromium_processes(server.pid)
        with BrowserGymEnv(base_url=server.url).sync() as client:  # and all 20 places are free again
            assert client.reset(seed=0).observation.goal == "Click the button."


def test_beyond_loopback_the_token_is_required(monkeypatch):
    monkeypatch.setenv(TOKEN_VARIABLE, "s3cret-token")
    with LocalEnvServer(max_sessions=2, server_args=["--host", "0.0.0.0"]) as server:
        monkeypatch.delenv(TOKEN_VARIABLE)
        for path in ("/schema", "/cpu"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{server.url}{path}")
            assert refused.value.code == 401
        for token in (None, "wrong-token"):
            with pytest.raises(ConnectionError) as refused:
                with BrowserGymEnv(base_url=server.url, token=token).sync() as client:
                    client.reset(seed=0)
            assert isinstance(refused.value.__cause__, InvalidStatus)
        with BrowserGymEnv(base_url=server.url, token="s3cret-token").sync() as client:
            assert client.reset(seed=0).observation.goal == "Click the button."
        with urllib.request.urlopen(f"{server.url}/health") as health:  # says only that it is up
            assert health.status == 200


def test_a_server_beyond_loopback_without_a_token_refuses_to_start(monkeypatch):
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    result = subprocess.run(
        [sys.executable, "-m", "web_env.server", "--host", "0.0.0.0", "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "refusing to listen on 0.0.0.0 without a token" in result.stderr
    assert TOKEN_VARIABLE in result.stderr
