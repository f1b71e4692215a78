"""bench.partial: recall@10 of a partially held key, on vectors small enough to check by hand."""
from __future__ import annotations

import numpy as np

from bench import partial as bench_partial
from bot.memory.vectors import partial


def test_recall_is_whole_when_every_row_is_read_back_and_the_settings_are_put_back():
    rng = np.random.default_rng(2)
    base = bench_partial.unit_rows(rng.standard_normal((150, 32)))
    queries = bench_partial.unit_rows(rng.standard_normal((10, 32)))
    assert bench_partial.recall_at_10(base, queries) == 1.0  # 150 rows: all of them read back
    assert bench_partial.recall_at_10(base, queries, rescore=10) < 1.0  # ten read back: the codes alone choose
    assert (partial.RESCORE_MIN, partial.RESCORE_PER_K) == (160, 10)
    ranks = bench_partial.worst_ranks(base, queries)
    assert all(10 <= rank <= 150 for rank in ranks["hamming"] + ranks["codes"])
