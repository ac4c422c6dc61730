"""Check out in a shop: find the product the goal describes by its attributes (its name does not say them), set its
size and quantity, apply the goal's coupon, check out to the address and with the delivery it asks.

The shop's pages are rendered from templates/ by its backend (`Shop`, one per episode, below the task), which keeps
the cart and records the orders that `validate` reads. The products beside the one asked for are its near misses: the
same color in another material, the same material in another color.
"""

from html import escape
from pathlib import Path
from string import Template
from urllib.parse import parse_qs

from browsergym.core.registration import register_task
from browsergym.core.task import AbstractBrowserTask

from web_env.task_app import serve_app

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"  # the pages, filled in by the backend; app/ holds what is served as it is


class ShopCheckout(AbstractBrowserTask):
    @classmethod
    def get_task_id(cls):
        return "shop-checkout"

    def __init__(self, seed):
        super().__init__(seed)
        self.products = []
        for category, (_, materials, _, noun) in CATEGORIES.items():
            words = iter(self.random.permutation(NAME_WORDS))
            combos = [(c, m) for c in COLORS for m in materials]
            for k in self.random.choice(len(combos), size=5, replace=False):
                color, material = combos[k]
                self.products.append(
                    {
                        "category": category,
                        "name": f"{next(words)} {noun}",
                        "color": color,
                        "material": material,
                        "price": int(self.random.randint(1500, 12000)) / 100,
                    }
                )
        self.category = self.pick(list(CATEGORIES))
        listed = [p for p in self.products if p["category"] == self.category]
        self.target, same_color, same_material = listed[0], listed[1], listed[2]
        # Near misses: the same color in another material, the same material in another color
        same_color["color"] = self.target["color"]
        same_color["material"] = self.pick([m for m in CATEGORIES[self.category][1] if m != self.target["material"]])
        same_material["material"] = self.target["material"]
        same_material["color"] = self.pick([c for c in COLORS if c != self.target["color"]])
        self.similar = (same_color, same_material)[self.random.randint(2)]
        self.products = [self.products[k] for k in self.random.permutation(len(self.products))]  # as listed
        for n, product in enumerate(self.products, start=1):
            product["id"] = f"p{n}"
        self.order = {
            "items": [
                {
                    "product": self.target["id"],
                    "size": self.pick(CATEGORIES[self.category][2]),
                    "quantity": 2 + int(self.random.randint(3)),
                }
            ],
            "coupon": self.pick(COUPONS),
            "street": f"{self.random.randint(1, 400)} {self.pick(STREETS)}",
            "zip": f"{self.random.randint(10000, 100000)}",
            "delivery": self.pick(DELIVERIES),
        }
        self.coupons = [self.order["coupon"], self.pick([c for c in COUPONS if c != self.order["coupon"]])]

    def pick(self, items: list):
        return items[self.random.randint(len(items))]

    def setup(self, page):
        self.shop = Shop(self.products, self.coupons)
        url = serve_app(page, HERE / "app", backend=self.shop)
        page.goto(url)
        order, item = self.order, self.order["items"][0]
        noun = CATEGORIES[self.category][0]
        return (
            f"Buy {item['quantity']} of the {self.target['color']} {self.target['material']} {noun} in size "
            f"{item['size']}. Use coupon {order['coupon']}. Ship to {order['street']}, {order['zip']} with "
            f"{order['delivery'].lower()}."
        ), {}

    def validate(self, page, chat_messages):
        if not self.shop.orders:
            return 0.0, False, "", {}
        return float(self.shop.orders == [self.order]), True, "", {}

    def cheat(self, page, chat_messages):
        self.buy(page, self.order, self.target)

    def buy_a_similar_product(self, page):
        self.buy(page, self.order, self.similar)

    def buy_a_wrong_quantity(self, page):
        item = self.order["items"][0]
        self.buy(page, {**self.order, "items": [{**item, "quantity": item["quantity"] + 1}]}, self.target)

    def forget_the_coupon(self, page):
        self.buy(page, {**self.order, "coupon": None}, self.target)

    def ship_to_a_wrong_address(self, page):
        self.buy(page, {**self.order, "street": "1 Main Street"}, self.target)

    wrong_endings = (buy_a_similar_product, buy_a_wrong_quantity, forget_the_coupon, ship_to_a_wrong_address)

    def buy(self, page, order: dict, product: dict):
        item = order["items"][0]
        page.get_by_role("link", name=self.category, exact=True).click()
        page.get_by_role("link", name=product["name"], exact=True).click()
        page.get_by_label("Size").select_option(item["size"])
        page.get_by_label("Quantity").fill(str(item["quantity"]))
        page.get_by_role("button", name="Add to cart").click()
        if order["coupon"]:
            page.get_by_label("Coupon code").fill(order["coupon"])
            page.get_by_role("button", name="Apply coupon").click()
        page.get_by_role("link", name="Check out").click()
        page.get_by_label("Street address").fill(order["street"])
        page.get_by_label("ZIP code").fill(order["zip"])
        page.get_by_label(order["delivery"]).check()
        page.get_by_role("button", name="Place order").click()


register_task("shop-checkout", ShopCheckout)


