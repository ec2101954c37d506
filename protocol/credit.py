"""Which verdicts count toward a contributor's credit and standing: the rule every party applies alike
(the edge as it takes verdicts in; anyone re-tallying from the public heads, candidates and verdicts).

A verdict decides one candidate. The canonical heads that can decide it are the head after the
candidate's base and the one after that (a candidate that came late is merged one window later, as
a delayed update): its *deciding heads*, as far as they exist. Against them a verdict ``settle``\\s as

    BORNE_OUT    an acceptance naming the deciding head that merged the candidate, or a rejection once
                 both deciding heads exist and neither merged it
    PENDING      the lineage does not decide it yet
    CONTRADICTS  it names another trainer or base than the candidate's own, accepts what no deciding
                 head merged (or names a head that did not merge it), or rejects what one merged

A verdict that is not contradicted ``counts`` when it is a rejection the lineage bears out, or when
``quorum`` distinct validators signed the same decision (``same_decision``): rejected, or accepted
into the same head vouching for the same examples. An acceptance always needs the quorum: heads show
what was merged, not what its work earned (``vouched``: validators credit only work with evidence that
it trained on its lease). The examples credited are the vouched ones, capped by what the candidate
declared and its lease covers (``credited_examples``), never a verdict's number alone.

So one validator key of a k-of-n quorum (k > 1) can neither mint credit (its acceptances count only
with k - 1 others signing the same) nor erase it (a rejection of merged work contradicts its head; a
rejection of unmerged work counts only with the quorum or once the lineage decides).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

from .ids import HeadId
from .manifests import FetchManifest
from .messages import Candidate, HeadDescriptor, Lease, Verdict

__all__ = [
    "DECIDING_HEADS",
    "Settled",
    "agree",
    "counts",
    "credited_examples",
    "leased_examples",
    "same_decision",
    "settle",
    "vouched",
]

DECIDING_HEADS = 2  # the head after a candidate's base, and the one after it (a delayed update)


class Settled(enum.Enum):
    BORNE_OUT = "borne out"
    PENDING = "pending"
    CONTRADICTS = "contradicts"


def settle(verdict: Verdict, candidate: Candidate, deciding: Sequence[HeadDescriptor]) -> tuple[Settled, str]:
    """How ``verdict`` on ``candidate`` stands against its ``deciding`` canonical heads (the head
    after its base, then the one after that, as far as they exist), with the reason in words."""
    cid = candidate.candidate_id
    if (verdict.peer_id, verdict.base_head) != (candidate.peer_id, candidate.base_head):
        return Settled.CONTRADICTS, f"candidate {cid} is {candidate.peer_id}'s on {candidate.base_head}"
    merged_by = next((head.head_id for head in deciding if cid in head.merged), None)
    if merged_by is not None:
        if verdict.accepted and verdict.head_id == merged_by:
            return Settled.BORNE_OUT, f"canonical head {merged_by} merged it"
        return Settled.CONTRADICTS, f"canonical head {merged_by} merged {cid}"
    if verdict.accepted and verdict.head_id in {head.head_id for head in deciding}:
        return Settled.CONTRADICTS, f"canonical head {verdict.head_id} did not merge {cid}"
    if len(deciding) >= DECIDING_HEADS:
        if verdict.accepted:
            return Settled.CONTRADICTS, f"no canonical head merged {cid}"
        return Settled.BORNE_OUT, f"no canonical head merged {cid}"
    return Settled.PENDING, f"no canonical head decides {cid} yet"


def vouched(verdict: Verdict) -> int:
    """The examples ``verdict`` vouches its candidate's work earned: its ``examples`` metric when it
    accepts (whole examples, at least 0), else 0."""
    return max(int(verdict.metrics.get("examples", 0.0)), 0) if verdict.accepted else 0


def _decision(verdict: Verdict) -> tuple[bool, HeadId | None, int]:
    return verdict.accepted, verdict.head_id if verdict.accepted else None, vouched(verdict)


def agree(verdict: Verdict, other: Verdict) -> bool:
    """Whether two verdicts make the same decision: rejected, or accepted into the same head vouching
    for the same examples."""
    return _decision(verdict) == _decision(other)


def same_decision(verdict: Verdict, votes: Iterable[Verdict], validator_keys: frozenset[bytes]) -> int:
    """How many distinct listed validators signed the decision of ``verdict`` (accepted into the same
    head vouching for the same examples, or rejected) among ``votes`` and ``verdict`` itself (whose
    signatures the caller checked)."""
    signers = {v.validator_key for v in (verdict, *votes) if agree(v, verdict)}
    return len(signers & validator_keys)


def counts(verdict: Verdict, settled: Settled, agreeing: int, quorum: int) -> bool:
    """Whether ``verdict``, ``settled`` so against the lineage and signed alike by ``agreeing``
    validators (``same_decision``), counts now."""
    if settled is Settled.CONTRADICTS:
        return False
    if settled is Settled.BORNE_OUT and not verdict.accepted:
        return True
    return agreeing >= quorum


def leased_examples(lease: Lease, manifest: FetchManifest, local_epochs: int) -> int:
    """The examples a candidate trained on ``lease`` (of ``manifest``'s shards) can have seen: its
    shards' examples × the experiment's ``local_epochs``."""
    return sum(manifest.shard(s).examples for s in lease.shard_ids) * local_epochs


def credited_examples(verdict: Verdict, candidate: Candidate, leased: int) -> int:
    """The examples a counted ``verdict`` credits ``candidate``'s trainer with: what it vouches for, at
    most the candidate's declared count and the ``leased`` examples (0 for a rejection)."""
    return min(vouched(verdict), candidate.examples, leased)
