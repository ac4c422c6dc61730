"""What crosses the wire between the environment server (web_env.server) and its clients.

OpenEnv's action, observation and state types for BrowserGym (the same fields as OpenEnv's public BrowserGym
environment, so either side can talk to the other's counterpart), the variable that holds the server's
token, and the names of the MiniWoB tasks a server can reset to. Server, client, trainer, evaluation and tests
all import this module; it imports neither side, so a trainer that talks to a remote server never loads the
server's browsers.
"""

from browsergym.miniwob import ALL_MINIWOB_TASKS
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

TOKEN_VARIABLE = "BROWSER_RL_ENV_TOKEN"
DEFAULT_TASK = "click-test"
MAX_SEED = 2**32 - 1  # MiniWoB seeds numpy's RandomState
# A session's wait before each observation holds its browser's thread, which other sessions share: bounded.
MAX_SETTLE_MS = 2000


def miniwob_name(browsergym_id: str) -> str:
    """The name a reset takes for a task BrowserGym registers as "miniwob.NAME" (its ids, benchmarks, metadata)."""
    return browsergym_id.removeprefix("miniwob.")


# Every MiniWoB task BrowserGym registers (and scores), by the name a reset takes: click-test, enter-text, ...
MINIWOB_TASKS: tuple[str, ...] = tuple(sorted(miniwob_name(task.get_task_id()) for task in ALL_MINIWOB_TASKS))


class BrowserGymAction(Action):
    action_str: str = Field(..., description="One BrowserGym action call, e.g. click('13')")


class BrowserGymObservation(Observation):
    text: str = Field(default="", description="Text view of the page (the accessibility tree)")
    url: str = Field(default="")
    screenshot: list[list[list[int]]] | None = Field(default=None, description="RGB pixels, only on request")
    goal: str = Field(default="")
    axtree_txt: str = Field(default="")
    pruned_html: str = Field(default="")
    error: str = Field(default="", description="Why the last action failed, empty if it did not")
    last_action_error: bool = Field(default=False)
    page_image: str | None = Field(
        default=None, description="The page as the policy read it, a base64 JPEG: only in an episode reset with trace"
    )
    action_box: list[float] | None = Field(
        default=None,
        description="[x, y, width, height] of the element the last action acted on, in the page before it (the last "
        "observation's page_image), in CSS pixels: only in a traced episode, for an action on an element",
    )


class BrowserGymState(State):
    benchmark: str = Field(default="miniwob")
    task_name: str = Field(default="")
    task_id: str | None = Field(default=None)
    goal: str = Field(default="")
    current_url: str = Field(default="")
    max_steps: int | None = Field(default=None)
    cum_reward: float = Field(default=0.0)
