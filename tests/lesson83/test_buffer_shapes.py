"""Issue 40 item 3: the consequence checks use the student's own shapes. A SinusoidalPE that keeps its table in a
buffer of another layout, with a forward that matches it, is the same module: the grader writes its chosen table
into that buffer in the buffer's own shape (the state-dict entry `pe`, then the float64 `pe` after a move), and
the module keeps every point of Q3. The catalogue's variants hold two of these layouts (reference/variants.py);
more are here. Graded in this process (`grade_namespace`); the sandbox's run of the catalogued two is in
test_consequence_attacks.py."""

from __future__ import annotations

import pytest

from autograder.authoring.suite import Suite, reference_env
from autograder.grading.judge import grade_namespace
from reference.variants import CORRECT_VARIANTS

Q3 = "q3_sinusoidal_module"


def _module(buffer: str, rows: str) -> str:
    """A SinusoidalPE whose buffer `pe` is the float32 table laid out by `buffer` (an expression of `table`, the
    (max_len, d_model) array), and whose forward adds `rows` (an expression of `pe` and `T`) to x."""
    return f'''
class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()
        self.max_len = max_len
        table = torch.tensor(sinusoidal_pe(max_len, d_model), dtype=torch.float32)
        self.register_buffer("pe", {buffer})

    def forward(self, x):
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"length {{T}} is longer than max_len={{self.max_len}}")
        pe = self.pe
        return x + {rows}
'''


SHAPES = {
    "batch_axis": CORRECT_VARIANTS["batch_axis_buffer_module"],  # (1, max_len, d_model), pe[:, :T]
    "seq_first": CORRECT_VARIANTS["seq_first_buffer_module"],  # (max_len, 1, d_model), pe[:T].transpose(0, 1)
    "seq_first_squeeze": _module("table.unsqueeze(1)", "pe[:T, 0]"),
    "trailing_axis": _module("table.unsqueeze(-1)", "pe[:T].squeeze(-1)"),
    "two_leading_axes": _module("table[None, None]", "pe[0, 0, :T]"),
    "transposed": _module("table.T.contiguous()", "pe[:, :T].T"),
    "batch_axis_float64": _module("table.double().unsqueeze(0)", "pe[:, :T].to(x.dtype)"),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_buffer_in_another_layout_keeps_every_point_of_q3(suite: Suite, name: str) -> None:
    env = reference_env(suite)
    exec(SHAPES[name], env)  # noqa: S102
    result = grade_namespace(suite, env, name=name)
    lost = [(c.id, c.message) for c in result.cases if c.question == Q3 and not c.passed]
    assert lost == []
    assert result.question_scores()[Q3] == suite.config.questions[Q3].points


def test_the_catalogue_holds_both_layouts_of_the_issue() -> None:
    """The two layouts of issue 40 finding 3 are catalogued variants, so every test of the variants (the mutation
    suite, the review's zoo, the judge) keeps them at full marks with no flag."""
    assert 'self.register_buffer("pe", pe.unsqueeze(0))' in CORRECT_VARIANTS["batch_axis_buffer_module"]
    assert "pe = torch.zeros(max_len, 1, d_model)" in CORRECT_VARIANTS["seq_first_buffer_module"]
