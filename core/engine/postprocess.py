"""After the forward pass: turn each request's logits into tokens, fork / free sequences, finish outputs.

A group is processed once every live sequence has its `pending_logits` (the logits after its last token):
- sampling (n >= 1): the n sequences were forked at admission (they share every prompt block; the shared
  partially filled last block is copied on each one's first write but the last), so right after the prompt's
  prefill they hold the same logits and make n draws; later each draws its own next token.
- beam search (width k): the 2k best (beam, token) continuations by cumulative logprob are taken, as
  transformers does; those ending in EOS / a stop token among the first k become finished hypotheses, and the
  best k others continue: a beam chosen c times is kept for its first continuation and forked c - 1 times, a beam
  never chosen is freed. The run stops at max_tokens, or when k hypotheses are finished and none of the running
  beams scores better (transformers' `early_stopping=False` rule with length_penalty 1.0).
Sampling writes no KV memory: the sequences it ends or forks are recorded on the group (`kv_changes`, in order)
and `EngineMemory` applies them when the scheduler postprocesses the step, after marking the step's tokens
computed (so the scheduler, through its memory, is the only writer of KV memory).
"""

from collections.abc import Callable

import torch

from core.engine.sampling import beam_candidates, sample
from core.engine.sequence import CompletionOutput, RequestOutput, Sequence, SequenceGroup


def _finish_reason(seq: Sequence, group: SequenceGroup, eos: tuple[int, ...]) -> str | None:
    params = group.params
    token = seq.token_ids[-1]
    if (not params.ignore_eos and token in eos) or token in params.stop_token_ids:
        return "stop"
    if seq.num_output >= params.max_tokens:
        return "length"
    return None


def _append(seq: Sequence, token: int, logprobs: torch.Tensor, logits: torch.Tensor) -> None:
    seq.token_ids.append(token)
    seq.cumulative_logprob += float(logprobs[token])
    if seq.logits is not None:
        seq.logits.append(logits)


def process_group(group: SequenceGroup, new_seq_id: Callable[[], int], eos: tuple[int, ...]) -> int:
    """Sample (or take a beam step) for the group from its sequences' pending logits; returns tokens emitted.
    Sequences that end or fork are recorded in `group.kv_changes` for the memory to apply."""
    if group.params.use_beam_search:
        return _beam_step(group, new_seq_id, eos)
    params = group.params
    seqs = group.seqs
    logits = torch.stack([s.pending_logits for s in seqs])  # [num_seqs, vocab]
    for seq in seqs:
        seq.pending_logits = None
    group.started_sampling = True
    tokens = sample(logits, params, group.generator)
    logprobs = torch.log_softmax(logits, dim=-1)
    for row, (seq, token) in enumerate(zip(seqs, tokens, strict=True)):
        _append(seq, token, logprobs[row], logits[row])
    _retire_finished(group, eos)
    return len(tokens)


def _retire_finished(group: SequenceGroup, eos: tuple[int, ...]) -> None:
    alive = []
    for seq in group.seqs:
        reason = _finish_reason(seq, group, eos)
        if reason is None:
            alive.append(seq)
        else:
            seq.finish_reason = reason
            group.kv_changes.append((seq, None))
            group.finished.append(seq)
    group.seqs = alive


def _beam_step(group: SequenceGroup, new_seq_id: Callable[[], int], eos) -> int:
    params = group.params
    k = params.beam_width
    beams = group.seqs
    logits = torch.stack([s.pending_logits for s in beams])  # [num_beams, vocab]
    for seq in beams:
        seq.pending_logits = None
    group.started_sampling = True
    logprobs = torch.log_softmax(logits, dim=-1)
    ends = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos))
    chosen: list[tuple[int, int, float]] = []
    for rank, (b, token, score) in enumerate(
        beam_candidates(logprobs, [s.cumulative_logprob for s in beams], 2 * k)
    ):
        if token in ends:
            if rank < k:
                hyp = beams[b].fork(-1)
                hyp.num_allocated = hyp.num_computed = 0
                hyp.token_ids.append(token)
                hyp.cumulative_logprob = score
                hyp.finish_reason = "stop"
                group.finished.append(hyp)
        elif len(chosen) < k:
            chosen.append((b, token, score))
    by_parent: dict[int, list[tuple[int, float]]] = {}
    for b, token, score in chosen:
        by_parent.setdefault(b, []).append((token, score))
    survivors = []
    for b, beam in enumerate(beams):
        picks = by_parent.get(b)
        if not picks:
            group.kv_changes.append((beam, None))
            continue
        for token, score in picks[1:]:
            child = beam.fork(new_seq_id())
            group.kv_changes.append((beam, child))
            child.token_ids.append(token)
            child.cumulative_logprob = score
            survivors.append(child)
        beam.token_ids.append(picks[0][0])
        beam.cumulative_logprob = picks[0][1]
        survivors.append(beam)
    group.seqs = survivors
    length = survivors[0].num_output if survivors else 0
    finished = sorted((_beam_score(s) for s in group.finished), reverse=True)
    if survivors and (
        length >= params.max_tokens
        or (len(finished) >= k and max(s.cumulative_logprob for s in survivors) / length <= finished[k - 1])
    ):
        for seq in survivors:
            seq.finish_reason = "length"
            group.kv_changes.append((seq, None))
            group.finished.append(seq)
        group.seqs = []
    return len(survivors)


def _beam_score(seq: Sequence) -> float:
    """Length-normalised beam score with length_penalty 1.0: cumulative logprob / generated tokens."""
    return seq.cumulative_logprob / max(seq.num_output, 1)


def finish_group_outputs(group: SequenceGroup, tokenizer) -> RequestOutput:
    """The request's outputs: samples in sample order (index = order of forking), or the best beam_width beams.
    Called on a running group (a streamed step), its live sequences count too (finish_reason None) and
    `finished` is False; beams then rank by the same length-normalised score."""
    finished = [*group.finished, *group.seqs]
    if group.params.use_beam_search:
        ranked = sorted(finished, key=_beam_score, reverse=True)[: group.params.beam_width]
    else:
        ranked = sorted(finished, key=lambda s: s.seq_id)
    outputs = []
    for index, seq in enumerate(ranked):
        ids = seq.output_ids
        text = tokenizer.decode(ids, skip_special_tokens=True) if tokenizer is not None else None
        logits = torch.stack(seq.logits) if seq.logits else None
        outputs.append(CompletionOutput(index, ids, seq.cumulative_logprob, seq.finish_reason, text, logits))
    return RequestOutput(
        group.request_id,
        list(group.prompt_token_ids),
        outputs,
        group.prompt,
        group.num_preemptions,
        group.num_cached_tokens,
        finished=not group.seqs,
    )
