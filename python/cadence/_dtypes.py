"""The element types cadence reduces and moves, by name: the one list every
other list of them in the package derives from.

`NAMES` is in the core's order (its wire codes), read from the compiled core
when it says so and written out here for a core that does not yet.
"""

from __future__ import annotations

from cadence import _core

# The core's DType::ALL; used only while `_core` has no DTYPES of its own.
_FALLBACK = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64")

NAMES: tuple[str, ...] = tuple(getattr(_core, "DTYPES", None) or _FALLBACK)
FLOATS: tuple[str, ...] = tuple(n for n in NAMES if "float" in n)
INTS: tuple[str, ...] = tuple(n for n in NAMES if "int" in n)
