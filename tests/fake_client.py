"""The connection side of a :class:`~specbuild.client.sdk.SpecClient` stand-in, for tests that script what
a deployment answers (their subclass gives ``generate``)."""

from __future__ import annotations


class ReadyClient:
    """Takes SpecClient's arguments, is its own context manager, and finds its server ready at once."""

    def __init__(self, *args, **kwargs):
        del args, kwargs

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def wait_ready(self, timeout_s=0):
        del timeout_s

    def deployment_facts(self):
        """A foreign repository: its configs say nothing (no tokenizer, streaming unknown)."""
        return {}
