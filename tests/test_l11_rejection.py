"""The acceptance rule preserves the target's distribution, measured: 200,000 draws on a vocabulary
of 8 with a deliberately bad draft distribution; the emitted tokens' histogram is within total
variation 0.005 of p at the first position, and at the second (given the first draft was kept;
fewer draws there, so the bound grows as 1/sqrt(draws)).
The same check fails when the rule accepts with p(x) instead of p(x)/q(x) (the planted bug)."""
import pytest
import torch

import l11_spec_decode.rejection as rej

N, V, TV_BOUND = 200_000, 8, 0.005


def dists():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(2, V, generator=g) ** 3
    p[0, 0] = 0.0                                       # a token the target never emits ...
    q = torch.rand(2, V, generator=g)
    q[0, 0] = 3.0                                       # ... that the draft proposes most often
    return p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)


def draws(seed=1):
    """N independent requests with k = 2 drafts drawn from q; the target's p does not depend on
    the history here, so every emitted token should be distributed as p at its position."""
    p, q = dists()
    g = torch.Generator().manual_seed(seed)
    drafts = torch.stack([torch.multinomial(q[j], N, replacement=True, generator=g) for j in range(2)], 1)   # [N, 2]
    u = torch.rand(N, 2, generator=g)
    e = torch.empty(N, 3, V).exponential_(generator=g)
    P = torch.cat([p, p[1:]]).expand(N, 3, V)           # positions 0, 1, and the bonus (as position 1)
    accepted, cand = rej.rejection_sample(P, drafts, q.expand(N, 2, V), u, e)
    first = [d[0] if a > 0 else c[0] for d, a, c in zip(drafts.tolist(), accepted, cand)]
    second = [d[1] if a > 1 else c[1] for d, a, c in zip(drafts.tolist(), accepted, cand) if a >= 1]
    return p, first, second, accepted


def tv(p: torch.Tensor, tokens: list[int]) -> float:
    hist = torch.bincount(torch.tensor(tokens), minlength=V).double() / len(tokens)
    return 0.5 * float((hist - p.double()).abs().sum())


def test_l11_rejection_sampling_emits_the_targets_distribution_with_a_bad_draft():
    p, first, second, accepted = draws()
    a = torch.tensor(accepted)
    assert 0.1 < (a == 0).double().mean() < 0.9 and (a == 2).any()    # refusals and full accepts both happen
    assert len(second) > N // 10
    t1, t2 = tv(p[0], first), tv(p[1], second)
    bound2 = TV_BOUND * (N / len(second)) ** 0.5
    print(f"TV first {t1:.4f} (bound {TV_BOUND}), second {t2:.4f} (bound {bound2:.4f}) over {N} and {len(second)} draws")
    assert t1 <= TV_BOUND and t2 <= bound2
    assert 0 not in first                               # p(0) = 0: never emitted, though drafted most


def test_l11_rejection_check_fails_when_accepting_with_p_not_p_over_q(monkeypatch):
    monkeypatch.setattr(rej, "acceptance_ratio", lambda p_x, q_x: p_x)     # the planted bug
    p, first, second, _ = draws()
    assert tv(p[0], first) > 4 * TV_BOUND


def test_l11_deterministic_drafts_and_short_rows():
    """q = None (one-hot guesses) and rows with fewer drafts than the batch's k: a row past its own
    drafts emits the bonus from that position's p; a draft with p(x) = 1 is always kept."""
    p = torch.zeros(2, 3, 4)
    p[:, :, 2] = 1.0                                    # the target is sure: token 2 everywhere
    drafts = torch.tensor([[2, 1], [2, 2]])
    valid = torch.tensor([[True, True], [True, False]])
    u, e = torch.full((2, 2), 0.5), torch.ones(2, 3, 4)
    accepted, cand = rej.rejection_sample(p, drafts, None, u, e, valid)
    assert accepted == [1, 1]                           # row 0 refuses the 1; row 1 has one draft
    assert cand[0][1] == 2 and cand[1][1] == 2          # the correction, and the bonus


@pytest.mark.parametrize("k", [pytest.param(1, marks=pytest.mark.deep), 3])
def test_l11_speculator_sampling_rows_follow_the_processed_target(k):
    """Through the speculator (stage 4's processors on each position, then the rule), for a row with
    temperature, top-k and a penalty: the first emitted token's histogram matches the processed p."""
    from l4_sampler.params import SamplingParams
    from l4_sampler.sampler import RowState, Sampler, apply_penalties, apply_temperature, apply_top_k_top_p
    from l11_spec_decode.drafters import NgramDrafter
    from l11_spec_decode.speculator import Speculator

    class Req:
        def __init__(self, i):
            self.params = SamplingParams(temperature=0.7, top_k=5, frequency_penalty=0.4, max_tokens=50)
            self.prompt_ids, self.output_ids = [1, 2, 3], [4, 4]
            self.row = RowState(self.params, self.prompt_ids, self.output_ids, ())

    R = 20_000
    g = torch.Generator().manual_seed(3)
    base = torch.randn(1, V, generator=g) * 2
    logits = base.repeat(R * (k + 1), 1)
    spec = Speculator(NgramDrafter(1, 2), k, 1024, 8, seed=0)
    new, _, _ = spec.verify(logits, [Req(i) for i in range(R)], [[3] * k] * R, Sampler(0))
    row = RowState(Req(0).params, [1, 2, 3], [4, 4], ())
    z = apply_top_k_top_p(apply_temperature(apply_penalties(base.clone(), [row]), [row]), [row])
    assert tv(z.softmax(-1)[0], [t[0] for t in new]) <= 0.015      # 20k draws: 3x the noise at V = 8
