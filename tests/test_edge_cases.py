"""Edge cases of the core loop: the position limit, drafter output checks, padded vocabularies,
the greedy fast path, one result type, and one device→host read per round."""

import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_llama
from test_batched import left_pad
from test_greedy import PROMPTS, reference

from specdec_edu import ModelDrafter, autoregressive_generate, speculative_generate
from specdec_edu.verify import accept_and_resample

# ---- 1. The position limit ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def short_target():
    """A target that handles only 32 positions."""
    return tiny_llama(seed=0, max_positions=32)


def test_speculative_stops_at_the_position_limit(short_target):
    """Prompt 25 of 32 positions, a draft identical to the target (every draft accepted, so rounds
    of γ + 1 tokens would overshoot): the result fills exactly 32 positions and says why it stopped.
    Before the fix the loop kept generating to 25 + 20 = 45 tokens, feeding positions ≥ 32."""
    prompt = torch.arange(3, 28)[None]
    for gamma in (1, 3, 4, 6):
        out = speculative_generate(short_target, short_target, prompt, max_new_tokens=20, gamma=gamma)
        assert out.sequences.shape[1] == 32, gamma
        assert out.stats.stopped_by == "max_positions"
        assert out.sequences[0].tolist() == reference(short_target, prompt[0], 7).tolist()
    base = autoregressive_generate(short_target, prompt, max_new_tokens=20)
    assert base.sequences.shape[1] == 32 and base.stats.stopped_by == "max_positions"


def test_position_limit_never_feeds_a_position_past_it(short_target):
    """Record every position id the target is run on: none reaches max_position_embeddings."""
    seen = []  # the rotary embedding is computed from the position ids of every forward
    hook = short_target.model.rotary_emb.register_forward_hook(
        lambda module, args, kwargs, output: seen.append(int((args[1] if len(args) > 1 else kwargs["position_ids"]).max())),
        with_kwargs=True,
    )
    try:
        speculative_generate(short_target, short_target, torch.arange(3, 28)[None], max_new_tokens=20, gamma=6)
    finally:
        hook.remove()
    assert seen and max(seen) <= 31


def test_batched_rows_stop_at_the_position_limit(short_target):
    """Rows of 20 and 27 prompt tokens: the long row stops at 32 positions, the short one at max_new_tokens."""
    prompts = [torch.arange(3, 23), torch.arange(2, 29)]
    ids, mask = left_pad(prompts)  # [2, 27]
    for generate in (lambda **kw: speculative_generate(short_target, short_target, gamma=4, **kw),
                     lambda **kw: autoregressive_generate(short_target, **kw)):
        out = generate(input_ids=ids, attention_mask=mask, max_new_tokens=10)
        assert [s.stopped_by for s in out.row_stats] == ["max_new_tokens", "max_positions"]
        assert out.lengths == [10, 5]
        for i, p in enumerate(prompts):
            assert out.row(i).tolist() == reference(short_target, p, out.lengths[i])[len(p):].tolist()


def test_rows_still_generating_keep_their_gamma_after_a_row_stops(short_target):
    """The batch's γ comes from the rows still generating. Here the long row (27 tokens, 32 positions) stops after
    round 1 at the position limit, where it has no room left; counting it cut γ to 0 for the short row, which then
    decoded target-only, one token per round, in silence (same tokens, no speed-up). With the target as its own
    draft every draft is accepted, so the short row needs two rounds of γ + 1 = 5 tokens."""
    prompts = [torch.arange(3, 23), torch.arange(2, 29)]
    ids, mask = left_pad(prompts)  # [2, 27]
    out = speculative_generate(short_target, short_target, ids, attention_mask=mask, max_new_tokens=10, gamma=4)
    assert [s.stopped_by for s in out.row_stats] == ["max_new_tokens", "max_positions"]  # the case meant
    assert out.row_stats[1].tokens_per_round == [5] and out.row_stats[0].tokens_per_round == [5, 5]


