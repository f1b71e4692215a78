"""What every backend's vector index shares: which model and size it holds, unit vectors, and
cosines from the L2 distances of unit vectors."""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Sequence

MAX_DIM = 8192
REINDEX_PENDING = "reindex_pending"  # meta key: the vectors were dropped for a new model


class VectorSizeError(ValueError):
    """An embedding does not have the dimension of the index."""


@dataclass(frozen=True)
class IndexInfo:
    """The vector index's embedding model and dimension."""
    model: str
    dim: int


def normalise(vector: Sequence[float]) -> list[float]:
    """`vector` scaled to length 1; VectorSizeError when it is zero or not finite."""
    norm = math.hypot(*vector)  # no overflow for huge components, unlike sqrt(sum(x * x))
    if not math.isfinite(norm) or norm == 0.0:
        raise VectorSizeError("embedding is zero or not finite")
    return [x / norm for x in vector]


def pack(vector: Sequence[float]) -> bytes:
    """`vector`, normalised, as float32 bytes (the stored form)."""
    return struct.pack(f"{len(vector)}f", *normalise(vector))


def cosine_from_distance(distance: float) -> float:
    """The cosine of two unit vectors from their L2 distance: 1 - d^2 / 2."""
    return 1.0 - distance * distance / 2.0


def usable_dim(dim: int) -> bool:
    """Whether an index can hold vectors of `dim` dimensions."""
    return 1 <= dim <= MAX_DIM
