import sys

# OpenEnv's server package imports its Gradio web interface whenever Gradio is installed (it is one of OpenEnv's
# requirements): some 3 s of every server start, for a page this server never mounts. A None entry makes that import
# fail as it would without Gradio, which OpenEnv allows for (pyproject.toml's private seams). Only here, in the
# server's own process: anything imported beside the recipe's modules may want Gradio.
sys.modules.setdefault("gradio", None)

from web_env.server.app import main  # noqa: E402  (after the entry above, which OpenEnv's import reads)

main()