def test_stop_reasons(target, close_draft):
    prompt = PROMPTS[4]
    assert speculative_generate(target, close_draft, prompt[None], max_new_tokens=9).stats.stopped_by == "max_new_tokens"
    eos = int(reference(target, prompt, 10)[len(prompt) + 2])
    for out in (speculative_generate(target, close_draft, prompt[None], max_new_tokens=9, eos_token_id=eos),
                autoregressive_generate(target, prompt[None], max_new_tokens=9, eos_token_id=eos)):
        assert out.stats.stopped_by == "eos" and out.row(0)[-1] == eos


# ---- 2. Drafter output is checked -------------------------------------------------------------------


class BadDrafter:
    """Proposes fixed tokens with a fixed q, whatever it is asked."""

    def __init__(self, tokens, q):
        self.tokens, self.q = torch.tensor(tokens), q

    def propose(self, context, gamma, to_probs, generator=None):
        return self.tokens, self.q


def uniform(rows, vocab=64):
    return torch.full((rows, vocab), 1.0 / vocab)


def negative_entry(q):
    """Rows that still sum to 1 but hold one negative entry (max(0, p - q) would gain mass there)."""
    q = q.clone()
    q[:, 10] -= 0.02
    q[:, 11] += 0.02
    assert (q < 0).any() and torch.allclose(q.sum(-1), torch.ones(len(q)))
    return q


def tail_zeroed(rows, vocab=64):
    """Softmax rows whose least likely ids (1 % of the mass) were zeroed and NOT renormalised (a top-p that forgot
    to rescale): each row sums to 0.990, off by ten times the 1e-3 that ``propose_checked`` allows."""
    q = torch.softmax(torch.linspace(5, 0, vocab), -1)  # ids in decreasing probability
    q[(q.flip(0).cumsum(0) <= 0.01).flip(0)] = 0  # the tail: the last 12 ids
    assert abs(float(q.sum()) - 0.99) < 1e-4
    return q.expand(rows, -1)


@pytest.mark.parametrize(
    "drafter, message",
    [
        (BadDrafter([1, 2, 3, 4, 5, 6], uniform(6)), "asked for at most γ = 4"),
        (BadDrafter([1, 2, 3, 4, 5], uniform(5)), "asked for at most γ = 4"),  # γ + 1: the round's limits assume γ
        (BadDrafter([1, 2], uniform(3)), "one q row per token"),
        (BadDrafter([1, 2], uniform(2) * 2), "not a probability distribution"),
        (BadDrafter([1, 2], tail_zeroed(2)), "not a probability distribution"),  # rows sum to 0.99
        (BadDrafter([1, 2], uniform(2) * 1.01), "not a probability distribution"),  # rows sum to 1.01
        (BadDrafter([1, 2], torch.full((2, 64), float("nan"))), "not a probability distribution"),
        (BadDrafter([1, 2], negative_entry(uniform(2))), "not a probability distribution"),
        (BadDrafter([1, 2], torch.nn.functional.one_hot(torch.tensor([5, 6]), 64).float()), "outside its q's support"),
        (BadDrafter([1, 70], uniform(2)), "outside its q's support"),
        (BadDrafter([1, 2], uniform(2, vocab=80)), "target has only 64"),
        (BadDrafter([1, 2], uniform(2, vocab=65)), "target has only 64"),  # one id too many: padding by -1 crops q
    ],
)
def test_drafter_output_is_validated(target, drafter, message):
    for do_sample in (False, True):
        with pytest.raises(ValueError, match=message):
            speculative_generate(target, drafter, PROMPTS[3][None], max_new_tokens=8, gamma=4, do_sample=do_sample,
                                 generator=torch.Generator().manual_seed(0))


# ---- 3. Padded vocabularies: compare head rows, not config.vocab_size ------------------------------


