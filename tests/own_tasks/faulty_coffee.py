"""The tutorial's coffee task broken in each way the task checker must catch (tests/test_own_tasks.py), and one
variant that keeps state in the browser, which the server must clear between episodes."""

import random
import sys
import urllib.request
from pathlib import Path

from browsergym.core.registration import register_task

from web_env.task_app import serve_app

sys.path.insert(0, str(Path(__file__).parent / "coffee"))
from coffee_task import CoffeeShop, OrderCoffee


class IgnoresSeed(OrderCoffee):
    def __init__(self, seed):
        super().__init__(seed=0)


UNSEEDED = random.Random()


class DrawsAnew(OrderCoffee):
    """Draws its order from a generator of its own, not from the seed: the same seed gives another order each time."""

    def __init__(self, seed):
        super().__init__(seed=UNSEEDED.randrange(2**31))


class ShowsTheLastOrder(OrderCoffee):
    """Shows the last order anyone placed, kept in the task's module: the next episode's page is not a fresh one."""

    last = None

    def setup(self, page):
        goal, info = super().setup(page)
        if ShowsTheLastOrder.last:
            page.evaluate("last => document.body.append('Your last order: ' + last)", ShowsTheLastOrder.last)
        return goal, info

    def validate(self, page, chat_messages):
        if self.shop.orders:
            ShowsTheLastOrder.last = self.shop.orders[-1]["name"]
        return super().validate(page, chat_messages)


class ForwardsRequests(OrderCoffee):
    """Answers every request of its page that is not its app's by fetching it itself: a way out of the sandbox."""

    def setup(self, page):
        goal, info = super().setup(page)
        page.context.route(lambda url: ".localhost/" not in url, forward)
        return goal, info


def forward(route) -> None:
    with urllib.request.urlopen(route.request.url, timeout=2) as response:
        route.fulfill(status=response.status, body=response.read())


class WrongOrderGoesOn(OrderCoffee):
    """A wrong order leaves the episode running, unpaid, where it should end it."""

    def validate(self, page, chat_messages):
        reward, done, message, info = super().validate(page, chat_messages)
        return reward, done and reward > 0, message, info


class SetupRaises(OrderCoffee):
    def setup(self, page):
        raise FileNotFoundError("app/menu.json")


class ValidateRaises(OrderCoffee):
    def validate(self, page, chat_messages):
        if self.shop.orders:
            raise KeyError("size")
        return super().validate(page, chat_messages)


class PaysAnyOrder(OrderCoffee):
    def validate(self, page, chat_messages):
        return float(bool(self.shop.orders)), bool(self.shop.orders), "", {}


class BrokenShop(CoffeeShop):
    def __call__(self, environ, start_response):
        raise ZeroDivisionError("division by zero")


class BackendRaises(OrderCoffee):
    def setup(self, page):
        goal, info = super().setup(page)
        serve_app(page, Path(sys.modules[OrderCoffee.__module__].__file__).parent / "app", BrokenShop())
        return goal, info


SHARED = CoffeeShop()  # one backend for every session and episode: what a shared database does


class SharesItsBackend(OrderCoffee):
    def setup(self, page):
        goal, info = super().setup(page)
        self.shop = SHARED
        serve_app(page, Path(sys.modules[OrderCoffee.__module__].__file__).parent / "app", SHARED)
        return goal, info


class RemembersInTheBrowser(OrderCoffee):
    """Shows the last order kept in the page's storage: right, as long as the server clears it between episodes."""

    def setup(self, page):
        goal, info = super().setup(page)
        page.evaluate(
            "() => { const last = localStorage.getItem('last');"
            " if (last) document.body.append('Your last order: ' + last);"
            " document.querySelector('form').addEventListener('submit', () => localStorage.setItem('last', 'x')); }"
        )
        return goal, info


for name, task in {
    "coffee-ignores-seed": IgnoresSeed,
    "coffee-draws-anew": DrawsAnew,
    "coffee-shows-the-last-order": ShowsTheLastOrder,
    "coffee-forwards-requests": ForwardsRequests,
    "coffee-wrong-order-goes-on": WrongOrderGoesOn,
    "coffee-setup-raises": SetupRaises,
    "coffee-backend-raises": BackendRaises,
    "coffee-validate-raises": ValidateRaises,
    "coffee-pays-any-order": PaysAnyOrder,
    "coffee-shares-its-backend": SharesItsBackend,
    "coffee-remembers-in-the-browser": RemembersInTheBrowser,
}.items():
    register_task(name, task)