CATEGORIES = {  # the category's page, what one item is called, its materials, its sizes, its names
    "T-shirts": ("T-shirt", ["cotton", "linen", "polyester", "wool"], ["S", "M", "L", "XL"], "Tee"),
    "Sneakers": ("sneaker", ["canvas", "leather", "mesh", "suede"], ["40", "41", "42", "43", "44"], "Runner"),
    "Backpacks": ("backpack", ["canvas", "leather", "nylon", "polyester"], ["20 L", "30 L"], "Pack"),
}
COLORS = ["black", "blue", "green", "grey", "red", "white"]
NAME_WORDS = ["Everyday", "Classic", "Studio", "Urban", "Trail", "Weekend", "Harbor", "Summit", "Metro", "Field"]
STREETS = ["Oak Street", "Elm Avenue", "Pine Road", "Lake Drive", "Hill Lane", "Mill Way", "Park Row", "Bay Court"]
COUPONS = ["SAVE10", "SPRING15", "WELCOME5", "FRIENDS20", "EXTRA12"]
DELIVERIES = ["Standard delivery", "Express delivery"]


class Shop:
    """The shop's backend, a WSGI app: its pages (templates/, filled in here), the cart, and the orders placed, for one
    episode."""

    def __init__(self, products: list[dict], coupons: list[str]):
        self.products, self.coupons = products, coupons
        self.cart: list[dict] = []  # {"product", "size", "quantity"}
        self.coupon: str | None = None
        self.orders: list[dict] = []

    def __call__(self, environ, start_response):
        path, method = environ["PATH_INFO"], environ["REQUEST_METHOD"]
        form = {k: v[0].strip() for k, v in parse_qs(environ["wsgi.input"].read().decode()).items()}
        if method == "POST" and path in ("/cart", "/coupon", "/orders"):
            location = {"/cart": self.add_to_cart, "/coupon": self.apply_coupon, "/orders": self.place_order}[path](
                form
            )
            start_response("303 See Other", [("Location", location)])
            return [b""]
        parts = path.strip("/").split("/")
        if path == "/":
            body = self.home()
        elif parts[0] == "category" and len(parts) == 2 and parts[1] in CATEGORIES:
            body = self.category(parts[1])
        elif parts[0] == "product" and len(parts) == 2 and parts[1] in {p["id"] for p in self.products}:
            body = self.product(
                next(p for p in self.products if p["id"] == parts[1]), parse_qs(environ["QUERY_STRING"])
            )
        elif path == "/cart":
            body = self.cart_page(invalid_coupon="coupon=invalid" in environ["QUERY_STRING"])
        elif path in ("/checkout", "/ordered"):
            body = {"/checkout": self.checkout, "/ordered": self.ordered}[path]()
        else:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found"]
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
        in_cart = sum(line["quantity"] for line in self.cart)
        return [render("page.html", body=body, in_cart=str(in_cart)).encode()]

    def home(self) -> str:
        return render("home.html", categories="".join(render("category_link.html", category=c) for c in CATEGORIES))

    def category(self, name: str) -> str:
        listed = [p for p in self.products if p["category"] == name]
        links = "".join(render("product_link.html", **shown(p), price=f"{p['price']:.2f}") for p in listed)
        return render("category.html", category=name, products=links)

    def product(self, product: dict, query: dict) -> str:
        return render(
            "product.html",
            **shown(product),
            price=f"{product['price']:.2f}",
            category=product["category"],
            error=render("quantity_error.html") if "error" in query else "",
            sizes="".join(render("option.html", option=size) for size in CATEGORIES[product["category"]][2]),
        )

    def add_to_cart(self, form: dict) -> str:
        quantity = form.get("quantity", "")
        if not (quantity.isdigit() and 1 <= int(quantity) <= 9):
            return f"/product/{form.get('product')}?error=quantity"
        self.cart.append({"product": form.get("product"), "size": form.get("size"), "quantity": int(quantity)})
        return "/cart"

    def apply_coupon(self, form: dict) -> str:
        code = form.get("coupon", "").upper()
        self.coupon = code if code in self.coupons else self.coupon
        return "/cart" if code in self.coupons else "/cart?coupon=invalid"

    def cart_page(self, invalid_coupon: bool) -> str:
        if not self.cart:
            return render("empty_cart.html")
        lines = []
        for line in self.cart:
            product = next(p for p in self.products if p["id"] == line["product"])
            total = f"{line['quantity'] * product['price']:.2f}"
            lines.append(
                render(
                    "cart_line.html", **shown(product), quantity=str(line["quantity"]), size=line["size"], total=total
                )
            )
        coupon = render("coupon_applied.html", coupon=self.coupon) if self.coupon else ""
        coupon += render("coupon_invalid.html") if invalid_coupon else ""
        return render("cart.html", lines="".join(lines), coupon=coupon)

    def checkout(self) -> str:
        deliveries = "".join(
            render("delivery.html", delivery=delivery, checked=" checked" if n == 0 else "")
            for n, delivery in enumerate(DELIVERIES)
        )
        return render("checkout.html", deliveries=deliveries)

    def place_order(self, form: dict) -> str:
        if not self.cart:
            return "/cart"
        self.orders.append(
            {"items": self.cart, "coupon": self.coupon, **{k: form.get(k) for k in ("street", "zip", "delivery")}}
        )
        self.cart, self.coupon = [], None
        return "/ordered"

    def ordered(self) -> str:
        return render("ordered.html")


def shown(product: dict) -> dict:
    """What the pages show of a product, as template values."""
    return {
        "id": product["id"],
        "name": escape(product["name"]),
        "color": product["color"],
        "material": product["material"],
    }


def render(template: str, **values: str) -> str:
    """A page or part of one: the template file with its $names filled in (text escaped by the caller)."""
    return Template((TEMPLATES / template).read_text()).substitute(values)
