"""pgvector's text and binary forms of a vector, as PostgreSQL's statements send them."""
from __future__ import annotations

import struct
from typing import Any, Sequence

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

from bot.memory.vectors import index as vectors


def vector_literal(vector: Sequence[float]) -> str:
    """pgvector's text form of the L2-normalised vector."""
    return "[" + ",".join(repr(float(x)) for x in vectors.normalise(vector)) + "]"


class VectorBinary(bytes):
    """pgvector's binary form of a vector (what `vector_recv` reads), sent as a binary parameter
    of an unnamed type: the statement's `%s::vector` makes it one. It costs a small fraction of the
    CPU of the text form (`vector_literal`: repr of each float, then parsed by the server),
    inside the fact write's lock. The same float4 values are stored."""


class _VectorBinaryDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        return bytes(obj)


psycopg.adapters.register_dumper(VectorBinary, _VectorBinaryDumper)


def vector_binary(vector: Sequence[float]) -> VectorBinary:
    """The L2-normalised vector in pgvector's binary form: dimensions, a zero, float4s (big-endian)."""
    values = vectors.normalise(vector)
    return VectorBinary(struct.pack(f">HH{len(values)}f", len(values), 0, *values))
