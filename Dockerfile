# One image for every service of docker-compose.yml: worker, beat, flower, demo site.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PYTHONPATH=/app
WORKDIR /app

# dependencies first, so code changes do not reinstall them
COPY pyproject.toml README.md ./
COPY celery_crawl ./celery_crawl
RUN pip install --no-cache-dir ".[flower]"

# the forum application the services run (`celery -A tasks ...`)
COPY tasks ./tasks

RUN useradd --create-home crawler && mkdir -p /data/items \
    && chown -R crawler /data
USER crawler
