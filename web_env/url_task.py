"""A page you name, as a task: `run_agent.py --url URL --goal GOAL` plays your goal on it.

The URL and the goal come from the environment of the server's process (run_agent.py sets them for the server it
starts). The URL's origin is the only network its pages reach (ALLOWED_ORIGINS, web_env.task_modules). It has no
checker, so an episode on it ends at its step limit, never solved: to train on your app, write a task module with a
`validate` (docs/your_own_task.md).
"""

import os

from browsergym.core.registration import register_task
from browsergym.core.task import AbstractBrowserTask

from web_env.task_modules import origin_of

TASK_ID = "url"
URL = os.environ.get("BROWSER_RL_URL", "http://127.0.0.1:8000/")
ALLOWED_ORIGINS = [origin_of(URL)]


class GoalOnAPage(AbstractBrowserTask):
    @classmethod
    def get_task_id(cls):
        return TASK_ID

    def setup(self, page):
        page.goto(URL)
        return os.environ.get("BROWSER_RL_GOAL", ""), {}

    def validate(self, page, chat_messages):
        return 0.0, False, "", {}


register_task(TASK_ID, GoalOnAPage)
