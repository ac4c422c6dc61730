"""The environment: BrowserGym's web tasks served as an OpenEnv environment, in OpenEnv's shape.

- `models.py`: what crosses the wire (OpenEnv's action, observation and state types); both sides import it.
- `actions.py`: the action contract: which actions a policy may take, and how model text becomes one.
- `task_modules.py`: your own tasks' modules, loaded on both sides (the trainer to know their names, the server to run
  them); `task_app.py`: what a task of yours calls in its setup to serve its app from its folder.
- `server/`: what runs beside the browsers, in its own process or container (`python -m web_env.server`); nothing
  outside it imports it, so a trainer never loads browser code.

The package installs on its own (its pyproject.toml), which is what the container does.
"""

import sys

# OpenEnv's package imports its Gradio web interface whenever Gradio is installed (one of OpenEnv's requirements):
# 3 to 5 s of every process that imports OpenEnv (a run, an evaluation, a server start), for a page neither side of
# this environment mounts. OpenEnv is imported here first, with Gradio's import made to fail as it would without Gradio,
# which OpenEnv allows for (pyproject.toml's private seams); the entry is taken out again at once, so that anything
# imported later (a logger's dashboard) gets Gradio as usual.
if "gradio" not in sys.modules:
    sys.modules["gradio"] = None
    try:
        import openenv.core  # noqa: F401
    finally:
        del sys.modules["gradio"]
