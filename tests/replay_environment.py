"""The recorded episodes (bench/replay/episodes.jsonl, bench/record_replay.py) served as an OpenEnv environment,
where no browser runs: a stand-in for the server on a GPU machine, which bench/gpu_step.py trains against and
tests/test_gpu_step.py checks. A reset gives the recorded first page of (task, seed modulo the seeds recorded), the
recorded right action solves it, and any other action gives the page recorded after a wrong one."""

import json
import threading
from pathlib import Path

import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import ConcurrencyConfig

from env_client import free_port
from web_env.models import BrowserGymAction, BrowserGymObservation, BrowserGymState

RECORDED = Path(__file__).resolve().parents[1] / "bench" / "replay" / "episodes.jsonl"


class ReplayEnvironment(Environment[BrowserGymAction, BrowserGymObservation, BrowserGymState]):
    """The recorded episodes as an OpenEnv environment: a reset gives the recorded first page of (task, seed modulo
    the seeds recorded), the recorded right action solves it, and any other action gives the page recorded after a
    wrong one."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, recorded: dict):
        super().__init__()
        self._recorded = recorded
        self._episode = None
        self._state = BrowserGymState()

    def reset(self, seed=None, episode_id=None, task_name=None, **options) -> BrowserGymObservation:
        seeds = self._recorded[task_name]
        self._episode = seeds[(seed or 0) % len(seeds)]
        self._state = BrowserGymState(task_name=task_name, task_id=str(seed), goal=self._episode["goal"])
        return BrowserGymObservation(goal=self._episode["goal"], axtree_txt=self._episode["page"], done=False)

    def step(self, action: BrowserGymAction, timeout_s=None, **kwargs) -> BrowserGymObservation:
        self._state.step_count += 1
        after = self._episode["after_right" if action.action_str == self._episode["right"] else "after_wrong"]
        return BrowserGymObservation(
            goal=self._episode["goal"],
            axtree_txt=after["page"],
            error=after["error"],
            done=after["done"],
            reward=after["reward"],
        )

    @property
    def state(self) -> BrowserGymState:
        return self._state


def serve_replay(max_sessions: int) -> str:
    """The replay environment behind OpenEnv's server, on a thread of this process; its URL."""
    recorded = {}
    for line in RECORDED.read_text().splitlines():
        row = json.loads(line)
        recorded.setdefault(row["task"], []).append(row)
    app = create_app(
        lambda: ReplayEnvironment(recorded),
        BrowserGymAction,
        BrowserGymObservation,
        env_name="browsergym_replay",
        state_cls=BrowserGymState,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions),
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        threading.Event().wait(0.05)
    return f"http://127.0.0.1:{port}"
