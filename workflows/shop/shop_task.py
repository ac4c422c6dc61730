"""Check out in a shop: find the product the goal describes by its attributes (its name does not say them), set its
size and quantity, apply the goal's coupon, check out to the address and with the delivery it asks.

The shop's pages are rendered by its backend (`Shop`, one per episode), which keeps the cart and records the orders
that `validate` reads. The products beside the one asked for are its near misses: the same color in another
material, the same material in another color.
"""

from html import escape
from pathlib import Path
from urllib.parse import parse_qs

from browsergym.core.registration import register_task
from browsergym.core.task import AbstractBrowserTask

from web_env.task_app import serve_app

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
    """The shop's backend, a WSGI app: its pages, the cart, and the orders placed, for one episode."""

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
        return [page(body, sum(line["quantity"] for line in self.cart)).encode()]

    def home(self) -> str:
        links = "".join(f'<li><a href="/category/{name}">{name}</a></li>' for name in CATEGORIES)
        return f"<h1>Shop by category</h1><section><ul>{links}</ul></section>"

    def category(self, name: str) -> str:
        items = "".join(
            f'<li><a href="/product/{p["id"]}">{escape(p["name"])}</a> {p["color"]}, {p["material"]}. '
            f"${p['price']:.2f}</li>"
            for p in self.products
            if p["category"] == name
        )
        return f'<h1>{name}</h1><p><a href="/">All categories</a></p><section><ul>{items}</ul></section>'

    def product(self, product: dict, query: dict) -> str:
        sizes = "".join(f"<option>{size}</option>" for size in CATEGORIES[product["category"]][2])
        error = "<p>Choose a quantity from 1 to 9.</p>" if "error" in query else ""
        return (
            f"<h1>{escape(product['name'])}</h1><p>Color: {product['color']}. Material: {product['material']}. "
            f"${product['price']:.2f}</p>{error}"
            f'<form method="post" action="/cart"><section><input type="hidden" name="product" value="{product["id"]}">'
            f'<label>Size <select name="size">{sizes}</select></label>'
            '<label>Quantity <input type="text" name="quantity" value="1"></label>'
            "<button>Add to cart</button></section></form>"
            f'<p><a href="/category/{product["category"]}">Back to {product["category"]}</a></p>'
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
        lines = []
        for line in self.cart:
            product = next(p for p in self.products if p["id"] == line["product"])
            lines.append(
                f"<li>{line['quantity']} x {escape(product['name'])} ({product['color']}, {product['material']}, "
                f"size {line['size']}): ${line['quantity'] * product['price']:.2f}</li>"
            )
        if not lines:
            return '<h1>Your cart is empty</h1><p><a href="/">Shop by category</a></p>'
        coupon = f"<p>Coupon {self.coupon} applied.</p>" if self.coupon else ""
        coupon += "<p>That coupon is not valid.</p>" if invalid_coupon else ""
        return (
            f"<h1>Your cart</h1><section><ul>{''.join(lines)}</ul>{coupon}</section>"
            '<form method="post" action="/coupon"><section><label>Coupon code <input type="text" name="coupon">'
            "</label><button>Apply coupon</button></section></form>"
            '<p><a href="/checkout">Check out</a> <a href="/">Continue shopping</a></p>'
        )

    def checkout(self) -> str:
        deliveries = "".join(
            f'<label><input type="radio" name="delivery" value="{d}"{" checked" if n == 0 else ""}> {d}</label>'
            for n, d in enumerate(DELIVERIES)
        )
        return (
            '<h1>Check out</h1><form method="post" action="/orders"><section>'
            '<label>Street address <input type="text" name="street"></label>'
            '<label>ZIP code <input type="text" name="zip"></label>'
            f"{deliveries}<button>Place order</button></section></form>"
            '<p><a href="/cart">Back to cart</a></p>'
        )

    def place_order(self, form: dict) -> str:
        if not self.cart:
            return "/cart"
        self.orders.append(
            {"items": self.cart, "coupon": self.coupon, **{k: form.get(k) for k in ("street", "zip", "delivery")}}
        )
        self.cart, self.coupon = [], None
        return "/ordered"

    def ordered(self) -> str:
        return "<h1>Thank you for your order</h1><p>A confirmation is on its way.</p>"


def page(body: str, in_cart: int) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Shop</title>'
        f'<link rel="stylesheet" href="/style.css"></head><body><header>Northwind Outfitters</header>'
        f'<main><p><a href="/cart">Cart ({in_cart})</a></p>{body}</main></body></html>'
    )


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
        url = serve_app(page, Path(__file__).parent / "app", backend=self.shop)
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
