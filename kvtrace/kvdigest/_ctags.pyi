"""Types of the C extension kvtrace/kvdigest/_ctags.c (the same functions as _pytags)."""

from collections.abc import Sequence

def keyed(key: bytes, /) -> bytes: ...
def set_keys(version: str, chunk: str, n: str, tags: str, fp: str, /) -> None: ...
def tags_v1(
    state: bytes,
    engine_id: object,
    request_id: object,
    block_ids: object,
    tokens: Sequence[int],
    n: int,
    chunk: int,
    last_only: bool,
    /,
) -> bytes: ...
def tags_v2(
    state: bytes,
    engine_id: object,
    request_id: object,
    block_ids: object,
    block_hashes: Sequence[bytes],
    tokens: Sequence[int],
    n: int,
    hbs: int,
    chunk: int,
    last_only: bool,
    /,
) -> bytes: ...
def check(
    state: bytes,
    offer: object,
    tokens: Sequence[int],
    limit: int,
    engine_id: object,
    request_id: object,
    block_ids: object,
    block_hashes: Sequence[bytes] | None,
    blocks: object,
    /,
) -> tuple[int, int]: ...
