"""The environment server: the app and its command line (app.py), the sessions on long-lived browsers
(environment.py), the actions run on a page (page_actions.py), what a process needs to drive pages (browser_setup.py)
and the scripts run in the pages (scripts/). Run with `python -m web_env.server`."""
