import torch

from specdec_edu import speculative_generate
from specdec_edu.measure import cost_ratio, forward_seconds, latency_curve, parameter_bytes
from specdec_edu.viz import legend, mark_tokens, token_pieces, tokens_html


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + i % 26) for i in ids)


def test_latency_helpers(target, draft):
    assert forward_seconds(target, 3, context_length=8, repeats=2) > 0
    curve = latency_curve(target, ns=(1, 4), context_length=8, repeats=2, progress=False)
    assert set(curve) == {1, 4} and all(v > 0 for v in curve.values())
    assert cost_ratio(draft, target, context_length=8, repeats=2) > 0
    assert parameter_bytes(target) == 4 * sum(p.numel() for p in target.parameters())


def test_token_rendering(target, close_draft):
    out = speculative_generate(target, close_draft, torch.tensor([[1, 2, 3]]), max_new_tokens=12, gamma=3)
    html = tokens_html(CharTokenizer(), out)
    assert html.count("<span title=") == 12
    pieces = token_pieces(CharTokenizer(), out.new_tokens.tolist())
    assert "".join(pieces) == CharTokenizer().decode(out.new_tokens.tolist())
    plain = mark_tokens(pieces, out.token_sources, color=False)
    assert ("[" in plain) == ("accepted" in out.token_sources)
    assert "\033[" in mark_tokens(pieces, out.token_sources, color=True) and "\033[" in legend(True)
