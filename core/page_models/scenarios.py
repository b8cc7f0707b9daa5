"""Guided playground scenarios: named scripts of playground actions, one sentence of narration per step.

A scenario runs on the same `Playground` (a real `BlockManager` and `KVCache`) as free play; there is no
separate model. Step 0 is the empty pool; step k is the pool after the actions of steps 1..k. `replay` always
rebuilds the pool from scratch (same config, same seed, so the same random tokens and K/V), which makes stepping
back exact: `replay(s, k)` equals playing steps 1..k one after the other on one `Playground`.

A step whose action is refused (out of blocks, unknown sequence) is part of the script: the refusal is recorded
in the playground's history and, like every failed core operation, changes nothing.
"""

import contextlib
from dataclasses import dataclass

from core.common import check_int
from core.errors import InvalidArgumentError, LabError
from core.page_models.playground import Playground, PlaygroundConfig
from core.paging.block_manager import BlockManager

ACTION_KINDS = ("add", "append", "fork", "free")


@dataclass(frozen=True)
class Action:
    """One playground call.

    kind "add": a new sequence of `count` prompt tokens named `seq` (None: the next "s<n>"); `shared_prefix`
        False leaves out the shared system prompt.
    kind "append": `count` decoded tokens into `seq`. kind "fork": `seq` forked into `child` (None: next "s<n>").
    kind "free": `seq` freed.
    """

    kind: str
    seq: str | None = None
    count: int = 0
    child: str | None = None
    shared_prefix: bool = True

    def __post_init__(self):
        if self.kind not in ACTION_KINDS:
            raise InvalidArgumentError(f"unknown action {self.kind!r}; allowed: {', '.join(ACTION_KINDS)}")

    def apply(self, playground: Playground) -> str:
        """Run the action; returns the playground's message or raises its `LabError` (state unchanged)."""
        if self.kind == "add":
            return playground.add_sequence(self.count, self.seq, self.shared_prefix)
        if self.kind == "append":
            return playground.append(self.seq, self.count)
        if self.kind == "fork":
            return playground.fork(self.seq, self.child)
        return playground.free(self.seq)


def add(count: int, seq: str | None = None, shared_prefix: bool = True) -> Action:
    return Action("add", seq, count, shared_prefix=shared_prefix)


def append(seq: str, count: int = 1) -> Action:
    return Action("append", seq, count)


def fork(seq: str, child: str | None = None) -> Action:
    return Action("fork", seq, child=child)


def free(seq: str) -> Action:
    return Action("free", seq)


_ACTION_HELPERS = {"add": add, "append": append, "fork": fork, "free": free}


@dataclass(frozen=True)
class Step:
    """One step of a script: its actions, run in order, and the sentence that explains the result.

    refused: the script expects the step's last action to be refused (and every other action to succeed).
    """

    narration: str
    actions: tuple[Action, ...]
    refused: bool = False


@dataclass(frozen=True)
class Scenario:
    """A named script. `key` is its URL name; `summary` is the narration of step 0 (the empty pool).

    seed_status: show the teaching C++ manager's status lines (`cpp_status_lines`) beside the metrics.
    """

    key: str
    title: str
    summary: str
    config: PlaygroundConfig
    steps: tuple[Step, ...]
    seed_status: bool = False
    seed: int = 0

    @property
    def num_steps(self) -> int:
        """The last step index (steps are 0..num_steps, step 0 being the empty pool)."""
        return len(self.steps)

    def narration(self, step: int) -> str:
        step = self.check_step(step)
        return self.summary if step == 0 else self.steps[step - 1].narration

    def check_step(self, step: int) -> int:
        return check_int(step, f"step of scenario {self.key!r}", minimum=0, maximum=self.num_steps)


def replay(scenario: Scenario, step: int) -> Playground:
    """A fresh playground after the actions of steps 1..`step` (0: the empty pool). Refusals are recorded in its
    history, never raised. Raises InvalidArgumentError for a step outside [0, num_steps]."""
    step = scenario.check_step(step)
    playground = Playground(scenario.config, scenario.seed)
    for scripted in scenario.steps[:step]:
        play_step(playground, scripted)
    return playground


def play_step(playground: Playground, step: Step) -> None:
    """Run one step's actions on `playground` in place; a refused action is recorded, not raised."""
    for action in step.actions:
        with contextlib.suppress(LabError):  # the playground recorded the refusal and changed nothing
            action.apply(playground)


def cpp_status_lines(manager: BlockManager) -> tuple[str, str, str]:
    """What the teaching C++ `PagedKVManager::print_status()` prints, computed from our manager's state:
    total blocks, free blocks, active sequences (live block tables)."""
    return (
        f"Total blocks: {manager.num_blocks}",
        f"Free blocks: {manager.num_free_blocks}",
        f"Active sequences: {len(manager.seq_ids())}",
    )


