"""vLLM's bidirectional KV reuse rules and the proxy's offer rule, as pure functions.

One copy of each rule, used by the simulator (:mod:`kvtrace.sim.scheduler` wraps them for one
request) and by the what-if replay (:mod:`kvtrace.analysis.whatif.replay`, which applies them to
arrays of recorded decisions at once).  Every function takes scalars or numpy arrays (they
broadcast) and uses only numpy element-wise operations, so a scalar call and an array call run
the same code.

Sources (vLLM 0.33.0 wheel, ``distributed/kv_transfer/kv_connector/v1/nixl/``):

- ``pull_scheduler.get_num_new_matched_tokens`` on P for a request carrying D's blocks
  (``do_remote_decode`` with ``remote_block_ids`` and the remote address):
  ``count = min(remote_num_tokens, prompt_tokens) - local_hit`` (:func:`pull_count`);
  ``count <= 0``: nothing to load; ``0 < count < kv_recompute_threshold`` (threshold > 0):
  recompute (:func:`below_threshold`); else load ``count`` tokens asynchronously (:func:`loads`).
- ``pull_worker._is_turn2_read_expired``: P declines the read when ``now + 5 s >= D's
  remote_blocks_expiry_time``, i.e. when D's blocks have at most 5 s left
  (:func:`read_declined`); ``kv_load_failure_policy`` then applies (``fail``, the default, fails
  the request).
- kvtrace's outcome of P's d2p decision (:func:`d2p_outcome`, codes index
  :data:`kvtrace.semconv.OUTCOMES`): not offered -> ``no_remote``; ``count <= 0`` ->
  ``local_hit`` (``no_remote`` when the local hit is 0 too); below threshold ->
  ``below_threshold``; else ``pulled`` (``expired`` / ``failed`` replace it when the load does not
  happen).
- Verification (:mod:`kvtrace.kvdigest`, kvtrace's own rule, not vLLM's): P knows how many of
  its prompt's tokens D's digest proves (``verified``).  Under ``verify=enforce`` P loads at most
  those: ``min(verified, prompt) - local_hit`` (:func:`verified_count`), pulled if that still
  clears the threshold, else outcome ``unverified`` (recomputed) (:func:`enforced_outcome`); under
  ``record`` vLLM's rule is unchanged and :func:`wrong_tokens` counts what it loads from KV of
  other tokens.
- The proxy (``kvtrace.proxy.table.ConversationTable.begin``, as upstream's
  ``disagg_proxy_multiturn.py``) offers D's blocks while the conversation entry's age is at most
  its ``--conversation-ttl`` (:func:`entry_offered`).
"""

from __future__ import annotations

import numpy as np

from kvtrace import semconv as sc

EXPIRY_SAFETY_MARGIN_S = 5.0  # pull_worker._KV_BLOCKS_EXPIRY_SAFETY_MARGIN

# outcome codes: index into sc.OUTCOMES
CODE = {name: i for i, name in enumerate(sc.OUTCOMES)}
PULLED, BELOW_THRESHOLD, EXPIRED = CODE[sc.OUTCOME_PULLED], CODE[sc.OUTCOME_BELOW_THRESHOLD], CODE[sc.OUTCOME_EXPIRED]
NO_REMOTE, LOCAL_HIT, FAILED = CODE[sc.OUTCOME_NO_REMOTE], CODE[sc.OUTCOME_LOCAL_HIT], CODE[sc.OUTCOME_FAILED]
UNVERIFIED = CODE[sc.OUTCOME_UNVERIFIED]


def pull_count(remote_num_tokens, prompt_tokens, local_hit):
    """Tokens P would load from D: ``min(remote_num_tokens, prompt_tokens) - local_hit``."""
    return np.minimum(remote_num_tokens, prompt_tokens) - local_hit


def below_threshold(count, threshold):
    """``0 < count < kv_recompute_threshold`` with the threshold on (> 0): P recomputes."""
    return np.logical_and(np.logical_and(threshold > 0, count > 0), count < threshold)


def loads(count, threshold):
    """P loads ``count`` tokens from D (there is something to load and it is not below threshold)."""
    return np.logical_and(count > 0, np.logical_not(below_threshold(count, threshold)))


def read_declined(remaining_s):
    """P's worker declines the read: D's blocks expire within the 5 s safety margin (or already
    have).  ``remaining_s`` = D's expiry time minus now; NaN (no expiry known) never declines."""
    return np.asarray(remaining_s, dtype=float) <= EXPIRY_SAFETY_MARGIN_S


def d2p_outcome(offered, count, local_hit, threshold):
    """Outcome code(s) of P's d2p decision before any load starts (``pulled`` is provisional)."""
    when_offered = np.where(
        count > 0,
        np.where(below_threshold(count, threshold), BELOW_THRESHOLD, PULLED),
        np.where(np.asarray(local_hit) > 0, LOCAL_HIT, NO_REMOTE),
    )
    return np.where(offered, when_offered, NO_REMOTE).astype(np.int8)


def entry_offered(age_s, ttl_s):
    """The proxy offers the conversation's cached D blocks while their age is at most its TTL."""
    return np.asarray(age_s) <= ttl_s


def verified_count(verified, prompt_tokens, local_hit):
    """Tokens P may load under ``verify=enforce``: the verified prefix beyond the local hit."""
    return np.minimum(verified, prompt_tokens) - local_hit


def enforced_outcome(code, count, vcount, threshold):
    """``verify=enforce``: a pull (``code`` = :data:`PULLED` from :func:`d2p_outcome`) of more
    than the ``vcount`` verified tokens loads only those if they still clear the threshold
    (:data:`PULLED`, ``vcount`` tokens), else :data:`UNVERIFIED` (P recomputes); any other code
    is unchanged."""
    trimmed = np.logical_and(np.asarray(code) == PULLED, np.asarray(vcount) < count)
    return np.where(trimmed, np.where(loads(vcount, threshold), PULLED, UNVERIFIED), code).astype(np.int8)


def enforced_pull(count, vcount, threshold):
    """Tokens P loads under ``verify=enforce`` (0 when it recomputes)."""
    pull = np.where(np.asarray(vcount) < count, vcount, count)
    return np.where(loads(pull, threshold), pull, 0)


def wrong_tokens(count, local_hit, verified, threshold):
    """Tokens vLLM's rule loads from KV of other tokens: ``local_hit + count`` (where P would load
    up to) minus ``max(verified, local_hit)``; 0 when the rule loads nothing."""
    wrong = np.maximum(0, np.asarray(local_hit) + count - np.maximum(verified, local_hit))
    return np.where(loads(count, threshold), wrong, 0)