@pytest.fixture(scope="module")
def padded_target():
    """The `target` fixture's weights with its head padded from 64 to 72 rows (zero rows, as a padded
    checkpoint has): same tokenizer, more ids, like Qwen2.5-7B (152064) vs 0.5B (151936)."""
    small = tiny_llama(seed=0)
    big = tiny_llama(seed=0, vocab_size=72)
    state = small.state_dict()
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        state[name] = torch.cat([state[name], torch.zeros(8, state[name].shape[1])])
    big.load_state_dict(state)
    return big


def test_draft_with_fewer_head_rows_is_fine(padded_target, close_draft):
    """q is zero-padded to the target's 72 ids; greedy output equals the padded target's own."""
    for gamma in (1, 4):
        for prompt in PROMPTS[:4]:
            out = speculative_generate(padded_target, close_draft, prompt[None], max_new_tokens=16, gamma=gamma)
            assert out.sequences[0].tolist() == reference(padded_target, prompt, 16).tolist()


def test_batched_draft_with_fewer_head_rows(padded_target, close_draft):
    ids, mask = torch.stack([PROMPTS[3], PROMPTS[9]]), torch.ones(2, 5, dtype=torch.long)
    out = speculative_generate(padded_target, close_draft, ids, attention_mask=mask, max_new_tokens=12, gamma=3)
    for i in range(2):
        assert out.row(i).tolist() == reference(padded_target, ids[i], 12)[5:].tolist()


def test_target_id_the_draft_cannot_read_names_the_problem(padded_target, close_draft):
    """A padded target that does emit one of its extra ids (here: a prompt holding id 70) gets a clear error,
    not an index error deep inside the draft's embedding."""
    with pytest.raises(ValueError, match="cannot read"):
        speculative_generate(padded_target, close_draft, torch.tensor([[3, 70, 5]]), max_new_tokens=4)


def test_the_first_id_the_draft_lacks_is_refused_too(padded_target, close_draft):
    """The boundary of the check above: id 64 is the first the 64-row draft lacks (ids 0–63 it reads). An off-by-one
    there let it through, to an IndexError inside the draft's embedding (a device-side assert on a GPU)."""
    with pytest.raises(ValueError, match="token id 64, which the draft model cannot read"):
        speculative_generate(padded_target, close_draft, torch.tensor([[3, 64, 5]]), max_new_tokens=4)


def test_a_batch_refuses_ids_the_draft_cannot_read_too(padded_target, close_draft):
    """The batched loop fed prompts and the target's tokens to the draft unchecked: an IndexError from inside its
    embedding (a device-side assert on a GPU). In the prompt, and mid-generation (sampling at temperature 2 from the
    padded target draws its extra ids 64–71). Control: greedy decoding of the same batch, whose argmax stays among the
    ids the draft reads, runs."""
    ids, mask = torch.tensor([[3, 70, 5], [4, 5, 6]]), torch.ones(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="cannot read"):
        speculative_generate(padded_target, close_draft, ids, attention_mask=mask, max_new_tokens=4)
    ids[0, 1] = 9
    with pytest.raises(ValueError, match="token id 6[4-9]|token id 7[01], which the draft model cannot read"):
        speculative_generate(padded_target, close_draft, ids, attention_mask=mask, max_new_tokens=24, do_sample=True,
                             temperature=2.0, generator=torch.Generator().manual_seed(0))
    out = speculative_generate(padded_target, close_draft, ids, attention_mask=mask, max_new_tokens=24)  # greedy
    assert max(out.sequences.flatten().tolist()) < 64  # its argmax stays among the real ids: nothing to refuse


def test_draft_with_more_head_rows_names_the_fix(padded_target, target):
    with pytest.raises(ValueError, match=r"head_size=64"):
        speculative_generate(target, padded_target, PROMPTS[3][None], max_new_tokens=4)
    out = speculative_generate(target, ModelDrafter(padded_target, head_size=64), PROMPTS[3][None], max_new_tokens=12)
    assert out.sequences[0].tolist() == reference(target, PROMPTS[3], 12).tolist()


