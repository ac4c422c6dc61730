"""Save a note: a task on an app that already runs in a process of its own, as a team's app runs on its staging host
(tests/test_allowed_origins.py stands it up on a loopback port). Its origin is allowed; every other stays closed."""

import os

from browsergym.core.registration import register_task
from browsergym.core.task import AbstractBrowserTask

APP_URL = os.environ.get("NOTES_APP_URL", "http://127.0.0.1:8321/")
ALLOWED_ORIGINS = [APP_URL]


class SaveNote(AbstractBrowserTask):
    @classmethod
    def get_task_id(cls):
        return "save-note"

    def setup(self, page):
        page.goto(APP_URL)
        return "Save the note.", {}

    def validate(self, page, chat_messages):
        saved = page.evaluate("document.body.dataset.saved === 'yes'")
        return float(saved), saved, "", {}


register_task("save-note", SaveNote)
