"""Your own tasks: the Python modules that register them with BrowserGym, loaded by name or path.

A task is BrowserGym's own contract: a subclass of `browsergym.core.task.AbstractBrowserTask` (seeded `__init__`,
`setup(page)` giving the goal, `validate(page, chat_messages)` giving the reward, optional `teardown` and `cheat`),
registered with `browsergym.core.registration.register_task(id, cls)`. A module that does so at import is a task
module; `load` imports it, and the tasks it registered are played by their `id`, as MiniWoB's are by name. An episode
is solved when `validate` gives a reward of 1.0 with done (rewards.solved). A module's `ALLOWED_ORIGINS` lists the
origins (`scheme://host[:port]`) of an app that runs elsewhere, the only network its pages reach.

Both sides load the same modules: the trainer to know the tasks' names, the server to run them. A server that a
command starts (env_client.LocalEnvServer, modal_app's sandboxes) is given the command's own `task_modules`.
docs/your_own_task.md is the tutorial.
"""

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import gymnasium as gym

from web_env.models import MINIWOB_TASKS

REGISTRY_PREFIX = "browsergym/"  # register_task(id, ...) registers the gym id browsergym/<id>

_loaded: dict[str, tuple[str, ...]] = {}  # module as named -> the tasks it registered, in this process
_origins: dict[str, tuple[str, ...]] = {}  # module as named -> the origins its pages may reach (ALLOWED_ORIGINS)


def load(modules: list[str]) -> tuple[str, ...]:
    """Imports each task module (a module name importable from the current directory, or a path to a .py file) once
    in this process, and returns the ids of the tasks they registered."""
    names = [str(Path(module).resolve()) if module.endswith(".py") else module for module in modules]
    for name in names:
        if name not in _loaded:
            _loaded[name] = _import_registering(name)
    return tuple(task for name in names for task in _loaded[name])


def allowed_origins() -> tuple[str, ...]:
    """The origins the loaded modules' pages may reach, beside their own (each module's ALLOWED_ORIGINS)."""
    return tuple(dict.fromkeys(origin for origins in _origins.values() for origin in origins))


def as_origin(url: str) -> str:
    """`url` as an origin, scheme://host[:port]; a ValueError for anything else (a path, a query, another scheme)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ValueError(f"{url!r} is not an origin: http(s)://host[:port], no path")
    return origin_of(url)


def origin_of(url: str) -> str:
    """The origin of a page's URL: scheme://host[:port], its path and query left out."""
    return "{0.scheme}://{0.netloc}".format(urlsplit(url))


def own_tasks() -> tuple[str, ...]:
    """The ids of every task the loaded modules registered."""
    return tuple(task for tasks in _loaded.values() for task in tasks)


def task_maker(task: str):
    """BrowserGym's maker of `task`'s instances (`maker(seed=...)`), with the arguments it was registered with."""
    browser_env = gym.make(REGISTRY_PREFIX + task).unwrapped  # a BrowserEnv: its browser starts only at reset
    return lambda seed: browser_env.task_entrypoint(seed=seed, **browser_env.task_kwargs)


def _import_registering(module: str) -> tuple[str, ...]:
    before = dict(gym.envs.registry)
    try:
        imported = _import(module)
    except ModuleNotFoundError as error:
        if error.name != module:  # the module is there, and one it imports is missing
            raise
        raise ValueError(
            f"task module {module!r} not found: name a module importable from {os.getcwd()} or a .py file's path"
        ) from None
    # New ids, and ids registered anew (a module loaded again from another path)
    changed = [key for key, spec in gym.envs.registry.items() if before.get(key) is not spec]
    registered = sorted(key.removeprefix(REGISTRY_PREFIX) for key in changed)
    tasks = tuple(key for key in registered if not key.startswith("miniwob."))
    if not tasks:
        raise ValueError(f"task module {module!r} registered no task (browsergym.core.registration.register_task)")
    if clashes := set(tasks) & set(MINIWOB_TASKS):
        raise ValueError(f"task module {module!r} registered {sorted(clashes)}, which MiniWoB's tasks are named")
    try:
        _origins[module] = tuple(as_origin(url) for url in getattr(imported, "ALLOWED_ORIGINS", ()))
    except ValueError as error:
        raise ValueError(f"task module {module!r}: ALLOWED_ORIGINS: {error}") from None
    return tasks


def _import(module: str):
    if module.endswith(".py"):
        path = Path(module).resolve()
        if not path.is_file():
            raise ValueError(f"task module {module!r}: no such file")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = loaded
        spec.loader.exec_module(loaded)
        return loaded
    if os.getcwd() not in sys.path:  # as `python -m` finds modules: from the current directory
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(module)
