"""The client side of the environment: where the token comes from, a server whose CPU cannot be read, a local server
stopped while it restarts, and one that cannot start."""

import http.server
import logging
import re
import socket
import threading

import pytest

from browser_rl.command_line import run_command
from browser_rl.servers import ServerPool
from env_client import BrowserGymEnv, LocalEnvServer, client_token, free_port
from helpers import ROOT, alive, wait_for
from web_env.models import TOKEN_VARIABLE


@pytest.fixture
def server_without_cpu():
    """An HTTP server that answers 404 to everything, as a server without GET /cpu does."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    server.RequestHandlerClass.log_message = lambda *args: None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/no-such-directory"
    server.shutdown()


@pytest.mark.parametrize("reason", ["HTTP 404", "nothing listens"])
def test_a_server_whose_cpu_cannot_be_read_is_left_out_and_the_log_says_why_once(server_without_cpu, reason, caplog):
    url = server_without_cpu if reason == "HTTP 404" else f"http://127.0.0.1:{free_port()}"
    pool = ServerPool([url])
    with caplog.at_level(logging.WARNING, logger="env_client"):
        assert pool.cpu_readings() == {url: None}
        assert pool.cpu_readings() == {url: None}
    (warning,) = [record.getMessage() for record in caplog.records]
    assert warning.startswith(f"the environment's CPU per episode leaves out {url}: GET /cpu ")
    assert ("answered HTTP 404" in warning) == (reason == "HTTP 404")


def test_the_token_comes_from_the_argument_else_the_environment(monkeypatch):
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    assert client_token() is None and client_token("given") == "given"
    monkeypatch.setenv(TOKEN_VARIABLE, "from-the-environment")
    assert client_token() == "from-the-environment" and client_token("given") == "given"
    client = BrowserGymEnv("http://127.0.0.1:1")
    assert client._headers["Authorization"] == "Bearer from-the-environment"


def test_the_client_side_reads_the_token_variable_in_one_place():
    readers = [
        (path.name, line.strip())
        for path in ROOT.rglob("*.py")
        if not {".venv", "tests"} & set(path.relative_to(ROOT).parts)
        and path.parts[-3:-1] != ("web_env", "server")  # the server's own token
        for line in path.read_text().splitlines()
        if re.search(r"environ(\.get\(|\[)TOKEN_VARIABLE", line)
    ]
    assert readers == [("env_client.py", "return token or os.environ.get(TOKEN_VARIABLE) or None")]


def test_a_local_server_stopped_while_it_restarts_ends_the_restart_quietly_and_without_a_server():
    """As when a run ends while a failed server restarts in the background (ServerPool): the restart must neither
    raise in its thread nor leave a server that nobody stops."""
    server = LocalEnvServer(max_sessions=1)
    server.start()
    first, raised = server.pid, []

    def restart() -> None:
        try:
            server.restart()
        except Exception as error:
            raised.append(error)

    restarting = threading.Thread(target=restart)
    restarting.start()
    assert wait_for(lambda: server.pid != first, timeout_s=60)  # the new server is starting
    server.stop()
    restarting.join(timeout=60)
    assert not restarting.is_alive() and raised == []
    assert not alive(first) and not alive(server.pid)

    server.restart()  # after stop(), a restart starts nothing
    assert not alive(server.pid)


def test_a_local_server_that_cannot_start_stops_the_command_with_one_line_and_exit_1(caplog):
    server = LocalEnvServer(max_sessions=1)
    with socket.socket() as taken:  # another program holds the port the server was given
        taken.bind(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
        taken.listen()
        with pytest.raises(SystemExit) as exited, caplog.at_level(logging.ERROR):
            run_command("train.py", server.start)
    assert exited.value.code == 1
    (line,) = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    named = re.escape(f"the environment server at {server.url}")
    assert re.fullmatch(rf"train\.py: stopping: {named} \(pid \d+\) exited with status \d+ as it started", line), line
