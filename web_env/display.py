"""Whether this machine can show a browser's window: the server that launches the browsers and the agent command
that asks for them both check before they start (`--headed`)."""

import os
import sys


def missing_display() -> str | None:
    """Why a browser window cannot be shown here, or None: Linux draws windows on the display DISPLAY (X11) or
    WAYLAND_DISPLAY names."""
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return "a browser window needs a display, and DISPLAY is unset (without one, run the command under xvfb-run)"
    return None
