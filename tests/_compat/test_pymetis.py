"""What lightning-halo assumes about pymetis' internals (lightning_halo._compat.pymetis)."""

from __future__ import annotations

import ctypes

import numpy as np
import pymetis

from lightning_halo._compat.pymetis import metis_c_api


def test_the_extension_exports_metis_and_reports_its_index_width() -> None:
    lib, idx, keys = metis_c_api()
    assert idx in (ctypes.c_int32, ctypes.c_int64)
    assert keys == {"SEED": int(pymetis.OptionKey.SEED), "NUMBERING": int(pymetis.OptionKey.NUMBERING)}
    # METIS_SetDefaultOptions fills METIS_NOPTIONS (40) entries of idx_t with -1: the width is the one we use
    options = (idx * 41)()
    options[40] = 7
    lib.METIS_SetDefaultOptions(options)
    assert [options[i] for i in range(40)] == [-1] * 40 and options[40] == 7


def test_one_constraint_through_the_c_api_is_pymetis_own_partition() -> None:
    from lightning_halo.partition.metis_constraints import part_graph_constraints

    # a ring of 12 with chords: pymetis' part_graph and the C API, same seed and algorithm, same parts
    xadj = np.arange(0, 12 * 3 + 1, 3)
    adjncy = np.array([[(i - 1) % 12, (i + 1) % 12, (i + 6) % 12] for i in range(12)]).reshape(-1)
    for parts in (2, 3, 9):
        _, expected = pymetis.part_graph(parts, xadj=xadj, adjncy=adjncy, options=pymetis.Options(seed=1))
        assert part_graph_constraints(xadj, adjncy, np.ones(12, dtype=np.int64), parts, seed=1).tolist() == list(
            expected
        )
