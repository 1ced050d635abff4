# One image for every service of docker-compose.yml: worker, beat, flower, demo site.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PYTHONPATH=/app
WORKDIR /app

# The dependencies first, from pyproject.toml alone (an empty package stands in for
# the code), so that a change to the code does not install them again: this
# layer is rebuilt only when pyproject.toml changes.
COPY pyproject.toml README.md LICENSE ./
RUN mkdir celery_crawl && touch celery_crawl/__init__.py \
    && pip install --no-cache-dir ".[flower]" && pip uninstall --yes celery-crawl \
    && rm -r celery_crawl

# the library (with the demo's forum application, which adds `celery-crawl site`),
# and the checkout's example app the services run (`celery -A tasks ...`): not
# installed, found on PYTHONPATH
COPY celery_crawl ./celery_crawl
COPY tasks ./tasks
RUN pip install --no-cache-dir --no-deps ".[flower]"

RUN useradd --create-home crawler && mkdir -p /data/items \
    && chown -R crawler /data
USER crawler
