"""celery_crawl: Scrapy crawls hosted by Celery workers, sharing one Redis queue."""

__version__ = "0.1.0"
