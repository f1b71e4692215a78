# Muninn in a container: docs/deployment.md. Build: docker build -t muninn .
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# An unprivileged user owns nothing but the data volume.
RUN useradd --system --uid 10001 --user-group --home-dir /app --shell /usr/sbin/nologin muninn

WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY bot ./bot
COPY cogs ./cogs
# The README's install command (tests/deploy/test_containers.py keeps the two the same).
RUN python3 -m venv .venv && .venv/bin/pip install -e .

# The database lives on a volume, private to the bot (the memories of DMs are in it).
RUN mkdir /data && chown muninn:muninn /data && chmod 0700 /data
VOLUME ["/data"]
ENV MUNINN_DB_PATH=/data/muninn.db \
    PATH=/app/.venv/bin:$PATH

USER muninn
# SIGTERM (docker stop) is a graceful shutdown: give it stop_grace_period (compose.yaml).
STOPSIGNAL SIGTERM
CMD ["muninn"]
