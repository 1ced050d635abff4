"""Spiders whose callbacks do nothing: the scheduler, dedup and serializer tests crawl with them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scrapy import Spider


class ForumSpider(Spider):
    name = "forum"

    def parse(self, response: Any) -> None:
        pass

    def parse_post(self, response: Any) -> None:
        pass

    def on_error(self, failure: Any) -> None:
        pass

    def _private(self, response: Any) -> None:
        pass


def renamed(func: Callable[..., Any]) -> Callable[..., Any]:
    """A decorator without ``functools.wraps``: the method's ``__name__`` becomes ``wrapper``."""

    def wrapper(self: Any, response: Any) -> Any:
        return func(self, response)

    return wrapper


class CallbackKindsSpider(ForumSpider):
    """Attributes of every sort, for the serializer's callback rule."""

    name = "callback_kinds"
    reads = 0  # how often ``looks_like_a_method`` was evaluated

    def __hidden(self, response: Any) -> None:  # stored as _CallbackKindsSpider__hidden
        pass

    def hidden(self) -> Callable[..., Any]:
        return self.__hidden

    @renamed
    def decorated(self, response: Any) -> None:
        pass

    @staticmethod
    def static(response: Any) -> None:
        pass

    @classmethod
    def klass(cls, response: Any) -> None:
        pass

    @property
    def looks_like_a_method(self) -> Callable[..., Any]:
        type(self).reads += 1
        return self.parse
