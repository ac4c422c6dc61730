"""The bill payment portal: a server process of its own, as a real app's, holding every episode's accounts at once.

    python workflows/bills/portal.py   # prints "portal listening on http://127.0.0.1:PORT"; serves until stdin closes

Each episode is a tenant: the task creates one with its seed's customer, accounts and bills (POST /tenants), reads
what was paid (GET /tenants/ID) and deletes it (DELETE /tenants/ID). The site's pages live under /site and see only
the tenant that the request's X-Tenant header names, which the task's proxy sets (bills_task.PortalProxy): a page never
reaches this process but through that proxy, which sends every request under /site, so no page reaches the tenants'
API. Signing in opens a session (a cookie), as portals do; the pages need one.
"""

import json
import os
import secrets
import sys
import threading
from html import escape
from socketserver import ThreadingMixIn
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server


class Tenant:
    def __init__(self, customer: dict):
        self.customer = customer  # {"user", "password", "accounts": [{"id", "payee", "kind", "number", "due", ...}]}
        self.sessions: set[str] = set()
        self.payments: list[dict] = []
        self.signed_out = False

    def account(self, account_id: str) -> dict | None:
        return next((a for a in self.customer["accounts"] if a["id"] == account_id), None)


class Portal:
    """The WSGI app: the tenants' API and the site's pages."""

    def __init__(self):
        self.tenants: dict[str, Tenant] = {}
        self.lock = threading.Lock()  # the server answers requests on threads

    def __call__(self, environ, start_response):
        method, path = environ["REQUEST_METHOD"], environ["PATH_INFO"]
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        with self.lock:
            if path.startswith("/site/"):
                tenant = self.tenants.get(environ.get("HTTP_X_TENANT", ""))
                if tenant is None:
                    status, headers, content = "404 Not Found", [("Content-Type", "text/plain")], "no such tenant"
                else:
                    status, headers, content = Site(tenant, environ).answer(method, path.removeprefix("/site"), body)
            else:
                status, headers, content = self.api(method, path, body)
        start_response(status, headers)
        return [content.encode()]

    def api(self, method: str, path: str, body: bytes):
        parts = path.strip("/").split("/")
        if method == "POST" and parts == ["tenants"]:
            tenant_id = secrets.token_hex(8)
            self.tenants[tenant_id] = Tenant(json.loads(body))
            return json_answer({"tenant": tenant_id})
        if len(parts) == 2 and parts[0] == "tenants" and parts[1] in self.tenants:
            if method == "DELETE":
                del self.tenants[parts[1]]
                return json_answer({})
            tenant = self.tenants[parts[1]]
            return json_answer({"payments": tenant.payments, "signed_out": tenant.signed_out})
        return "404 Not Found", [("Content-Type", "text/plain")], "not found"


def json_answer(content: dict):
    return "200 OK", [("Content-Type", "application/json")], json.dumps(content)


