"""The server's environment in this process, without its HTTP app: browsers as the server runs them, and sessions on
them that close when their `with` block ends. Tests, the restart harness and the reward audit play through these."""

import contextlib

from web_env import task_modules
from web_env.server import browser_setup
from web_env.server.browsers import BrowserPool
from web_env.server.environment import BrowserTaskEnvironment


def browsers(count: int = 1) -> BrowserPool:
    """`count` browsers, as the server runs them."""
    browser_setup.prepare()
    return BrowserPool(count)


def new_session(pool: BrowserPool, **options) -> contextlib.closing[BrowserTaskEnvironment]:
    """A session (its own browser context, `options` as the server's) for the length of a `with` block."""
    return contextlib.closing(BrowserTaskEnvironment(pool, **options))


@contextlib.contextmanager
def sessions_in_this_process(modules: list[str]):
    """The task modules `modules` loaded, and a function that opens a session on one shared browser; every session it
    opened is closed at the end."""
    pool = browsers(1)
    task_modules.load(modules)
    with contextlib.ExitStack() as opened:
        yield lambda: opened.enter_context(new_session(pool))
