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
from pathlib import Path
from socketserver import ThreadingMixIn
from string import Template
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

TEMPLATES = Path(__file__).parent / "templates"  # the site's pages, filled in here; app/ holds what is served as it is


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
            return page(render("sign_in.html", error=""))
        if path == "/signin" and method == "POST":
            return self.sign_in(form)
        if path == "/signout":
            self.tenant.signed_out = True
            self.tenant.sessions.clear()
            return page(render("signed_out.html"))
        if path == "/accounts":
            return page(self.accounts())
        parts = path.strip("/").split("/")
        account = self.tenant.account(parts[1]) if len(parts) == 3 and parts[::2] == ["accounts", "pay"] else None
        if account is None:
            return "404 Not Found", [("Content-Type", "text/plain")], "not found"
        if method == "POST":
            return self.pay(account, form)
        return page(render("pay.html", **shown(account), error=""))

    def sign_in(self, form: dict):
        customer = self.tenant.customer
        if (form.get("user"), form.get("password")) != (customer["user"], customer["password"]):
            return page(render("sign_in.html", error=render("error.html", message="Wrong user name or password.")))
        session = secrets.token_hex(16)
        self.tenant.sessions.add(session)
        return "303 See Other", [("Location", "/accounts"), ("Set-Cookie", f"session={session}; Path=/")], ""

    def accounts(self) -> str:
        sections = []
        for account in self.tenant.customer["accounts"]:
            paid = [p for p in self.tenant.payments if p["account"] == account["id"]]
            payments = "".join(render("payment.html", amount=p["amount"], date=p["date"]) for p in paid)
            sections.append(render("account.html", **shown(account), payments=payments))
        return render("accounts.html", accounts="".join(sections))

    def pay(self, account: dict, form: dict):
        amount, date = cents(form.get("amount", "")), form.get("date", "")
        if amount is None or not valid_date(date):
            error = render("error.html", message="Enter the amount as 84.20 and the date as YYYY-MM-DD.")
            return page(render("pay.html", **shown(account), error=error))
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


def shown(account: dict) -> dict:
    """What the pages show of an account, as template values."""
    return {
        **{key: account[key] for key in ("id", "kind", "number", "due", "due_date")},
        "payee": escape(account["payee"]),
    }


def render(template: str, **values: str) -> str:
    """A page or part of one: the template file with its $names filled in (text escaped by the caller)."""
    return Template((TEMPLATES / template).read_text()).substitute(values)


def page(body: str):
    return "200 OK", [("Content-Type", "text/html; charset=utf-8")], render("page.html", body=body)


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
