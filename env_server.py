"""Serves MiniWoB++ tasks from BrowserGym as an OpenEnv environment (FastAPI + WebSocket).

    python env_server.py --port 8000            # loopback only; GET /health answers when ready

Wire-compatible with OpenEnv's public BrowserGym environment: the action is {"action_str": "click('13')"},
and observations carry goal, axtree_txt, pruned_html, text, url, error, last_action_error, reward, done.
Each WebSocket session owns one BrowserGym environment; `reset` takes `task_name` and `seed`.
"""

import argparse
import functools
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Optional
from uuid import uuid4

import browsergym.miniwob  # noqa: F401  (registers the browsergym/miniwob.* environments)
import gymnasium as gym
import miniwob
import uvicorn
from browsergym.utils.obs import flatten_axtree_to_str, flatten_dom_to_str, prune_html
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from playwright.sync_api import sync_playwright
from pydantic import Field

from actions import ACTION_SET

log = logging.getLogger("env_server")

DEFAULT_TASK = "click-test"


class BrowserGymAction(Action):
    action_str: str = Field(..., description="One BrowserGym action call, e.g. click('13')")


class BrowserGymObservation(Observation):
    text: str = Field(default="", description="Text view of the page (the accessibility tree)")
    url: str = Field(default="")
    screenshot: Optional[list[list[list[int]]]] = Field(default=None, description="RGB pixels, only on request")
    goal: str = Field(default="")
    axtree_txt: str = Field(default="")
    pruned_html: str = Field(default="")
    error: str = Field(default="", description="Why the last action failed, empty if it did not")
    last_action_error: bool = Field(default=False)


class BrowserGymState(State):
    benchmark: str = Field(default="miniwob")
    task_name: str = Field(default="")
    task_id: Optional[str] = Field(default=None)
    goal: str = Field(default="")
    current_url: str = Field(default="")
    max_steps: Optional[int] = Field(default=None)
    cum_reward: float = Field(default=0.0)


def miniwob_tasks() -> list[str]:
    prefix = "browsergym/miniwob."
    return sorted(name[len(prefix) :] for name in gym.envs.registry if name.startswith(prefix))


class MiniWoBEnvironment(Environment[BrowserGymAction, BrowserGymObservation, BrowserGymState]):
    SUPPORTS_CONCURRENT_SESSIONS = True
    # BrowserGym drives every browser through one global sync Playwright instance, which only works
    # from the thread that started it; OpenEnv then runs all sessions on one shared thread.
    REQUIRES_SINGLE_THREAD_EXECUTOR = True

    def __init__(self, default_task: str = DEFAULT_TASK, screenshots: bool = False):
        super().__init__()
        self._default_task = default_task
        self._screenshots = screenshots
        self._gym_env = None
        self._state = BrowserGymState()

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        task_name: Optional[str] = None,
        screenshot: Optional[bool] = None,
    ) -> BrowserGymObservation:
        task_name = task_name or self._default_task
        if self._gym_env is None or task_name != self._state.task_name:
            self._open_task(task_name)
        if screenshot is not None:
            self._screenshots = screenshot
        obs, _info = self._gym_env.reset(seed=seed)
        self._state = BrowserGymState(
            episode_id=episode_id or str(uuid4()), task_name=task_name, task_id=str(seed), goal=obs["goal"]
        )
        return self._observation(obs, reward=0.0, done=False)

    def step(self, action: BrowserGymAction, timeout_s: Optional[float] = None, **kwargs: Any) -> BrowserGymObservation:
        if self._gym_env is None:
            raise RuntimeError("call reset before step")
        # A malformed or disallowed action does not raise: BrowserGym reports it in last_action_error.
        obs, reward, terminated, truncated, _info = self._gym_env.step(action.action_str)
        self._state.step_count += 1
        self._state.cum_reward += float(reward)
        return self._observation(obs, reward=float(reward), done=bool(terminated or truncated))

    @property
    def state(self) -> BrowserGymState:
        return self._state

    def close(self) -> None:
        if self._gym_env is not None:
            self._gym_env.close()
            self._gym_env = None

    def _open_task(self, task_name: str) -> None:
        env_id = f"browsergym/miniwob.{task_name}"
        if env_id not in gym.envs.registry:
            examples = ", ".join(miniwob_tasks()[:5])
            raise ValueError(f"unknown MiniWoB task {task_name!r} (known tasks include {examples}, ...)")
        self.close()
        self._gym_env = gym.make(env_id, headless=True, action_mapping=ACTION_SET.to_python_code)

    def _observation(self, obs: dict, reward: float, done: bool) -> BrowserGymObservation:
        axtree_txt = flatten_axtree_to_str(obs["axtree_object"])
        self._state.current_url = obs["url"]
        return BrowserGymObservation(
            text=axtree_txt,
            url=obs["url"],
            screenshot=obs["screenshot"].tolist() if self._screenshots else None,
            goal=obs["goal"],
            axtree_txt=axtree_txt,
            pruned_html=prune_html(flatten_dom_to_str(obs["dom_object"])),
            error=obs["last_action_error"],
            last_action_error=bool(obs["last_action_error"]),
            reward=reward,
            done=done,
            metadata={"task_name": self._state.task_name, "step": self._state.step_count},
        )


