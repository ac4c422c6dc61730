"""What each action type of the allowlist costs, on BrowserGym's code and on page_actions.run_action, side by side.

    python bench/action_profile.py                  # 40 times each action on each path
    python bench/action_profile.py --times 100

Each action plays on tests/pages/actions.html in one real Chromium, on the page loaded afresh before each time
(uncounted, and with Playwright's script for the document made, as an environment's long-lived page has it). Each
is charged the CPU time of every process involved, by kind (as bench/env_profile.py counts it), and its round trips:
calls from Python to Playwright's Node driver, and DevTools commands from the driver to Chromium (counted in a second
pass, whose driver logs its protocol). Run it on an otherwise idle machine.
"""

import argparse
import os
import re
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from env_profile import KINDS, cpu_by_kind
from playwright._impl._connection import Connection

from web_env.server import browser_setup
from web_env.server.browsers import BrowserWorker
from web_env.server.page_actions import run_action

PAGE = (Path(__file__).resolve().parents[1] / "tests" / "pages" / "actions.html").as_uri()
# One action of each type the allowlist admits, each on an element that takes it; an action's setup runs first.
ACTIONS = {
    "click": ("click('2')", None),
    "dblclick": ("dblclick('2')", None),
    "hover": ("hover('2')", None),
    "fill": ("fill('19', 'hello')", None),
    "clear": ("clear('19')", "fill('19', 'hello')"),
    "press": ("press('19', 'a')", None),
    "focus": ("focus('19')", None),
    "select_option": ("select_option('18', 'blue')", None),
    "drag_and_drop": ("drag_and_drop('22', '23')", None),
    "scroll": ("scroll(0, 30)", "hover('25')"),
    "noop": ("noop(0)", None),
}


# BrowserGym's code is run_action without its short path, as the server runs it with --browsergym_actions.
PATHS = {"BrowserGym's code": partial(run_action, short_path=False), "run_action": run_action}


class CountedCalls:
    """Counts the calls from Python to Playwright's driver."""

    def __init__(self):
        self.count = 0
        send = Connection._send_message_to_server

        def counted(connection, *args, **kwargs):
            self.count += 1
            return send(connection, *args, **kwargs)

        Connection._send_message_to_server = counted


class LoggedProtocol:
    """A browser whose driver logs every DevTools command it sends to a file, which `commands()` counts so far."""

    def __init__(self):
        self._log = Path(tempfile.mkdtemp()) / "protocol.log"
        saved_stderr, os.environ["DEBUG"] = os.dup(2), "pw:protocol"
        with open(self._log, "wb") as log:
            os.dup2(log.fileno(), 2)  # the driver, started with the browser, inherits this process's stderr
            try:
                self.worker = BrowserWorker()
                self.page = new_page(self.worker)
            finally:
                os.dup2(saved_stderr, 2)
                del os.environ["DEBUG"]

    def commands(self) -> int:
        return len(re.findall(rb"SEND \xe2\x96\xba", self._log.read_bytes()))


def new_page(worker: BrowserWorker):
    return worker.call(lambda: worker.new_context(viewport={"width": 500, "height": 400}).new_page())


def loaded_afresh(page, setup: str | None, run) -> None:
    page.mouse.move(0, 0)
    page.goto(PAGE)
    page.get_by_test_id("none").count()  # Playwright's script for the document, made once in a long-lived page
    if setup:
        run(page, setup)


def profile(worker, page, run, action: str, setup: str | None, times: int, count) -> dict:
    """Per time of `action`: CPU seconds by process kind, and the change of `count()` (round trips)."""
    totals, trips = dict.fromkeys(KINDS, 0.0), 0
    for _ in range(times):
        worker.call(loaded_afresh, page, setup, run)
        time.sleep(0.05)
        start, before = cpu_by_kind(), count()
        worker.call(run, page, action)
        time.sleep(0.05)  # what Chromium does for the action after answering (layout, painting) lands in it too
        end, after = cpu_by_kind(), count()
        trips += after - before
        for kind in KINDS:
            totals[kind] += end[kind] - start[kind]
    return {kind: seconds / times for kind, seconds in totals.items()} | {"trips": trips / times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--times", type=int, default=40)
    parser.add_argument("--protocol_times", type=int, default=5, help="times each action plays in the counting pass")
    args = parser.parse_args()
    browser_setup.prepare()
    calls = CountedCalls()
    worker = BrowserWorker()
    page = new_page(worker)
    logged = LoggedProtocol()
    rows = []
    for name, (action, setup) in ACTIONS.items():
        for path, run in PATHS.items():
            cpu = profile(worker, page, run, action, setup, args.times, lambda: calls.count)
            driver = profile(logged.worker, logged.page, run, action, setup, args.protocol_times, logged.commands)
            rows.append((name, path, cpu, driver["trips"]))
            print(f"{name:<14} {path:<18} {1000 * sum(cpu[k] for k in KINDS):7.1f} ms", file=sys.stderr, flush=True)
    print(f"\nCPU milliseconds and round trips per action, {args.times} times each, on {os.cpu_count()} CPUs\n")
    header = f"{'action':<14}{'path':<19}" + "".join(f"{kind:>15}" for kind in KINDS)
    print(header + f"{'total':>8}{'Python->driver':>16}{'driver->Chromium':>18}")
    for name, path, cpu, commands in rows:
        cells = [1000 * cpu[kind] for kind in KINDS]
        line = f"{name:<14}{path:<19}" + "".join(f"{cell:>15.1f}" for cell in cells) + f"{sum(cells):>8.1f}"
        print(line + f"{cpu['trips']:>16.1f}{commands:>18.1f}")


if __name__ == "__main__":
    main()
