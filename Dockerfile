# The environment server as a container: MiniWoB++ tasks over OpenEnv's WebSocket protocol.
#   docker build -t browser-rl-env .
#   docker run -p 8000:8000 -e BROWSER_RL_ENV_TOKEN=$(openssl rand -hex 16) browser-rl-env
# It listens beyond loopback, so it refuses to start without the token, which clients then send.
FROM python:3.11-slim

# Debian's Chromium; env_server.py links it in where Playwright expects its own build.
RUN apt-get update \
    && apt-get install -y --no-install-recommends chromium fonts-liberation \
    && rm -rf /var/lib/apt/lists/*

# What env_server.py, miniwob_env.py, page_actions.py, browser_setup.py and actions.py import
# (tests/test_dockerfile.py keeps this list complete).
RUN pip install --no-cache-dir "openenv>=0.10,<0.11" "browsergym-miniwob>=0.14" "miniwob>=1.0" \
    "playwright" "psutil" "pydantic>=2" "uvicorn>=0.30"

RUN useradd --create-home env
WORKDIR /app
COPY actions.py browser_setup.py env_protocol.py env_server.py miniwob_env.py page_actions.py ./
USER env

EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health')"
# All interfaces inside the container, so that the published port reaches it.
CMD ["python", "env_server.py", "--host", "0.0.0.0", "--port", "8000"]
