"""``python -m minirl.interop``: each preset of ``ALGORITHMS`` in TRL and verl (``engine_equivalents``)."""

import pprint

from .table import engine_equivalents

pprint.pprint(engine_equivalents(), width=118, sort_dicts=False)
