# SPDX-License-Identifier: Apache-2.0
"""The lookup drafter's acceptance prior, counted from finished sequences (``lookup_prior.json``).

Every output position of a finished sequence is a point where the lookup drafter could have proposed: the
index holds the tokens before it, and the tokens that follow are what the target committed. Comparing the two
(:meth:`AcceptanceTable.observe_continuation`) is exact evidence of the lookup block's acceptance, with no
lookup round ever run: the committed tokens are distributed as the target's, so a match at position ``j`` has
the probability with which the rejection sampler would accept the deterministic draft ``j``.
"""

from __future__ import annotations

from collections.abc import Sequence

from dspark.decoding.acceptance import AcceptanceTable
from dspark.decoding.lookup import LookupConfig, LookupIndex, match_class

__all__ = ["lookup_prior_from_sequences"]


def lookup_prior_from_sequences(
    sequences: Sequence[Sequence[int]],
    starts: Sequence[int],
    config: LookupConfig,
    gamma: int,
) -> AcceptanceTable:
    """Count lookup acceptance at every output position of ``sequences``.

    For sequence ``i`` the index is built over ``seq[:starts[i]]`` (the prompt); then at each ``t`` in
    ``[starts[i], len(seq))`` the proposal ``propose(γ)`` from ``seq[:t]`` is compared with ``seq[t:t + γ]``
    (shorter at the end: the rest is censored) under the proposal's class (``match_class``: its match length
    and extent), and ``seq[t]`` is appended.
    An empty proposal counts nothing.

    Parameters
    ----------
    sequences : sequence of sequences of int
        ``N`` token-id lists, each the prompt followed by the generated output.
    starts : sequence of int
        ``(N,)`` prompt length of each sequence, in ``[0, len(seq)]``.
    config : LookupConfig
        The index's match lengths (the table has ``num_match_classes(config)`` classes).
    gamma : int
        Proposal length (the drafter's γ), >= 1.

    Returns
    -------
    AcceptanceTable
        The raw counts in its observations (no prior), ``meta`` holding ``min_match``, ``max_match`` and
        ``extent_bounds``; ``to_dict()`` is the prior file (set ``meta["temperature"]`` and ``meta["source"]``
        first).
    """
    if not isinstance(config, LookupConfig):
        raise ValueError(f"config: must be a LookupConfig, got {type(config).__name__}")
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma: must be an int >= 1, got {gamma!r}")
    if len(starts) != len(sequences):
        raise ValueError(f"starts: {len(starts)} entries for {len(sequences)} sequences")
    table = AcceptanceTable.for_lookup(config, gamma)
    table.meta["min_match"] = config.min_match
    for i, (seq, start) in enumerate(zip(sequences, starts, strict=True)):
        seq = list(seq)
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= len(seq):
            raise ValueError(f"starts[{i}]: must be an int in [0, {len(seq)}], got {start!r}")
        index = LookupIndex(config)
        index.extend(seq[:start])
        for t in range(start, len(seq)):
            proposal = index.propose(gamma)
            if proposal:
                cls = match_class(config, index.match_length, index.match_extent)
                table.observe_continuation(cls, proposal, seq[t : t + gamma])
            index.extend(seq[t : t + 1])
    return table