def test_batched_honours_the_drafters_reduced_head(padded_target, target):
    """The fix the vocabulary error recommends, ``ModelDrafter(draft, head_size=64)``, on a batch of two prompts.
    Greedy: each row equals its batch-1 output. Sampling: no draft outside the target's 64 ids. Before: batched mode
    passed on ``drafter.model`` alone, so the draft's 72-row head proposed ids the target cannot read (IndexError)."""
    drafter = ModelDrafter(padded_target, head_size=64)
    ids, mask = torch.stack([PROMPTS[3], PROMPTS[9]]), torch.ones(2, 5, dtype=torch.long)
    out = speculative_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=12, gamma=3)
    for i in range(2):
        alone = speculative_generate(target, drafter, ids[i][None], max_new_tokens=12, gamma=3)
        assert out.row(i).tolist() == alone.row(0).tolist() == reference(target, ids[i], 12)[5:].tolist()
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):  # 5 × 2 rows × 24 tokens, temperature 2: the draft's extra 8 ids would be drawn often
        out = speculative_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=24, gamma=4, do_sample=True,
                                   temperature=2.0, generator=gen)
        assert out.stats.drafted > 0 and out.new_tokens.max() < 64


def test_batched_runs_a_static_or_compiled_drafter_eagerly_and_says_so(target, close_draft):
    """static_cache/compile are single-prompt options: batched mode warns in one line and gives the same tokens.
    Before: they were dropped silently."""
    ids, mask = torch.stack([PROMPTS[3], PROMPTS[9]]), torch.ones(2, 5, dtype=torch.long)
    with pytest.warns(UserWarning, match="static_cache and compile"):
        drafter = ModelDrafter(close_draft, compile=True, compile_options={"backend": "aot_eager"})
        out = speculative_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=10, gamma=3)
    for i in range(2):
        assert out.row(i).tolist() == reference(target, ids[i], 10)[5:].tolist()


