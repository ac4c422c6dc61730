"""The container must carry everything the server imports: checked against the code, so they cannot drift."""

import re

from helpers import ROOT, local_modules, third_party_distributions

SERVER_FILES = ("env_server.py", "miniwob_env.py", "browser_setup.py", "actions.py")


def test_dockerfile_copies_the_server_and_every_local_module_it_imports():
    copied = set(re.search(r"^COPY (.+) \./$", (ROOT / "Dockerfile").read_text(), re.M).group(1).split())
    assert set(SERVER_FILES) | {f"{m}.py" for m in local_modules(*SERVER_FILES)} <= copied


def test_dockerfile_installs_the_distribution_of_every_third_party_import():
    installed = set(re.findall(r'"([a-z0-9_.-]+)(?:[<>=!~][^"]*)?"', (ROOT / "Dockerfile").read_text().lower()))
    for module, distributions in third_party_distributions(*SERVER_FILES).items():
        assert distributions & installed, f"{module} (from {distributions}) is not installed by the Dockerfile"