class Site:
    """One request to the site's pages, for one tenant."""

    def __init__(self, tenant: Tenant, environ):
        self.tenant = tenant
        cookie = environ.get("HTTP_COOKIE", "")
        sessions = [part.split("=", 1)[1] for part in cookie.split("; ") if part.startswith("session=")]
        self.signed_in = any(session in tenant.sessions for session in sessions)

    def answer(self, method: str, path: str, body: bytes):
        form = {key: values[0].strip() for key, values in parse_qs(body.decode()).items()}
        if path == "/" or (not self.signed_in and path != "/signin"):
            return page(sign_in_form())
        if path == "/signin" and method == "POST":
            return self.sign_in(form)
        if path == "/signout":
            self.tenant.signed_out = True
            self.tenant.sessions.clear()
            return page("<h1>You are signed out</h1><p>Thank you for using Homeline.</p>")
        if path == "/accounts":
            return page(self.accounts())
        parts = path.strip("/").split("/")
        account = self.tenant.account(parts[1]) if len(parts) == 3 and parts[::2] == ["accounts", "pay"] else None
        if account is None:
            return "404 Not Found", [("Content-Type", "text/plain")], "not found"
        if method == "POST":
            return self.pay(account, form)
        return page(pay_form(account))

    def sign_in(self, form: dict):
        customer = self.tenant.customer
        if (form.get("user"), form.get("password")) != (customer["user"], customer["password"]):
            return page(sign_in_form("Wrong user name or password."))
        session = secrets.token_hex(16)
        self.tenant.sessions.add(session)
        return "303 See Other", [("Location", "/accounts"), ("Set-Cookie", f"session={session}; Path=/")], ""

    def accounts(self) -> str:
        sections = []
        for account in self.tenant.customer["accounts"]:
            paid = [p for p in self.tenant.payments if p["account"] == account["id"]]
            status = "".join(f"<p>Payment of ${p['amount']} scheduled for {p['date']}</p>" for p in paid)
            sections.append(
                f"<section><h2>{account['kind']}: {escape(account['payee'])}</h2><p>Account {account['number']}. "
                f"Amount due: ${account['due']} by {account['due_date']}</p>{status}"
                f'<a href="/accounts/{account["id"]}/pay">Pay {account["kind"]} bill</a></section>'
            )
        return '<h1>Your accounts</h1><p><a href="/signout">Sign out</a></p>' + "".join(sections)

    def pay(self, account: dict, form: dict):
        amount, date = cents(form.get("amount", "")), form.get("date", "")
        if amount is None or not valid_date(date):
            return page(pay_form(account, "Enter the amount as 84.20 and the date as YYYY-MM-DD."))
        self.tenant.payments.append({"account": account["id"], "amount": amount, "date": date})
        return "303 See Other", [("Location", "/accounts")], ""


def cents(text: str) -> str | None:
    """'$84.2', '84.20' -> '84.20'; None if it is no amount."""
    try:
        value = round(float(text.removeprefix("$").replace(",", "")), 2)
    except ValueError:
        return None
    return f"{value:.2f}" if value > 0 else None


def valid_date(text: str) -> bool:
    parts = text.split("-")
    return len(parts) == 3 and all(part.isdigit() for part in parts) and [len(p) for p in parts] == [4, 2, 2]


def sign_in_form(error: str = "") -> str:
    return (
        f"<h1>Sign in</h1>{f'<p>{error}</p>' if error else ''}"
        '<form method="post" action="/signin"><section>'
        '<label>User name <input type="text" name="user"></label>'
        '<label>Password <input type="password" name="password"></label>'
        "<button>Sign in</button></section></form>"
    )


def pay_form(account: dict, error: str = "") -> str:
    return (
        f"<h1>Pay {account['kind']}: {escape(account['payee'])}</h1>"
        f"<p>Statement for account {account['number']}: ${account['due']} due by {account['due_date']}.</p>"
        f"{f'<p>{error}</p>' if error else ''}"
        f'<form method="post" action="/accounts/{account["id"]}/pay"><section>'
        '<label>Amount ($) <input type="text" name="amount"></label>'
        '<label>Pay on (YYYY-MM-DD) <input type="text" name="date"></label>'
        '<button>Schedule payment</button></section></form><p><a href="/accounts">Back to accounts</a></p>'
    )


def page(body: str):
    html = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Homeline bills</title>'
        f'<link rel="stylesheet" href="/style.css"></head><body><header>Homeline bill pay</header><main>{body}</main>'
        "</body></html>"
    )
    return "200 OK", [("Content-Type", "text/html; charset=utf-8")], html


class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


class ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


def main() -> None:
    server = make_server("127.0.0.1", 0, Portal(), server_class=ThreadingServer, handler_class=QuietHandler)
    print(f"portal listening on http://127.0.0.1:{server.server_port}", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()  # the process that started it holds the other end: when it ends, however it ends, so does this
    os._exit(0)


if __name__ == "__main__":
    main()
