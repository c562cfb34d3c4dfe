"""pymetis internals lightning-halo relies on (pinned by ``tests/_compat/test_pymetis.py``).

pymetis' ``part_graph`` passes one weight per node. Its extension module links METIS in and
exports METIS' C API; pymetis reports the index width it was built with
(``pymetis._internal._idx_type_width``, a private function) and names METIS' option indices
(``pymetis.OptionKey``, public). :mod:`~lightning_halo.partition.metis_constraints` calls that API
for several balance constraints.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any


class MetisUnavailable(RuntimeError):
    """The installed pymetis does not export METIS' C API (or reports no usable index width)."""


@functools.lru_cache(maxsize=1)
def metis_c_api() -> tuple[Any, type, dict[str, int]]:
    """METIS' C API in pymetis' extension module: ``(library, idx_t as a ctypes type, option indices)``.

    Raises:
        MetisUnavailable: pymetis is missing, does not export the functions, or reports an index width other
            than 32 or 64 bits.
    """
    try:
        import pymetis
        import pymetis._internal as internal

        width = int(internal._idx_type_width())
        lib = ctypes.CDLL(internal.__file__)  # loaded by the import already: the same handle
        for name in ("METIS_SetDefaultOptions", "METIS_PartGraphKway", "METIS_PartGraphRecursive"):
            getattr(lib, name)
        keys = {name: int(getattr(pymetis.OptionKey, name)) for name in ("SEED", "NUMBERING")}
    except (ImportError, AttributeError, OSError) as exc:
        raise MetisUnavailable(f"pymetis does not expose METIS' C API here ({exc}); several balance constraints "
                               "need a pymetis (>= 2023) that exports it") from exc  # fmt: skip
    if width not in (32, 64):
        raise MetisUnavailable(f"pymetis reports METIS indices of {width} bits; 32 or 64 expected")
    return lib, ctypes.c_int64 if width == 64 else ctypes.c_int32, keys