REFUSED = "refused"


def script(*rows: tuple) -> tuple[Step, ...]:
    """A scenario's steps from its table, one row per step: `(action, arguments, sentence)`, or
    `(action, arguments, sentence, REFUSED)` for a step whose last action the script expects to be refused.

    action: one of ACTION_KINDS, built by its helper (`add`, `append`, `fork`, `free`) from `arguments`: the
        helper's positional arguments as a tuple, a single argument alone, or a list of those for a step that
        makes the same call several times, in order. sentence: the narration shown at that step.
    Raises InvalidArgumentError for an unknown action or a fourth column other than REFUSED.
    """
    steps = []
    for kind, arguments, sentence, *flags in rows:
        if kind not in _ACTION_HELPERS:
            raise InvalidArgumentError(f"unknown action {kind!r}; allowed: {', '.join(ACTION_KINDS)}")
        if flags not in ([], [REFUSED]):
            raise InvalidArgumentError(f"a script row ends with {flags!r}; allowed: nothing or {REFUSED!r}")
        calls = arguments if isinstance(arguments, list) else [arguments]
        actions = tuple(_ACTION_HELPERS[kind](*(a if isinstance(a, tuple) else (a,))) for a in calls)
        steps.append(Step(sentence, actions, refused=bool(flags)))
    return tuple(steps)


# ---- the scripts ------------------------------------------------------------------------------------------------

SEED_CONFIG = PlaygroundConfig(
    num_blocks=8, block_size=16, head_dim=64, num_kv_heads=1, contiguous_max_len=64, system_prompt_len=0
)

SEED_DEMO = Scenario(
    key="seed-demo",
    title="The seed's demo (the C++ main)",
    summary=(
        "The teaching C++ PagedKVManager this project grew from: 8 blocks of 16 tokens, head_dim 64, all free; "
        "press Next to run its main() on our block manager."
    ),
    config=SEED_CONFIG,
    seed_status=True,
    steps=script(
        (
            "add",
            (24, "1"),
            "Sequence 1 writes 24 tokens: ceil(24 / 16) = 2 blocks (0 and 1, the second half full), 6 of 8 free "
            "(the C++ pops its free vector from the back, so it hands out blocks 7 and 6, not the 0 and 1 its "
            "comments say).",
        ),
        (
            "add",
            (16, "2"),
            "Sequence 2 writes 16 tokens: exactly one full block (block 2) with no empty slot, 5 of 8 free and 2 "
            "active sequences, the C++ main's first status.",
        ),
        (
            "free",
            "1",
            "Freeing sequence 1 returns its 2 blocks to the free list: 7 of 8 free and 1 active sequence, the "
            "C++ main's second status.",
        ),
    ),
)

SEED_BUGS = Scenario(
    key="seed-bugs",
    title="The seed's two bugs",
    summary=(
        "The C++ manager's cow_write takes a block from the free list without checking that one is left, and "
        "write_kv to an unknown sequence creates an empty page table and indexes past it; here both are refused."
    ),
    config=SEED_CONFIG,
    seed_status=True,
    steps=script(
        ("add", (24, "1"), "Sequence 1 writes 24 tokens into blocks 0 and 1 (half full): 6 of 8 free."),
        (
            "fork",
            ("1", "2"),
            "Sequence 2 is forked from 1: both tables read 0 → 1 and each block's ref count is 2, still 6 free.",
        ),
        ("add", (96, "3"), "Sequence 3 takes the other 6 blocks (96 tokens, blocks 2 to 7): 0 free."),
        (
            "append",
            "2",
            "Sequence 2 writes a token into its shared half-full block 1, which needs a copy and no block is "
            "free: the C++ cow_write would pop an empty vector; ours refuses (out of KV blocks) and changes "
            "nothing: still 0 free.",
            REFUSED,
        ),
        ("free", "3", "Freeing sequence 3 returns blocks 2 to 7: 6 free."),
        (
            "append",
            "2",
            "Now the same write succeeds: block 1 is copied into block 7 (copy-on-write), so sequence 2 reads "
            "0 → 7 while 1 keeps 0 → 1; 5 free.",
        ),
        (
            "append",
            "9",
            "A write to sequence 9, which does not exist: the C++ would create an empty page table (3 active "
            "sequences) and read past it; ours refuses, names the live sequences 1 and 2, and changes nothing: "
            "still 5 free.",
            REFUSED,
        ),
    ),
)

