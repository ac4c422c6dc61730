import pytest
from transformers import AutoTokenizer

from env_client import BrowserGymEnv, LocalEnvServer
from tiny_lfm2 import build_tiny_lfm2


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return str(build_tiny_lfm2(tmp_path_factory.mktemp("tiny-lfm2")))


@pytest.fixture(scope="session")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="session")
def env_server():
    """One real env_server.py process with real Chromium, shared by the tests that need a browser."""
    with LocalEnvServer("click-test", max_sessions=16, server_args=["--browsers", "2"]) as server:
        yield server


@pytest.fixture
def session(env_server):
    """A client session on the shared server, closed after the test."""
    with BrowserGymEnv(base_url=env_server.url).sync() as client:
        yield client
