"""The environment server: the app and its command line (app.py), the sessions (environment.py) on long-lived
browsers (browsers.py), the restart of an episode in its page (in_page_restart.py), reading a page (page_reading.py),
the actions run on a page (page_actions.py), what a process needs to drive pages (browser_setup.py) and the scripts
run in the pages (scripts/). Run with `python -m web_env.server`."""