PARALLEL_SAMPLING = Scenario(
    key="parallel-sampling",
    title="Parallel sampling",
    summary=(
        "Four samples of one prompt (n = 4) share the prompt's blocks; only the partly filled last block is "
        "copied, once per sample, when that sample writes its first token."
    ),
    config=PlaygroundConfig(num_blocks=16, block_size=16, contiguous_max_len=128, system_prompt_len=0),
    steps=script(
        ("add", 40, "The 40-token prompt s0 fills blocks 0 and 1 and 8 slots of block 2: 13 of 16 free."),
        (
            "fork",
            ["s0"] * 3,
            "Forking s0 three times gives 4 samples (s0 to s3) whose tables all read 0 → 1 → 2, each block "
            "shared ×4, and no block taken: still 13 free.",
        ),
        (
            "append",
            "s0",
            "Sample s0 writes its first token into the shared block 2: it is copied into block 3 first, so s0 "
            "reads 0 → 1 → 3; 12 free.",
        ),
        (
            "append",
            "s1",
            "Sample s1's first token copies block 2 into block 4: 11 free, block 2 now shared ×2.",
        ),
        ("append", "s2", "Sample s2's first token copies block 2 into block 5: 10 free."),
        (
            "append",
            "s3",
            "Sample s3 is now block 2's only reader, so its first token is written in place with no copy: still "
            "10 free.",
        ),
        (
            "append",
            [(s, 8) for s in ("s0", "s1", "s2", "s3")],
            "Each sample decodes 8 more tokens (49 in all): the 49th starts a fourth block per sample (blocks 6 "
            "to 9), 6 free, while blocks 0 and 1 are still stored once for all four.",
        ),
        (
            "free",
            "s1",
            "Sample s1 finishes: only its own blocks 4 and 7 return (8 free); blocks 0 and 1 stay, shared ×3.",
        ),
    ),
)

BEAM_SEARCH = Scenario(
    key="beam-search",
    title="Beam search",
    summary=(
        "Beam search with 2 beams on blocks of 4 tokens: beams fork when one has the two best continuations and "
        "die when they fall out of the top 2; a shared block is freed only when its last reference goes."
    ),
    config=PlaygroundConfig(num_blocks=16, block_size=4, contiguous_max_len=32, system_prompt_len=0),
    steps=script(
        ("add", 6, "The 6-token prompt s0 takes blocks 0 and 1 (2 of 4 slots): 14 of 16 free."),
        ("fork", "s0", "Beam s1 is forked from s0: both read 0 → 1, each block shared ×2, 14 free."),
        (
            "append",
            ("s0", 2),
            "Beam s0 decodes 2 tokens into the shared block 1, which is copied into block 2 first: s0 reads 0 → 2, "
            "13 free.",
        ),
        (
            "append",
            ("s1", 2),
            "Beam s1 is block 1's only reader now, so its 2 tokens fill block 1 in place: still 13 free.",
        ),
        (
            "fork",
            "s0",
            "Both top continuations extend s0, so s0 is forked into s2 (reads 0 → 2): block 0 is shared ×3, "
            "block 2 ×2, 13 free.",
        ),
        (
            "free",
            "s1",
            "Beam s1 falls out of the top 2 and is freed: only its own block 1 returns (14 free); block 0 stays, "
            "held by s0 and s2.",
        ),
        (
            "append",
            ["s0", "s2"],
            "Each surviving beam decodes a token into a new block of its own (s0 into block 3, s2 into block 4): "
            "12 free.",
        ),
        (
            "free",
            "s0",
            "Beam s0 dies: its block 3 returns (13 free), but blocks 0 and 2 stay, because s2 still reads them.",
        ),
        (
            "free",
            "s2",
            "The last beam s2 finishes: the last references to blocks 0, 2 and 4 go, and all 16 blocks are free.",
        ),
    ),
)

PREFIX_CACHING = Scenario(
    key="prefix-caching",
    title="Prefix caching",
    summary=(
        "Every request starts with the same 32-token system prompt (2 blocks of 16); with prefix caching its "
        "blocks are computed once, shared, and kept after they are freed until the pool needs them back."
    ),
    config=PlaygroundConfig(
        num_blocks=8, block_size=16, enable_prefix_caching=True, contiguous_max_len=64, system_prompt_len=32
    ),
    steps=script(
        (
            "add",
            40,
            "Request s0 (40 tokens) takes blocks 0, 1 and 2; the two full system-prompt blocks 0 and 1 are "
            "registered in the cache: 5 of 8 free.",
        ),
        (
            "add",
            45,
            "Request s1 (45 tokens) finds blocks 0 and 1 in the cache and reuses them (32 tokens need no "
            "prefill), taking only block 3: 4 free.",
        ),
        (
            "free",
            "s0",
            "Request s0 finishes: only its own block 2 returns (5 free); blocks 0 and 1 stay with s1.",
        ),
        (
            "free",
            "s1",
            "Request s1 finishes: all 8 blocks are free, but blocks 0 and 1 stay cached: they still hold the "
            "system prompt's K/V.",
        ),
        (
            "add",
            40,
            "Request s2 (40 tokens) revives cached blocks 0 and 1 (a prefix-cache hit on free blocks) and takes "
            "block 4: 5 free.",
        ),
        ("free", "s2", "Request s2 finishes: 8 free, blocks 0 and 1 cached again."),
        (
            "add",
            (128, None, False),
            "An unrelated 128-token request s3 needs all 8 blocks: the 6 uncached ones go first, then the cached "
            "blocks 1 and 0 are evicted (least recently freed first): 0 free.",
        ),
        ("free", "s3", "Request s3 finishes: its 8 full blocks are cached now, and all 8 are free."),
        (
            "add",
            40,
            "Request s4 (40 tokens) misses: the system prompt was evicted at the unrelated request, so its blocks "
            "are prefilled again, into blocks 0, 1 and 4 (3 of s3's cached blocks evicted): 5 free.",
        ),
    ),
)

