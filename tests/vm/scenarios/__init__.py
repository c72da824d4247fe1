"""VM scenarios, one module per area; importing them registers the scenarios."""

from . import device, verbs, perftest, rdmacm, async_events, pyverbs_suite, interop, tap  # noqa: F401
