"""Order a coffee: a one-page shop whose backend records the order."""

from pathlib import Path
from urllib.parse import parse_qs

from browsergym.core.registration import register_task
from browsergym.core.task import AbstractBrowserTask

from web_env.task_app import serve_app

DRINKS = ["latte", "cappuccino", "mocha"]
SIZES = ["small", "medium", "large"]
NAMES = ["Ana", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana"]


class OrderCoffee(AbstractBrowserTask):
    @classmethod
    def get_task_id(cls):
        return "order-coffee"

    def __init__(self, seed):
        super().__init__(seed)
        self.order = {
            "drink": DRINKS[self.random.randint(len(DRINKS))],
            "size": SIZES[self.random.randint(len(SIZES))],
            "name": NAMES[self.random.randint(len(NAMES))],
        }

    def setup(self, page):
        self.shop = CoffeeShop()
        url = serve_app(page, Path(__file__).parent / "app", backend=self.shop)
        page.goto(url + "index.html")
        order = self.order
        return f"Order a {order['size']} {order['drink']} for {order['name']}.", {}

    def validate(self, page, chat_messages):
        if not self.shop.orders:
            return 0.0, False, "", {}
        return float(self.shop.orders == [self.order]), True, "", {}

    def cheat(self, page, chat_messages):
        self.place(page, self.order)

    def order_the_wrong_size(self, page):
        self.place(page, {**self.order, "size": next(s for s in SIZES if s != self.order["size"])})

    def order_for_someone_else(self, page):
        self.place(page, {**self.order, "name": next(n for n in NAMES if n != self.order["name"])})

    wrong_endings = (order_the_wrong_size, order_for_someone_else)

    @staticmethod
    def place(page, order):
        page.get_by_label(order["drink"]).check()
        page.get_by_label(order["size"]).check()
        page.get_by_label("Name on the cup").fill(order["name"])
        page.get_by_role("button", name="Place order").click()


register_task("order-coffee", OrderCoffee)


class CoffeeShop:
    """The shop's backend, a WSGI app: one per episode, so that no episode sees another's orders."""

    def __init__(self):
        self.orders = []

    def __call__(self, environ, start_response):
        if environ["REQUEST_METHOD"] == "POST" and environ["PATH_INFO"] == "/order":
            form = parse_qs(environ["wsgi.input"].read().decode())
            self.orders.append({key: values[0] for key, values in form.items()})
            start_response("303 See Other", [("Location", "/thanks.html")])
            return [b""]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found"]