@pytest.fixture(scope="module")
def short_gpt2_draft():
    """A GPT-2-style draft (learned positions) that reads only 16 positions, over the target's 64 ids."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config).eval().requires_grad_(False)


def test_batched_checks_the_drafts_position_limit(target, short_gpt2_draft):
    """Two 20-token prompts, a draft with 16 positions: a clear error up front (before: a raw IndexError from the
    draft's position embedding). Prompts of 10 tokens that grow past 16: one warning there, then target-only rounds
    to the end, the target's tokens throughout (before: an error there, and what was generated was lost)."""
    with pytest.raises(ValueError, match="draft model reads at most 16 positions.*the prompt has 20 tokens"):
        speculative_generate(target, short_gpt2_draft, torch.randint(0, 64, (2, 20)), max_new_tokens=4, gamma=2)
    ids = torch.stack([PROMPTS[2].repeat(4)[:10], PROMPTS[5].repeat(2)[:10]])
    with pytest.warns(UserWarning, match="reads at most 16 positions .* from here the target decodes alone") as said:
        past = speculative_generate(target, short_gpt2_draft, ids, max_new_tokens=12, gamma=3)
    assert len([w for w in said if "decodes alone" in str(w.message)]) == 1
    for i in range(2):
        assert past.row(i).tolist() == reference(target, ids[i], 12)[10:].tolist()
    out = speculative_generate(target, short_gpt2_draft, ids, max_new_tokens=6, gamma=3)  # within 16: γ is cut to fit
    for i in range(2):
        assert out.row(i).tolist() == reference(target, ids[i], 6)[10:].tolist()


def test_a_prompt_that_fills_the_drafts_positions_exactly_is_read(target, short_gpt2_draft):
    """The boundary of the up-front refusal: 16-token prompts and a draft of 16 positions. The draft reads all 16
    (γ = 1 there, ``gamma_within``), so the batch must run (then the context outgrows the draft: target-only rounds),
    not be refused; `length >= limit` refused it, and the 20-token case above cannot tell the two apart."""
    ids = torch.stack([PROMPTS[2].repeat(8)[:16], PROMPTS[5].repeat(8)[:16]])
    with pytest.warns(UserWarning, match="decodes alone"):
        out = speculative_generate(target, short_gpt2_draft, ids, max_new_tokens=3, gamma=3)
    for i in range(2):
        assert out.row(i).tolist() == reference(target, ids[i], 3)[16:].tolist()


# ---- 4. The greedy fast path ------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["draft", "close_draft", "agreeing_draft"])
def test_greedy_fast_path_equals_the_general_rule(request, target, which):
    """Default greedy (argmax comparisons) vs the general rule on one-hot p and q (accept_fn=accept_and_resample):
    the same tokens AND the same accept decisions, round by round, for γ = 1..6."""
    draft = request.getfixturevalue(which)
    for gamma in range(1, 7):
        for prompt in PROMPTS[:6]:
            fast = speculative_generate(target, draft, prompt[None], max_new_tokens=20, gamma=gamma)
            general = speculative_generate(target, draft, prompt[None], max_new_tokens=20, gamma=gamma,
                                           accept_fn=accept_and_resample)
            assert fast.sequences.tolist() == general.sequences.tolist(), (gamma, which)
            assert fast.stats.accepted_per_round == general.stats.accepted_per_round
            assert fast.token_sources == general.token_sources


# ---- 5. One result type ----------------------------------------------------------------------------


def test_one_result_type_for_one_and_many_prompts(target, close_draft):
    one = speculative_generate(target, close_draft, PROMPTS[3][None], max_new_tokens=6)
    many = speculative_generate(target, close_draft, torch.stack([PROMPTS[3], PROMPTS[9]]),
                                attention_mask=torch.ones(2, 5, dtype=torch.long), max_new_tokens=6)
    base = autoregressive_generate(target, PROMPTS[3][None], max_new_tokens=6)
    assert type(one) is type(many) is type(base)
    assert one.sequences.shape == (1, 11) and many.sequences.shape == (2, 11)
    assert one.new_tokens.shape == (1, 6) and many.new_tokens.shape == (2, 6)
    assert one.row(0).tolist() == many.row(0).tolist() == base.row(0).tolist()
    assert len(one.token_sources) == 1 and len(many.token_sources) == 2


# ---- 6. One device→host read per round ----------------------------------------------------------------

PACKAGE = str(Path(__file__).resolve().parent.parent / "specdec_edu")
READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__")
# HostReads' operators less `.item()`'s, which READS count already: torch.equal returns a Python bool, nonzero and
# masked_select a tensor whose size depends on the values (a sync each on a GPU).
READ_OPERATORS = ("aten.equal", "aten.nonzero", "aten.masked_select", "aten.is_nonzero")
# The package's functions whose reads are of host tensors (no sync), or made once per call or per cache, not per
# round: a read inside them, or inside what they call, is not counted. ``reusable_prefix`` compares the host
# copies of the context (``propose`` receives it on the host), and prompt lookup searches that host copy.
NOT_PER_ROUND = ("validate_prompts", "_recorders", "check_draft_can_read", "_allocate_and_check", "reusable_prefix")


def read_site(frame):
    """Where in specdec_edu a read was made (``None``: outside the package, or inside NOT_PER_ROUND)."""
    site = None
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith(PACKAGE):
            if code.co_name in NOT_PER_ROUND:
                return None
            site = site or f"{code.co_name} ({Path(code.co_filename).name}:{frame.f_lineno})"
        frame = frame.f_back
    return site


class HostReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the operators that read a device value on the host (``.item()``, ``bool(t)``, ``nonzero``…): on CUDA
    each is a sync, which is an error while a stream records a CUDA graph. ``reads``: which operators; ``site``: where
    a call was made (``read_site``), then recorded as "operator in site" and left out where it gives ``None``;
    ``seen``: the list to append to."""

    READS = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.equal", "aten.is_nonzero")

    def __init__(self, reads=READS, site=None, seen=None):
        super().__init__()
        self.reads, self.site, self.seen = reads, site, [] if seen is None else seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith(self.reads):
            if self.site is None:
                self.seen.append(str(func))
            elif (where := self.site(sys._getframe(1))) is not None:
                self.seen.append(f"{func} in {where}")
        return func(*args, **(kwargs or {}))


@pytest.fixture
def count_python_reads(monkeypatch):
    """Count tensor→Python conversions (READS) made anywhere in specdec_edu during a generation (the loop, the rule,
    the drafters, the caches), but for NOT_PER_ROUND's: on a GPU each read is a device→host sync."""
    calls = []
    for name in READS:
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, _original=original, _name=name, **kwargs):
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(PACKAGE) and (site := read_site(caller)) is not None:
                calls.append(f"{_name} in {site}")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    return calls


