"""The JavaScript the server runs in the pages, a file each, so that a highlighter, a linter and a readable diff work
on it; read once, when the server starts. Each file opens with a comment saying what it does and why."""

from pathlib import Path


def page_script(name: str) -> str:
    """The source of one script of this folder."""
    return (Path(__file__).parent / name).read_text()
