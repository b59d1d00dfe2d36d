"""Writing Parquet files into a trace directory: partitioning, atomic writes, segment merges.

Used by :class:`kvtrace.store.exporter.ParquetSpanExporter`.  Every file is written complete
under a dot ``.tmp`` name in its final directory and then ``os.replace``-d to its real name, so
readers (which ignore dot-files) only ever see whole files.  Batch files (on the export path)
are written as they come at a fast zstd level; segments (one writer's batch files merged, in
export order) are compressed harder.

Choices made on ``benchmarks/store/bench_store.py``'s measurements (docs/benchmarks.md): a batch
file has a fixed cost (writer set-up, one zstd context per compressed page, footer) on top of the
per-row work, so the files are serialised in memory and written with one ``write``; tiny
dictionary-encoded columns are stored uncompressed (compressing a few bytes costs a zstd context
each).  Merges read with ``use_threads=False`` (the exporter thread shares the host's cores;
Arrow's thread pool cost more than it saved) and keep export order: spans of one trace end
within seconds of each other, so they already sit in neighbouring batches, and a
(TraceId, Timestamp) sort made segments no smaller while costing more CPU than the rest of the
merge (row-group statistics on random trace ids prune nothing either way).
"""

from __future__ import annotations

import datetime as dt
import functools
import os
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kvtrace.store import files
from kvtrace.store.schema import SCHEMA

HOUR_NS = 3_600_000_000_000
# batch files are written on the export path (fast level); segments are merged off it (smaller)
BATCH_ZSTD_LEVEL = 1
SEGMENT_ZSTD_LEVEL = 6
SEGMENT_ROW_GROUP = 1 << 17
# measured on bench_store spans: delta encodings beat dictionaries for these columns
_ENCODINGS = {
    "Timestamp": "DELTA_BINARY_PACKED",
    "Duration": "DELTA_BINARY_PACKED",
    "SpanId": "DELTA_BYTE_ARRAY",
    "ParentSpanId": "DELTA_BYTE_ARRAY",
}


def partition_dir(hour_bucket: int) -> str:
    """``date=YYYY-MM-DD/hour=HH`` (UTC) for an hour bucket (epoch ns // HOUR_NS)."""
    t = dt.datetime.fromtimestamp(hour_bucket * 3600, tz=dt.UTC)
    return f"date={t:%Y-%m-%d}/hour={t:%H}"


def split_by_partition(table: pa.Table) -> list[tuple[str, pa.Table]]:
    """[(partition dir, rows whose span start falls in it)] - usually one entry per batch."""
    buckets = np.asarray(pc.divide(table["Timestamp"].cast(pa.int64()), HOUR_NS).combine_chunks())
    if len(buckets) == 0:
        return []
    first = buckets[0]
    if (buckets == first).all():
        return [(partition_dir(int(first)), table)]
    return [(partition_dir(int(b)), table.filter(pa.array(buckets == b))) for b in np.unique(buckets)]


# dictionary-encoded, few distinct values per file: a handful of bytes per page either way
_UNCOMPRESSED = (
    "TraceState",
    "SpanName",
    "SpanKind",
    "ServiceName",
    "ScopeName",
    "ScopeVersion",
    "StatusCode",
    "StatusMessage",
)
# Parquet leaf paths of map keys (a few hundred distinct) and resource values (a few per
# writer): dictionary-encoded in segments, where they would otherwise be most of the raw bytes
_SEGMENT_DICTIONARY = tuple(
    f"{m}.key_value.key" for m in ("ResourceAttributes", "SpanAttributes", "SpanAttributesInt", "SpanAttributesFloat")
) + ("ResourceAttributes.key_value.value",)


def _leaf_paths(name: str, type_: pa.DataType) -> list[str]:
    """Parquet column paths of an Arrow field (how per-column writer options address them)."""
    if pa.types.is_map(type_):
        return [
            *_leaf_paths(f"{name}.key_value.key", type_.key_type),
            *_leaf_paths(f"{name}.key_value.value", type_.item_type),
        ]
    if pa.types.is_list(type_):
        return _leaf_paths(f"{name}.list.element", type_.value_type)
    return [name]


