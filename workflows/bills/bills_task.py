"""Pay bills: sign in to a bill payment portal, read the accounts' statements, pay only the bills whose amount is what
the goal expects, each on the date it asks, leave the others, sign out.

The portal is a server process of its own (portal.py), shared by every episode of this process, as a real app's
server is shared by its users: each episode is a tenant of it, and the page reaches it only through the episode's
proxy (`PortalProxy`, below the task), which names the tenant. `validate` asks the portal what was paid.
"""

import http.client
import json
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

from browsergym.core.registration import register_task
from browsergym.core.task import AbstractBrowserTask

from web_env.task_app import serve_app

HERE = Path(__file__).resolve().parent


class PayBills(AbstractBrowserTask):
    @classmethod
    def get_task_id(cls):
        return "pay-bills"

    def __init__(self, seed):
        super().__init__(seed)
        pick = self.random.choice
        self.customer = {
            "user": f"{USERS[pick(len(USERS))]}{self.random.randint(10, 100)}",
            "password": f"{PASSWORD_WORDS[pick(len(PASSWORD_WORDS))]}-{self.random.randint(1000, 10000)}",
            "accounts": [],
        }
        for n, k in enumerate(self.random.choice(len(BILLS), size=4, replace=False)):
            kind, payee = BILLS[k]
            self.customer["accounts"].append(
                {
                    "id": f"a{n + 1}",
                    "kind": kind,
                    "payee": payee,
                    "number": str(self.random.randint(1000, 10000)),
                    "due": f"{self.random.randint(2000, 25000) / 100:.2f}",
                    "due_date": f"2026-12-{self.random.randint(15, 29)}",
                }
            )
        # The goal names three of the four: one or two owe what it expects (pay them), the others do not (leave them).
        named = [self.customer["accounts"][i] for i in sorted(self.random.choice(4, size=3, replace=False))]
        matching = set(self.random.choice(3, size=1 + self.random.randint(2), replace=False))
        self.expected, self.left, self.goal_bills = [], [], []
        for n, account in enumerate(named):
            date = f"2026-12-{self.random.randint(1, 15):02d}"
            payment = {"account": account["id"], "amount": account["due"], "date": date}
            if n in matching:
                self.expected.append(payment)
                self.goal_bills.append((account["kind"], account["due"], date))
            else:
                self.left.append(payment)  # what paying it anyway would record
                off = self.random.choice([-1, 1]) * self.random.randint(1, 2000) / 100
                self.goal_bills.append((account["kind"], f"{max(float(account['due']) + off, 1.0):.2f}", date))

    def setup(self, page):
        _, _, content = portal_call("POST", "/tenants", json.dumps(self.customer).encode())
        self.tenant = json.loads(content)["tenant"]
        url = serve_app(page, HERE / "app", backend=PortalProxy(self.tenant))
        page.goto(url)
        bills = ", ".join(f"the {kind} bill on {date} if it is ${amount}" for kind, amount, date in self.goal_bills)
        goal = (
            f'Sign in as "{self.customer["user"]}" with password "{self.customer["password"]}". Pay {bills}. '
            "Leave a bill whose amount differs unpaid. Sign out when done."
        )
        return goal, {}

    def state(self) -> dict:
        return json.loads(portal_call("GET", f"/tenants/{self.tenant}")[2])

    def validate(self, page, chat_messages):
        """Done when signed out, paid when exactly the expected payments were made; a payment that is not one of
        them (another bill, amount or date, or one made twice) ends it unpaid at once."""
        state = self.state()
        payments = state["payments"]
        if any(p not in self.expected or payments.count(p) > 1 for p in payments):
            return 0.0, True, "", {}
        if not state["signed_out"]:
            return 0.0, False, "", {}
        return float(sorted(payments, key=str) == sorted(self.expected, key=str)), True, "", {}

    def teardown(self):
        portal_call("DELETE", f"/tenants/{self.tenant}")

    def cheat(self, page, chat_messages):
        self.pay(page, self.expected)

    def pay_a_mismatched_bill(self, page):
        self.pay(page, self.expected + self.left)

    def pay_a_wrong_amount(self, page):
        first = self.expected[0]
        self.pay(page, [{**first, "amount": f"{float(first['amount']) + 1:.2f}"}] + self.expected[1:])

    def pay_on_a_wrong_date(self, page):
        self.pay(page, [{**self.expected[0], "date": "2026-12-28"}] + self.expected[1:])

    def pay_twice(self, page):
        self.pay(page, self.expected + self.expected[:1])

    def forget_a_bill(self, page):
        self.pay(page, self.expected[:-1] if len(self.expected) > 1 else [])

    wrong_endings = (pay_a_mismatched_bill, pay_a_wrong_amount, pay_on_a_wrong_date, pay_twice, forget_a_bill)

    def pay(self, page, payments: list[dict]):
        """Through the site as a person would: sign in, schedule each payment, sign out."""
        self.sign_in(page)
        for payment in payments:
            self.schedule(page, payment)
        page.get_by_role("link", name="Sign out").click()

    def sign_in(self, page):
        page.get_by_label("User name").fill(self.customer["user"])
        page.get_by_label("Password").fill(self.customer["password"])
        page.get_by_role("button", name="Sign in").click()

    def schedule(self, page, payment: dict):
        kind = next(a["kind"] for a in self.customer["accounts"] if a["id"] == payment["account"])
        page.get_by_role("link", name=f"Pay {kind} bill").click()
        page.get_by_label("Amount ($)").fill(payment["amount"])
        page.get_by_label("Pay on (YYYY-MM-DD)").fill(payment["date"])
        page.get_by_role("button", name="Schedule payment").click()