def use_packaged_miniwob_pages() -> None:
    """Serve task pages straight from the `miniwob` package unless MINIWOB_URL points elsewhere."""
    pages = Path(miniwob.__file__).parent / "html" / "miniwob"
    os.environ.setdefault("MINIWOB_URL", pages.as_uri() + "/")


def ensure_chromium() -> None:
    """Point Playwright at the system Chromium when Playwright's own build is not installed.

    Playwright looks for its browser at a fixed path under PLAYWRIGHT_BROWSERS_PATH; a link there to the
    system Chromium serves every launch, including BrowserGym's, which take no executable option.
    """
    with sync_playwright() as pw:
        expected = Path(pw.chromium.executable_path)
    if expected.exists():
        return
    system_chromium = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    if system_chromium is None:
        raise SystemExit(
            f"No Chromium found: Playwright's build is missing ({expected}) and none is on PATH. "
            "Run `playwright install chromium` or install your system's chromium package."
        )
    browsers_root = next(p for p in expected.parents if p.name.startswith("chromium-")).parent
    linked_root = Path.home() / ".cache" / "browser-rl" / "playwright"
    link = linked_root / expected.relative_to(browsers_root)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(system_chromium)
    os.environ["PLAYWRIGHT_BROWSERS_PATH"] = str(linked_root)
    log.warning("Playwright's Chromium is not installed; using the system Chromium %s (linked at %s)", system_chromium, link)


def build_app(default_task: str = DEFAULT_TASK, max_sessions: int = 16, screenshots: bool = False):
    return create_app(
        # A partial, not a lambda: OpenEnv reads REQUIRES_SINGLE_THREAD_EXECUTOR through it.
        functools.partial(MiniWoBEnvironment, default_task=default_task, screenshots=screenshots),
        BrowserGymAction,
        BrowserGymObservation,
        env_name="browsergym_miniwob",
        max_concurrent_envs=max_sessions,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--task", default=os.environ.get("BROWSERGYM_TASK_NAME", DEFAULT_TASK), help="default task")
    parser.add_argument("--max-sessions", type=int, default=16, help="concurrent WebSocket sessions")
    parser.add_argument("--screenshots", action="store_true", help="include screenshots in every observation")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    use_packaged_miniwob_pages()
    ensure_chromium()
    if args.task not in miniwob_tasks():
        parser.error(f"unknown MiniWoB task {args.task!r}")
    app = build_app(args.task, args.max_sessions, args.screenshots)
    log.info(
        "serving MiniWoB (default task %s) on http://%s:%d, up to %d sessions", args.task, args.host, args.port, args.max_sessions
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
