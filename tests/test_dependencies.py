"""The environment the project installs holds one consistent set of packages."""

import importlib.metadata


def test_one_distribution_provides_the_openenv_package():
    # `openenv` and the older `openenv-core` both install the import package `openenv`; with both, whichever
    # was installed last silently wins.
    assert importlib.metadata.packages_distributions()["openenv"] == ["openenv"]
