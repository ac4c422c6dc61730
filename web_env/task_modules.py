"""Your own tasks: the Python modules that register them with BrowserGym, loaded by name or path.

A task is BrowserGym's own contract: a subclass of `browsergym.core.task.AbstractBrowserTask` (seeded `__init__`,
`setup(page)` giving the goal, `validate(page, chat_messages)` giving the reward, optional `teardown` and `cheat`),
registered with `browsergym.core.registration.register_task(id, cls)`. A module that does so at import is a task
module; `load` imports it, and the tasks it registered are played by their `id`, as MiniWoB's are by name. An episode
is solved when `validate` gives a reward of 1.0 with done (rewards.solved).

Both sides load the same modules: the trainer to know the tasks' names, the server to run them. A server that a
command starts (env_client.LocalEnvServer, modal_app's sandboxes) is given the command's own `task_modules`.
docs/your_own_task.md is the tutorial.
"""

import importlib
import importlib.util
import os
import sys
from pathlib import Path

import gymnasium as gym

from web_env.models import MINIWOB_TASKS

REGISTRY_PREFIX = "browsergym/"  # register_task(id, ...) registers the gym id browsergym/<id>

_loaded: dict[str, tuple[str, ...]] = {}  # module as named -> the tasks it registered, in this process


def load(modules: list[str]) -> tuple[str, ...]:
    """Imports each task module (a module name importable from the current directory, or a path to a .py file) once
    in this process, and returns the ids of the tasks they registered."""
    names = [str(Path(module).resolve()) if module.endswith(".py") else module for module in modules]
    for name in names:
        if name not in _loaded:
            _loaded[name] = _import_registering(name)
    return tuple(task for name in names for task in _loaded[name])


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
        _import(module)
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
    return tasks


def _import(module: str) -> None:
    if module.endswith(".py"):
        path = Path(module).resolve()
        if not path.is_file():
            raise ValueError(f"task module {module!r}: no such file")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = loaded
        spec.loader.exec_module(loaded)
    else:
        if os.getcwd() not in sys.path:  # as `python -m` finds modules: from the current directory
            sys.path.insert(0, os.getcwd())
        importlib.import_module(module)
