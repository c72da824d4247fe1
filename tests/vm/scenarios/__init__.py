"""VM scenarios, one module per area; importing them registers the scenarios."""

from . import device, verbs, perftest, rdmacm, async_events, pyverbs_suite, interop, tap  # noqa: F401
from . import ibta15  # noqa: F401
from . import lifecycle  # noqa: F401  (last: it reloads the driver)
