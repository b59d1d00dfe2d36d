"""``kvtrace compact``: leave a trace directory as plain Parquet after a writer was killed."""

from __future__ import annotations

import argparse

from kvtrace.store.runs import DEFAULT_TRACES_DIR


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--traces",
        metavar="DIR",
        help=f"trace directory, all runs under it (default: KVTRACE_TRACES_DIR or ./{DEFAULT_TRACES_DIR})",
    )


def run(args: argparse.Namespace) -> int:
    """Delete what stopped writers left behind in a trace directory: batch files a rolled segment
    supersedes (their spans are all in that complete segment) and abandoned .tmp files older than
    an hour.  Writers do this themselves when they exit; a writer killed with SIGKILL cannot, and
    until this runs (or the next writer into the directory does it) a plain glob such as DuckDB's
    read_parquet('DIR/**/*.parquet') counts its rolled spans twice.  Safe while writers run: no span
    is deleted that is not in another complete file.  Then builds the missing per-file indexes of the
    session breakdown's scan (files of KVTRACE_SCAN_INDEX_MIN_BYTES or more; docs/query.md) and
    deletes stale ones.
    """
    import os

    from kvtrace.errors import CLIError
    from kvtrace.store import files
    from kvtrace.store.exporter import TMP_MAX_AGE_S
    from kvtrace.store.reader import build_indexes
    from kvtrace.store.runs import traces_dir

    directory = traces_dir(args.traces)
    if not os.path.isdir(directory):
        raise CLIError(f"trace directory {directory} does not exist")
    deleted = files.sweep_tree(directory, superseded_age_s=0.0, tmp_age_s=TMP_MAX_AGE_S)
    built = build_indexes(directory)
    print(
        f"kvtrace compact: {directory}: deleted {deleted} superseded or abandoned file{'s' * (deleted != 1)}; "
        f"{len(files.list_files(directory))} Parquet files remain; {len(built)} scan "
        f"index{'es' * (len(built) != 1)} built"
    )
    return 0
