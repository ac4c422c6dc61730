"""The tutorial's coffee task broken in each way the task checker must catch (tests/test_own_tasks.py), and one
variant that keeps state in the browser, which the server must clear between episodes."""

import sys
from pathlib import Path

from browsergym.core.registration import register_task

from web_env.task_app import serve_app

sys.path.insert(0, str(Path(__file__).parent / "coffee"))
from coffee_task import CoffeeShop, OrderCoffee


class IgnoresSeed(OrderCoffee):
    def __init__(self, seed):
        super().__init__(seed=0)


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
    "coffee-setup-raises": SetupRaises,
    "coffee-backend-raises": BackendRaises,
    "coffee-validate-raises": ValidateRaises,
    "coffee-pays-any-order": PaysAnyOrder,
    "coffee-shares-its-backend": SharesItsBackend,
    "coffee-remembers-in-the-browser": RemembersInTheBrowser,
}.items():
    register_task(name, task)
