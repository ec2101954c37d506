"""``server.holders.HeadHolders``: who holds each experiment's current head, within its bounds."""

from __future__ import annotations

from protocol.clock import ManualClock
from protocol.hashing import content_id
from protocol.ids import HeadId
from protocol.signing import peer_id_from_public_key
from server.holders import HeadHolders, Holders

HEAD, NEXT = HeadId(content_id(b"head 1")), HeadId(content_id(b"head 2"))
PEERS = [peer_id_from_public_key(bytes([i]) * 32) for i in range(10)]
ASKER = peer_id_from_public_key(b"\xff" * 32)


def joined(_: str) -> bool:
    return True


def test_a_new_head_forgets_the_holders_of_the_last() -> None:
    holders = HeadHolders(ManualClock())
    holders.announce("s/e/r", HEAD, PEERS[0], recorded=True)
    holders.announce("s/e/r", NEXT, PEERS[1], recorded=True)
    assert holders.ask("s/e/r", NEXT, ASKER, joined).peers == [PEERS[1]]
    assert holders.ask("s/e/r", HEAD, ASKER, joined).peers == []
    assert holders.ask("s/e/other", NEXT, ASKER, joined).peers == []


def test_holders_are_bounded_in_number_age_and_answer_size() -> None:
    clock = ManualClock()
    holders = HeadHolders(clock, max_holders=4, ttl_s=60.0, max_answer=3)
    for peer in PEERS[:6]:
        holders.announce("s/e/r", HEAD, peer, recorded=True)
    kept = set(PEERS[2:6])  # the latest four announcers
    answer = holders.ask("s/e/r", HEAD, ASKER, joined).peers
    assert len(answer) == 3 and set(answer) <= kept
    assert set(holders.ask("s/e/r", HEAD, PEERS[2], joined).peers) == kept - {PEERS[2]}
    assert holders.ask("s/e/r", HEAD, ASKER, lambda peer: peer == PEERS[5]).peers == [PEERS[5]]
    clock.advance(61.0)
    assert holders.ask("s/e/r", HEAD, ASKER, joined).peers == []


def test_askers_spread_over_the_holders_in_a_reproducible_order() -> None:
    holders = HeadHolders(ManualClock())
    for peer in PEERS:
        holders.announce("s/e/r", HEAD, peer, recorded=True)
    firsts = {holders.ask("s/e/r", HEAD, asker, joined).peers[0] for asker in PEERS}
    assert len(firsts) > 3
    assert holders.ask("s/e/r", HEAD, ASKER, joined) == holders.ask("s/e/r", HEAD, ASKER, joined)


def test_later_askers_wait_for_the_first_one_fetching_the_head_from_the_edge() -> None:
    clock = ManualClock()
    holders = HeadHolders(clock, fetching_s=10.0)
    first, second = PEERS[0], PEERS[1]
    assert holders.ask("s/e/r", HEAD, first, joined) == Holders([], fetching=False)  # goes to the edge at once
    assert holders.ask("s/e/r", HEAD, second, joined) == Holders([], fetching=True)  # waits for it
    assert holders.ask("s/e/r", HEAD, first, joined) == Holders([], fetching=False)
    holders.announce("s/e/r", HEAD, first, recorded=True)
    assert holders.ask("s/e/r", HEAD, second, joined) == Holders([first])
    assert holders.ask("s/e/r", NEXT, second, lambda peer: peer != first) == Holders([])
    assert holders.ask("s/e/r", NEXT, ASKER, joined) == Holders([], fetching=True)
    clock.advance(11.0)  # the first asker never announced: nobody waits on it any more
    assert holders.ask("s/e/r", NEXT, ASKER, joined) == Holders([], fetching=False)


def test_announcements_by_peers_without_a_record_never_crowd_out_those_with_one() -> None:
    """70 fresh keys announce the head (Sybils): an asker is offered the one holder whose work was
    accepted, and them only while no holder with a record is joined (a network that starts)."""
    holders = HeadHolders(ManualClock(), max_holders=64, max_answer=8)
    honest = PEERS[0]
    holders.announce("s/e/r", HEAD, honest, recorded=True)
    sybils = [peer_id_from_public_key((256 + i).to_bytes(2, "big") * 16) for i in range(70)]
    for sybil in sybils:
        holders.announce("s/e/r", HEAD, sybil, recorded=False)
    assert holders.ask("s/e/r", HEAD, ASKER, joined).peers == [honest]
    offered = holders.ask("s/e/r", HEAD, ASKER, lambda peer: peer != honest).peers  # the honest one left
    assert len(offered) == 8 and set(offered) <= set(sybils)
