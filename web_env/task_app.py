"""A task's web app, served to its page from the task's own folder: what a task module calls in its `setup`.

    self.app = ClinicApp(seed)                             # the backend, a WSGI app: one per episode
    url = serve_app(page, Path(__file__).parent / "app", backend=self.app)
    page.goto(url + "index.html")

The app gets an origin of its own, http://<folder's name>.localhost/, answered inside the browser (Playwright's request
routing): a file of the folder is served as it is, any other path goes to the backend (a function, or a Flask or
Django app), called in this process. No port is opened and nothing is shared: the concurrent episodes of a GRPO group
never see each other's writes, and `validate` reads what the app recorded. The environment server gives its browsers
no network, so the app's origin is the only one a page of a task reaches (docs/your_own_task.md).
"""

import io
import logging
import mimetypes
import re
import sys
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

log = logging.getLogger("task_app")

MAX_REDIRECTS = 5
NOT_FOUND = {"status": 404, "body": b"not found", "headers": {"content-type": "text/plain"}}
WSGI_BASE = {
    "SCRIPT_NAME": "",
    "SERVER_PORT": "80",
    "SERVER_PROTOCOL": "HTTP/1.1",
    "wsgi.version": (1, 0),
    "wsgi.url_scheme": "http",
    "wsgi.errors": sys.stderr,
    "wsgi.multithread": False,
    "wsgi.multiprocess": False,
    "wsgi.run_once": False,
}


def app_origin(folder: Path) -> str:
    """The origin a folder's app is served at: http://<its name, as a host name>.localhost"""
    return f"http://{re.sub(r'[^a-z0-9-]+', '-', Path(folder).name.lower()).strip('-') or 'app'}.localhost"


def serve_app(page, folder: Path, backend=None) -> str:
    """Serves `folder` (and `backend`, a WSGI application, for every path that is not one of its files) to the pages
    of `page`'s browser context, in place of what an earlier episode served there; returns the app's base URL."""
    root = Path(folder).resolve()
    if not root.is_dir():
        raise ValueError(f"serve_app: {root} is not a folder")
    origin = app_origin(root)
    pattern = f"{origin}/**"
    page.context.unroute(pattern)  # the last episode's backend goes
    page.context.route(pattern, lambda route: answer(route, root, backend, page.context))
    return origin + "/"


def answer(route, root: Path, backend, context) -> None:
    """A file of the folder, or the backend's answer. A redirect is followed here, to the answer it leads to (at the
    URL the page asked for): Chromium does not follow a redirect that an intercepted request is answered with. As a
    browser does, the request it leads to carries the cookie the redirect set (a sign-in's session), and the page
    gets that cookie too."""
    request = route.request
    method, url, body = request.method, urlsplit(request.url), request.post_data_buffer or b""
    headers = {**request.headers, "cookie": page_cookies(context, request.url)}
    set_cookie = None
    for _ in range(MAX_REDIRECTS + 1):
        response = file_answer(root, unquote(url.path)) or backend_answer(backend, method, url, body, headers)
        location = response["headers"].get("location")
        if not (300 <= response["status"] < 400 and location):
            break
        if cookie := response["headers"].get("set-cookie"):
            set_cookie = cookie
            sent = [c for c in headers["cookie"].split("; ") if c and c.split("=")[0] != cookie.split("=")[0]]
            headers = {**headers, "cookie": "; ".join([*sent, cookie.split(";")[0]])}
        url = urlsplit(urljoin(url.geturl(), location))
        method, body = "GET", b""
    if set_cookie and "set-cookie" not in response["headers"]:
        response["headers"]["set-cookie"] = set_cookie
    route.fulfill(**response)


def page_cookies(context, url: str) -> str:
    """The Cookie header the page's request carries, read from its context: `request.headers` leaves cookies out, and
    `request.all_headers()`, which has them, can wait forever on an intercepted request."""
    return "; ".join(f"{cookie['name']}={cookie['value']}" for cookie in context.cookies(url))


def file_answer(root: Path, path: str) -> dict | None:
    file = (root / path.lstrip("/")).resolve()
    if path.endswith("/"):
        file = file / "index.html"
    if not (file.is_relative_to(root) and file.is_file()):
        return None
    content_type = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
    return {"status": 200, "body": file.read_bytes(), "headers": {"content-type": content_type}}


def backend_answer(backend, method: str, url, body: bytes, headers: dict) -> dict:
    """The backend's answer; 404 without one, and 500 where it raised, as a server answers when its app fails (left
    unanswered, the request would hold the page until the action's timeout)."""
    if backend is None:
        return NOT_FOUND
    try:
        return call_wsgi(backend, method, url, body, headers)
    except Exception as error:
        log.exception("the app's backend raised on %s %s", method, url.path)
        text = f"the app's backend raised {type(error).__name__}: {error}".encode()
        return {"status": 500, "body": text, "headers": {"content-type": "text/plain"}}


def call_wsgi(backend, method: str, url, body: bytes, headers: dict) -> dict:
    """The backend's answer to one request, as route.fulfill's arguments."""
    environ = {
        **WSGI_BASE,
        "REQUEST_METHOD": method,
        "PATH_INFO": unquote(url.path),
        "QUERY_STRING": url.query,
        "SERVER_NAME": url.hostname,
        "CONTENT_TYPE": headers.get("content-type", ""),
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
        **{"HTTP_" + name.upper().replace("-", "_"): value for name, value in headers.items()},
    }
    answered = {}

    def start_response(status: str, response_headers: list, exc_info=None):
        answered["status"] = int(status.split()[0])
        answered["headers"] = {name.lower(): value for name, value in response_headers}

    result = backend(environ, start_response)
    try:
        content = b"".join(result)
    finally:
        if hasattr(result, "close"):
            result.close()
    return {"status": answered["status"], "headers": answered["headers"], "body": content}
