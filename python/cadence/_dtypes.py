"""The element types cadence reduces and moves, by name: the one list every
other list of them in the package derives from.

`NAMES` is in the core's order (its wire codes), read from the compiled core
(`types::DType::ALL`, exposed as `_core.DTYPES`).
"""

from __future__ import annotations

from cadence import _core

NAMES: tuple[str, ...] = tuple(_core.DTYPES)
FLOATS: tuple[str, ...] = tuple(n for n in NAMES if "float" in n)
INTS: tuple[str, ...] = tuple(n for n in NAMES if "int" in n)