RUNNING_OUT = Scenario(
    key="running-out",
    title="Running out of blocks",
    summary=(
        "A pool of 6 blocks of 16 tokens fills up: the manager refuses what does not fit (changing nothing), a "
        "sequence can still grow inside its last block, and freeing a sequence makes room."
    ),
    config=PlaygroundConfig(num_blocks=6, block_size=16, contiguous_max_len=64, system_prompt_len=0),
    steps=script(
        ("add", 64, "Sequence s0 (64 tokens) fills blocks 0 to 3 exactly: 2 of 6 free."),
        (
            "add",
            40,
            "A 40-token request needs 3 blocks but 2 are free: it is refused and nothing is taken.",
            REFUSED,
        ),
        ("add", 20, "A 20-token request fits in the last 2 blocks (s1 reads 4 → 5): 0 free."),
        (
            "append",
            ("s1", 12),
            "s1 decodes 12 tokens into the 12 empty slots of its last block: no block needed, still 0 free.",
        ),
        (
            "append",
            "s0",
            "s0's last block is full, so its next token needs a new block and 0 are free: refused, s0 keeps "
            "its 64 tokens.",
            REFUSED,
        ),
        ("free", "s1", "Freeing s1 returns blocks 5 and 4: 2 free."),
        ("append", "s0", "Now s0's next token takes block 5 (s0 reads 0 → 1 → 2 → 3 → 5): 1 free."),
    ),
)

RUNNING_OUT_WINDOW = Scenario(
    key="running-out-window",
    title="Running out, with a sliding window",
    summary=(
        "The same 6-block pool for a sliding-window layer (each token attends to the last 32 positions): blocks "
        "wholly behind every future token's window are released as a sequence grows, so it holds at most 3."
    ),
    config=PlaygroundConfig(
        num_blocks=6, block_size=16, contiguous_max_len=64, system_prompt_len=0, sliding_window=32
    ),
    steps=script(
        (
            "add",
            64,
            "Sequence s0 (64 tokens) is allocated whole, blocks 0 to 3, as with full attention: 2 of 6 free.",
        ),
        (
            "add",
            40,
            "A 40-token request needs 3 blocks but 2 are free: refused, as with full attention.",
            REFUSED,
        ),
        ("add", 20, "A 20-token request takes blocks 4 and 5: 0 free."),
        ("append", ("s1", 12), "s1 decodes 12 tokens into its last block: no block needed, still 0 free."),
        (
            "append",
            "s0",
            "s0's next token (position 64) reads positions 33 to 64 only, so blocks 0 and 1 are released first and "
            "the token fits in block 0 again, where full attention refused: s0 reads · → · → 2 → 3 → 0, 1 free.",
        ),
        (
            "append",
            ("s0", 16),
            "s0 decodes 16 more tokens: block 2 falls out of the window and its 81st token takes block 1, so s0 "
            "holds 3 blocks however long it grows: still 1 free.",
        ),
        ("free", "s1", "Freeing s1 returns blocks 5 and 4: 3 free."),
    ),
)

SCENARIOS: dict[str, Scenario] = {
    s.key: s
    for s in (
        SEED_DEMO,
        SEED_BUGS,
        PARALLEL_SAMPLING,
        BEAM_SEARCH,
        PREFIX_CACHING,
        RUNNING_OUT,
        RUNNING_OUT_WINDOW,
    )
}


def get_scenario(key: str) -> Scenario:
    """The scenario named `key`; raises InvalidArgumentError naming the scenarios there are."""
    scenario = SCENARIOS.get(key)
    if scenario is None:
        raise InvalidArgumentError(f"unknown scenario {key!r}; scenarios: {', '.join(SCENARIOS)}")
    return scenario
