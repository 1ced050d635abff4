# One image for every service of docker-compose.yml: worker, beat, flower, demo site.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PYTHONPATH=/app
WORKDIR /app

# the library and the forum application the services run (`celery -A tasks ...`),
# which ships in the same distribution and adds `celery-crawl site`
COPY pyproject.toml README.md ./
COPY celery_crawl ./celery_crawl
COPY tasks ./tasks
RUN pip install --no-cache-dir ".[flower]"

RUN useradd --create-home crawler && mkdir -p /data/items \
    && chown -R crawler /data
USER crawler