@pytest.fixture
def count_loop_reads(count_python_reads):
    """``count_python_reads`` and the operators that return host values (READ_OPERATORS), for eager generations (a
    dispatch mode keeps torch.compile from compiling: the compiled path's test counts the conversions only)."""
    with HostReads(READ_OPERATORS, site=read_site, seen=count_python_reads):
        yield count_python_reads


def test_the_read_counter_sees_operators_that_return_host_values(count_loop_reads):
    """The control of the two tests below: torch.equal and nonzero, called from inside the package, are counted
    (a planted `torch.equal(decision, decision)` in a round went unseen when only READS were watched)."""
    from specdec_edu import kv

    code = compile("torch.equal(x, x); x.nonzero()", kv.__file__, "exec")  # as if a line of specdec_edu/kv.py ran it
    exec(code, {"torch": torch, "x": torch.ones(3)})
    assert [call.split(" in ")[0] for call in count_loop_reads] == ["aten.equal.default", "aten.nonzero.default"]


@pytest.mark.parametrize("do_sample", [False, True])
def test_one_read_per_round(target, close_draft, count_loop_reads, do_sample):
    out = speculative_generate(target, close_draft, PROMPTS[4][None], max_new_tokens=30, gamma=4, do_sample=do_sample,
                               generator=torch.Generator().manual_seed(0))
    assert out.stats.rounds > 5
    assert len(count_loop_reads) == out.stats.rounds, count_loop_reads


@pytest.mark.parametrize("do_sample", [False, True])
def test_one_read_per_round_in_a_batch(target, close_draft, count_loop_reads, do_sample):
    """The batched loop too: every row's decision and drafts, and the NaN flag, in one copy per round.
    Before: a read per row for the rule, and one more for the NaN check."""
    ids = torch.stack([PROMPTS[4], PROMPTS[10]])
    out = speculative_generate(target, close_draft, ids, max_new_tokens=30, gamma=4, do_sample=do_sample,
                               generator=torch.Generator().manual_seed(0))
    assert out.stats.rounds > 5
    assert len(count_loop_reads) == out.stats.rounds, count_loop_reads


def test_alpha_per_position_counts_only_judged_drafts():
    """Rounds (drafted, accepted): (4, 4) judges positions 1-4, all accepted; (4, 1) judges 1-2, accepts 1;
    (2, 0) judges 1; (0, 0) judges nothing. α at position i = accepted / judged there."""
    from specdec_edu import GenerationStats

    stats = GenerationStats(drafted_per_round=[4, 4, 2, 0], accepted_per_round=[4, 1, 0, 0])
    assert stats.alpha_per_position(4) == [2 / 3, 1 / 2, 1.0, 1.0]
    assert stats.judged_per_position(4) == [3, 2, 1, 1]
    assert stats.accepted_per_position(4) == [2, 1, 1, 1]
