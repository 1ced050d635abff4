"""Layer 2: the Scrapy project seen from Celery, the long-lived crawlers each worker
process hosts, the worker registry, and the Scrapy components that carry jobs through a
crawl (middlewares, feeds, log context, the scrapy-redis spiders and pipeline)."""
