"""What a process needs before it drives MiniWoB pages in Chromium: the task pages, a Chromium for Playwright, and
Playwright's call path made cheap. The environment server, the benchmarks and the tests that run the environment
in their own process call `prepare()` first.
"""

import inspect
import logging
import os
import shutil
import sys
from pathlib import Path

import miniwob
from playwright._impl import _connection, _sync_base
from playwright.sync_api import sync_playwright

log = logging.getLogger("browser_setup")


def prepare(windowed: bool = False) -> None:
    """The packaged MiniWoB pages, a Chromium (one that draws windows if `windowed`), and Playwright's cheap call
    path."""
    use_packaged_miniwob_pages()
    ensure_chromium(windowed)
    record_playwright_stacks_cheaply()


def use_packaged_miniwob_pages() -> None:
    """Serve task pages straight from the `miniwob` package unless MINIWOB_URL points elsewhere."""
    pages = Path(miniwob.__file__).parent / "html" / "miniwob"
    os.environ.setdefault("MINIWOB_URL", pages.as_uri() + "/")


# The system's Chromium builds Playwright can drive headless, the lightest first: Chromium's old headless shell
# (Debian's chromium-headless-shell, what Playwright itself runs headless since 1.49) launches in about half the CPU
# of the full browser and plays an episode in 6 to 24% less (docs/environment.md, "Chromium's headless shell").
SYSTEM_CHROMIUMS = ("chromium-headless-shell", "chrome-headless-shell", "chromium", "chromium-browser", "google-chrome")
# A window needs the full browser: the headless shell draws none.
WINDOWED_CHROMIUMS = tuple(name for name in SYSTEM_CHROMIUMS if "headless" not in name)
LINKS = Path(".cache", "browser-rl")  # where in the home folder the system Chromium is linked for Playwright


def ensure_chromium(windowed: bool = False) -> None:
    """Point Playwright at the system Chromium when Playwright's own build is not installed.

    Playwright looks for its browser at a fixed path under PLAYWRIGHT_BROWSERS_PATH; a link there to the
    system Chromium serves every launch, including BrowserGym's, which take no executable option. A windowed
    browser's link lies apart, so that servers showing windows and servers that do not can run side by side.
    """
    # A link of ours that this process inherited (its parent prepared browsers of the other kind) is no build of
    # Playwright's own: the headless one would be launched for a window, and draw none.
    if Path(os.environ.get("PLAYWRIGHT_BROWSERS_PATH", "")).parent == Path.home() / LINKS:
        del os.environ["PLAYWRIGHT_BROWSERS_PATH"]
    with sync_playwright() as pw:
        expected = Path(pw.chromium.executable_path)
    if expected.exists():
        return
    system_chromium = next(filter(None, map(shutil.which, WINDOWED_CHROMIUMS if windowed else SYSTEM_CHROMIUMS)), None)
    if system_chromium is None:
        raise SystemExit(
            f"No Chromium found: Playwright's build is missing ({expected}) and none is on PATH. Run `playwright "
            f"install chromium` or install your system's {'' if windowed else 'chromium-headless-shell or '}chromium "
            f"package{' (a window needs the full browser)' if windowed else ''}."
        )
    browsers_root = next(p for p in expected.parents if p.name.startswith("chromium-")).parent
    linked_root = Path.home() / LINKS / ("playwright-windowed" if windowed else "playwright")
    link = linked_root / expected.relative_to(browsers_root)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(system_chromium)
    os.environ["PLAYWRIGHT_BROWSERS_PATH"] = str(linked_root)
    log.warning(
        "Playwright's Chromium is not installed; using the system Chromium %s (linked at %s)", system_chromium, link
    )


class _InspectWithoutSourceLookups:
    """The `inspect` module as Playwright's call path sees it, except that `stack()` only walks the frames."""

    def __getattr__(self, name: str):
        return getattr(inspect, name)

    @staticmethod
    def stack(context: int = 1) -> list[inspect.FrameInfo]:
        frames, frame = [], sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None))
            frame = frame.f_back
        return frames


def record_playwright_stacks_cheaply() -> None:
    """Playwright 1.44 (BrowserGym's pin) records the caller's stack at every API call with `inspect.stack()`,
    which reads each frame's source line and looks up its file and module; for code run by `exec`, as BrowserGym
    runs actions, that lookup goes through every loaded module, about 15 ms a frame. Playwright uses only the
    frames, file names, line numbers and function names, which the frames hold."""
    _sync_base.inspect = _connection.inspect = _InspectWithoutSourceLookups()
