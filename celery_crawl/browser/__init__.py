"""Pages that need a browser: scrapy-playwright in hosted workers (docs/browsers.md)."""
