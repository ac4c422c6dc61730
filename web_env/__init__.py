"""The environment: BrowserGym's web tasks served as an OpenEnv environment, in OpenEnv's shape.

- `models.py`: what crosses the wire (OpenEnv's action, observation and state types); both sides import it.
- `actions.py`: the action contract: which actions a policy may take, and how model text becomes one.
- `task_modules.py`: your own tasks' modules, loaded on both sides (the trainer to know their names, the server to run
  them); `task_app.py`: what a task of yours calls in its setup to serve its app from its folder.
- `server/`: what runs beside the browsers, in its own process or container (`python -m web_env.server`); nothing
  outside it imports it, so a trainer never loads browser code.

The package installs on its own (its pyproject.toml), which is what the container does.
"""
