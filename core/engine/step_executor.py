"""The engine's executor for the run driver (`core.sched.driver.run_step`, the simulator's driver too): a step's
execution is a forward pass over the flattened batch, then sampling; its finish turns the scheduler's outcome into
`RequestOutput`s. It writes no KV memory: the sampler leaves the forks and ends it decides in each group's
`kv_changes`, and the scheduler's `postprocess` applies them (through `EngineMemory`)."""

from collections.abc import Callable

from core.engine.model_runner import ModelRunner, PreparedStep
from core.engine.postprocess import finish_group_outputs, process_group
from core.engine.sequence import RequestOutput
from core.errors import SchedulerStuckError
from core.sched.scheduler import ScheduledStep, Scheduler, StepOutcome


class EngineExecutor:
    """`core.sched.driver.StepExecutor` for the engine: one step at a time (`plan` is always 1).

    forget: called with the ids of the requests a step finished (the engine drops them from its live requests
    and tells its `RequestInbox`). eos_token_ids: the model's end tokens; new_seq_id: the engine's sequence-id
    counter (a fork's new sequence takes one)."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        eos_token_ids,
        new_seq_id: Callable[[], int],
        tokenizer,
        forget: Callable[[list], None],
    ):
        self.scheduler = scheduler
        self.runner = runner
        self.eos_token_ids = eos_token_ids
        self.new_seq_id = new_seq_id
        self.tokenizer = tokenizer
        self.forget = forget

    def stuck_error(self, step: ScheduledStep) -> Exception:
        return SchedulerStuckError.nothing_fits(
            len(self.scheduler.waiting), free_blocks=self.scheduler.memory.free_blocks
        )

    def plan(self, step: ScheduledStep) -> int:
        return 1  # the engine runs one decode step at a time

    def execute(self, step: ScheduledStep) -> None:
        """The forward pass (`ModelRunner.execute`), then sampling."""
        self._sample(step, self.runner.execute(step))

    def _sample(self, step: ScheduledStep, prepared: PreparedStep | None) -> None:
        """Give each sequence its row of logits, then sample every group whose sequences all have theirs (the
        sequences it ends or forks are left in `kv_changes` for the scheduler's postprocess)."""
        if prepared is None:
            return
        for row, owners in enumerate(prepared.logits_owner):
            for seq in owners:
                seq.pending_logits = prepared.logits[row]
        touched = dict.fromkeys([*step.decoding, *(g for g, _, _ in step.prefill_chunks)])
        for group in touched:
            if group.seqs and all(s.pending_logits is not None for s in group.seqs):
                process_group(group, self.new_seq_id, self.eos_token_ids)

    def finish(self, step: ScheduledStep, outcome: StepOutcome, executed: None) -> list[RequestOutput]:
        """RequestOutputs of the groups that finished, and of the streamed ones that produced tokens."""
        outputs = []
        for group in outcome.finished:
            outputs.append(finish_group_outputs(group, self.tokenizer))
        self.forget([g.request_id for g in outcome.finished])
        for group in dict.fromkeys([*step.decoding, *outcome.first_token]):
            if group.stream and group.seqs:
                outputs.append(finish_group_outputs(group, self.tokenizer))
        return outputs
