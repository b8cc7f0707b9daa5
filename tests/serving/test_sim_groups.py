"""The simulator's stand-in token ids (`core.serving.sim_groups`) against their definition written out here id by
id: prefix g's token j is 3 x 2^40 + g x 2^23 + j in a conversation's stream (1e9 + g x 4096 + j in a plain
prompt), the rest the conversation's (request's) own; requests of one prefix group hold the same id objects for
their prefix (the KV core then compares a shared prefix by identity), and sequences past the first repeat their
own output id."""

from core.serving.sim_groups import make_groups
from core.serving.workload import Request


def stream_id(req: Request, pidx, j: int) -> int:
    plen = req.prefix_len if pidx is not None else 0
    if j < plen:
        return (3 << 40) + pidx * (1 << 23) + j
    return (1 << 50) + req.conversation * (1 << 27) + (j - plen)


def plain_id(req: Request, pidx, j: int) -> int:
    plen = req.prefix_len if pidx is not None else 0
    return 1_000_000_000 + pidx * 4096 + j if j < plen else 2_000_000_000 + req.request_id * 4096 + j


def test_token_ids_follow_their_definition_and_share_a_prefix_by_identity():
    requests = [
        Request(0, 0.0, 40, 6, 1, "a", 24, conversation=0),
        Request(1, 0.1, 30, 5, 2, "b", 24, conversation=1),
        Request(2, 0.2, 50, 4, 1, "a", 24, conversation=2),
        Request(3, 0.3, 20, 3, 1, None, 0, conversation=3),
        Request(4, 0.4, 33, 3, 1, "a", 24),  # a plain prompt of prefix a
        Request(5, 0.5, 40, 3, 1, "a", 24),
        Request(6, 0.6, 12, 3, 1, None, 0),
    ]
    groups = make_groups(requests, with_token_ids=True)
    pidx = {"a": 0, "b": 1, None: None}
    for group, req in zip(groups, requests, strict=True):
        p = pidx[req.prefix_group]
        total = req.prompt_len + req.output_len
        for start in range(0, total + 1, 7):
            for stop in range(start, total + 1, 5):
                for seq in range(req.n):
                    got = list(group.token_ids(seq, start, stop))
                    if req.conversation is not None and seq == 0:
                        want = [stream_id(req, p, j) for j in range(start, stop)]
                    else:
                        own = group.output_token[seq]
                        ids = stream_id if req.conversation is not None else plain_id
                        want = [ids(req, p, j) if j < req.prompt_len else own for j in range(start, stop)]
                    assert got == want, (req.request_id, seq, start, stop)
    first, third = groups[0].token_ids(0, 0, 24), groups[2].token_ids(0, 0, 24)
    assert all(x is y for x, y in zip(first, third, strict=True))  # one prefix's id objects
    plain = groups[4].token_ids(0, 0, 24), groups[5].token_ids(0, 0, 24)
    assert all(x is y for x, y in zip(*plain, strict=True))
    assert make_groups(requests, with_token_ids=False)[4].prompt_tokens == []