_LEAVES = [path for field in SCHEMA for path in _leaf_paths(field.name, field.type)]
_DICTIONARY = [c for c in SCHEMA.names if c not in _ENCODINGS]
_STATISTICS = ["Timestamp", "TraceId", "SpanName", "ServiceName"]


@functools.lru_cache(maxsize=8)
def _write_options(level: int, segment: bool) -> dict:
    """Batch files leave tiny columns uncompressed; segments (~1M rows) compress everything."""
    zstd = _LEAVES if segment else [c for c in _LEAVES if c not in _UNCOMPRESSED]
    return dict(
        compression={c: ("zstd" if c in zstd else "none") for c in _LEAVES},
        compression_level={c: level for c in zstd},
        use_dictionary=_DICTIONARY + list(_SEGMENT_DICTIONARY) if segment else _DICTIONARY,
        column_encoding=_ENCODINGS,
        write_statistics=_STATISTICS,
        row_group_size=1 << 20,
    )


def write_atomic(
    table: pa.Table,
    directory: str,
    name: str,
    *,
    level: int = BATCH_ZSTD_LEVEL,
    segment: bool = False,
    fsync: bool = False,
) -> int:
    """Write ``table`` as ``directory/name`` via a dot-tmp file + rename; return its bytes.

    ``fsync``: the file's data, then its directory entry (and those of directories created
    for it), are on stable storage when this returns, so the file survives an OS crash or a
    power loss, not only a crash of this process."""
    makedirs(directory, fsync=fsync)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **_write_options(level, segment))
    data = sink.getvalue()

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    _publish(directory, name, write, fsync=fsync)
    return data.size


def _publish(directory: str, name: str, write: Callable[[str], None], *, fsync: bool = False) -> int:
    """Make ``directory/name`` appear complete or not at all: ``write(tmp)`` fills a dot-tmp file
    (which readers skip), then it is renamed over ``name``; return its bytes.  On any failure
    the tmp file is removed.  ``fsync``: the file's data before the rename (a file that
    supersedes others must be durable before it is visible), the directory entry after it."""
    final = os.path.join(directory, name)
    tmp = os.path.join(directory, files.tmp_name(name))
    try:
        write(tmp)
        size = os.path.getsize(tmp)
        if fsync:
            fsync_path(tmp)
        os.replace(tmp, final)
    except BaseException:
        unlink_quietly(tmp)
        raise
    if fsync:
        fsync_path(directory)
    return size


def fsync_path(path: str) -> None:
    """``fsync`` a file (its data) or a directory (its entries: renames, new files)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs(directory: str, *, fsync: bool = False) -> None:
    """``os.makedirs(directory, exist_ok=True)``; with ``fsync``, the entry of each directory it
    creates is made durable in that directory's parent."""
    missing = []
    path = os.path.abspath(directory)
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    if not missing:
        return
    os.makedirs(directory, exist_ok=True)
    if fsync:
        for path in missing:
            fsync_path(os.path.dirname(path))


def merge(paths: list[str], directory: str, name: str, *, fsync: bool = False) -> int:
    """Merge complete files ``paths`` (one writer's batch files) into segment ``name``, in export
    order and streaming: at most about one row group (:data:`SEGMENT_ROW_GROUP` rows) of decoded
    spans is held in memory, not the whole segment (``KVTRACE_ROLL_BYTES`` of batch files, many
    times that decoded)."""
    options = dict(_write_options(SEGMENT_ZSTD_LEVEL, True))
    del options["row_group_size"]

    def write(tmp: str) -> None:
        with pq.ParquetWriter(tmp, SCHEMA, **options) as out:
            pending: list[pa.Table] = []
            rows = 0
            for path in paths:
                pending.append(pq.ParquetFile(path).read(use_threads=False).cast(SCHEMA))
                rows += pending[-1].num_rows
                if rows >= SEGMENT_ROW_GROUP:
                    out.write_table(pa.concat_tables(pending), row_group_size=rows)
                    pending, rows = [], 0
            if pending:
                out.write_table(pa.concat_tables(pending), row_group_size=rows)

    return _publish(directory, name, write, fsync=fsync)


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