register_task("pay-bills", PayBills)


BILLS = [  # (kind, payee)
    ("Electricity", "City Power"),
    ("Water", "Metro Water"),
    ("Gas", "Northern Gas"),
    ("Internet", "FastNet"),
    ("Phone", "Mobi Mobile"),
    ("Insurance", "SafeHome"),
]
USERS = ["kim.lee", "ana.diaz", "sam.cole", "li.wang", "raj.mehta", "eva.novak", "tom.reed", "ola.berg"]
PASSWORD_WORDS = ["maple", "river", "stone", "cloud", "amber", "delta", "lumen", "north"]

_portal: dict = {}
_portal_lock = threading.Lock()


def portal_address() -> tuple[str, int]:
    """The portal's host and port, started once in this process; it stops when this process ends (its stdin closes)."""
    with _portal_lock:
        if "process" not in _portal or _portal["process"].poll() is not None:
            process = subprocess.Popen(
                [sys.executable, str(HERE / "portal.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            url = urlsplit(process.stdout.readline().split()[-1])
            _portal.update(process=process, address=(url.hostname, url.port))
        return _portal["address"]


def portal_call(method: str, path: str, body: bytes = b"", headers: dict | None = None):
    connection = http.client.HTTPConnection(*portal_address(), timeout=10)
    try:
        connection.request(method, path, body, headers or {})
        response = connection.getresponse()
        return response.status, response.getheaders(), response.read()
    finally:
        connection.close()


class PortalProxy:
    """The episode's backend: every request of its page goes to the portal's site, for its tenant alone."""

    FORWARDED = ("content-type", "location", "set-cookie")

    def __init__(self, tenant: str):
        self.tenant = tenant

    def __call__(self, environ, start_response):
        body = environ["wsgi.input"].read()
        path = "/site" + environ["PATH_INFO"] + (f"?{environ['QUERY_STRING']}" if environ["QUERY_STRING"] else "")
        headers = {
            "Content-Type": environ.get("CONTENT_TYPE", ""),
            "Cookie": environ.get("HTTP_COOKIE", ""),
            "X-Tenant": self.tenant,  # set here, whatever the page sent
        }
        status, answer_headers, content = portal_call(environ["REQUEST_METHOD"], path, body, headers)
        start_response(
            f"{status} {http.client.responses.get(status, '')}",
            [(k, v) for k, v in answer_headers if k.lower() in self.FORWARDED],
        )
        return [content]
