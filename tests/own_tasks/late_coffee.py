"""The tutorial's coffee task with an app that answers an order after the deadline of Playwright's waits in the
episode's browser context, as an app's answer comes late on a busy machine (tests/test_own_tasks.py)."""

import sys
import time
from pathlib import Path

from browsergym.core.registration import register_task

from web_env.task_app import serve_app

sys.path.insert(0, str(Path(__file__).parent / "coffee"))
from coffee_task import CoffeeShop, OrderCoffee

DEADLINE_MS = 200  # Playwright's default for every wait in the episode's context (BrowserGym's `task.timeout`)
ANSWER_AFTER_S = 1.0  # five times that


class LateShop(CoffeeShop):
    def __call__(self, environ, start_response):
        if environ["REQUEST_METHOD"] == "POST":
            time.sleep(ANSWER_AFTER_S)
        return super().__call__(environ, start_response)


class AnswersLate(OrderCoffee):
    def __init__(self, seed):
        super().__init__(seed)
        self.timeout = DEADLINE_MS

    def setup(self, page):
        self.shop = LateShop()
        url = serve_app(page, Path(sys.modules[OrderCoffee.__module__].__file__).parent / "app", backend=self.shop)
        page.goto(url + "index.html", timeout=0)  # the page comes whenever it does: only the order's answer is late
        order = self.order
        return f"Order a {order['size']} {order['drink']} for {order['name']}.", {}


register_task("coffee-answers-late", AnswersLate)
