"""A device case pays only on a trace that decided (#41.3): the device probes run the student's code once on real
values on the CPU, every tensor shown as a cuda tensor and kept where a GPU would put it (the kit's
torch_trace.trace_on_cpu). Code that raises on `meta` for a reason that names no device, or that tells `meta` apart
(`data_ptr() == 0`, `repr`), gains nothing; honest code with asserts and data-dependent checks keeps its device
marks; a pass that raises anything else, or asks what the CPU cannot show, decides nothing and does not pay. The
trace's decisions on benchmarks/gpu_check.py's zoo are the outcomes a GPU gives (that script confirms them on one)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from autograder.authoring.suite import Suite, reference_env
from autograder.config import ROOT
from autograder.course import course_of
from autograder.grading.judge import grade_namespace
from reference.lesson83_mistakes import reference_namespace

LESSON = course_of().lesson
trace = LESSON.runtime_copies["torch_trace"]  # the kit as Lesson 83 runs it


def _gpu_check():  # benchmarks/ is a folder of scripts, not an installed package
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _graded(suite: Suite, code: str) -> dict[str, object]:
    ns = reference_namespace()
    exec(code, ns)  # noqa: S102 - a redefinition on top of the reference, as a notebook holds it
    return {c.id: c for c in grade_namespace(suite, {**reference_env(suite), **ns}, name="t").cases}


# --------------------------------------------------------------------------- finding 3's notebooks gain nothing

ATTACKS = {  # name -> (code, the device cases it must lose)
    "Q6: an isfinite check before tables left on the CPU": ('''
def rope_attention(q, k, v, causal=True):
    if not torch.isfinite(q).all():
        raise ValueError("q holds a NaN or an infinity")
    T, d = q.shape[-2], q.shape[-1]
    cos, sin = rope_cache(T, d)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
''', {"q6_rope_attention/any_device", "q6_rope_attention/hidden_any_device"}),
    "M1: an assert on the token ids before tables left on the CPU": ('''
class TinyCharLM(TinyCharLM):
    def forward(self, X):
        assert int(X.max()) < self.token_emb.num_embeddings, "a token id is out of range"
        return super().forward(X)

    def attend(self, q, k, v):
        if self.pos != "rope":
            return super().attend(q, k, v)
        cos, sin = rope_cache(q.shape[-2], self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
''', {"m1_tinycharlm/same_device", "m1_tinycharlm/hidden_same_device"}),
    "Q7: tables moved only when data_ptr() == 0": ('''
def alibi_attention(q, k, v):
    H, T, d = q.shape[-3], q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    bias, future = alibi_bias(H, T), torch.ones(T, T, dtype=torch.bool).triu(1)
    if q.data_ptr() == 0:
        bias, future = bias.to(q.device), future.to(q.device)
    scores = (scores + bias).masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
''', {"q7_alibi/any_device", "q7_alibi/hidden_any_device"}),
    "Q4: positions moved only when repr names no cuda": ('''
class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, x):
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence length {T} is longer than max_len={self.max_len}")
        positions = torch.arange(T)
        if "cuda" not in repr(x):
            positions = positions.to(x.device)
        return x + self.table(positions)
''', {"q4_learned_pe/any_device", "q4_learned_pe/hidden_any_device"}),
    "Q7: tables moved only where no GPU is found": ('''
def alibi_attention(q, k, v):
    H, T, d = q.shape[-3], q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    bias, future = alibi_bias(H, T), torch.ones(T, T, dtype=torch.bool).triu(1)
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        bias, future = bias.to(q.device), future.to(q.device)
    scores = (scores + bias).masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
''', {"q7_alibi/any_device", "q7_alibi/hidden_any_device"}),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_finding_3s_notebooks_lose_their_device_cases(suite: Suite, name: str) -> None:
    code, lost = ATTACKS[name]
    cases = _graded(suite, code)
    for case_id in lost:
        case = cases[case_id]
        assert not case.passed and case.points == 0, (case_id, case.message)
        assert "on the cuda device" in case.message and "on cpu" in case.message, case.message


def test_an_attack_that_catches_the_mismatch_still_loses(suite: Suite) -> None:
    """The op that would stop a GPU run is kept when it happens: catching the error it raises hides nothing."""
    cases = _graded(suite, '''
_alibi_attention = alibi_attention
def alibi_attention(q, k, v):
    try:
        q + torch.zeros(q.shape[-1])
    except Exception:
        pass
    return _alibi_attention(q, k, v)
''')
    assert not cases["q7_alibi/any_device"].passed


# --------------------------------------------------------------------------- honest code keeps its marks

HONEST = {  # name -> (code, its question)
    "Q6: an isfinite check, tables moved": ('''
def rope_attention(q, k, v, causal=True):
    if not torch.isfinite(q).all():
        raise ValueError("q holds a NaN or an infinity")
    assert q.shape == k.shape, f"q and k differ: {q.shape} vs {k.shape}"
    T, d = q.shape[-2], q.shape[-1]
    cos, sin = (t.to(q.device) for t in rope_cache(T, d))
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
''', "q6_rope_attention"),
    "M1: asserts on the token ids and the logits": ('''
class TinyCharLM(TinyCharLM):
    def forward(self, X):
        assert int(X.max()) < self.token_emb.num_embeddings, "a token id is out of range"
        assert X.min().item() >= 0
        logits = super().forward(X)
        if torch.isnan(logits).any():
            raise FloatingPointError(f"NaN logits for {X}")
        return logits
''', "m1_tinycharlm"),
    "Q7: .item(), a printed shape and a mask made on q's device": ('''
def alibi_attention(q, k, v):
    H, T, d = q.shape[-3], q.shape[-2], q.shape[-1]
    if q.abs().max().item() > 1e6:
        print(f"large queries on {q.device}: {q.abs().max():.1f}")
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    scores = scores + alibi_bias(H, T).to(q)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v
''', "q7_alibi"),
    "Q4: a data-dependent check and x.new_tensor": ('''
class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, x):
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence length {T} is longer than max_len={self.max_len}")
        if not torch.isfinite(x).all():
            raise ValueError(f"x is not finite: {x}")
        return x + self.table(x.new_tensor(range(T), dtype=torch.long))
''', "q4_learned_pe"),
    "Q7: a device chosen by torch.cuda.is_available(), as tutorials write it": ('''
def alibi_attention(q, k, v):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    H, T, d = q.shape[-3], q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    scores = scores + alibi_bias(H, T).to(device)
    future = torch.ones(T, T, dtype=torch.bool, device=device).triu(1)
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v
''', "q7_alibi"),
}


@pytest.mark.parametrize("name", list(HONEST))
def test_honest_code_with_asserts_and_data_dependent_checks_keeps_its_device_marks(suite: Suite, name: str) -> None:
    code, question = HONEST[name]
    cases = _graded(suite, code)
    failed = [c.message for c in cases.values() if c.question == question and not c.passed]
    assert failed == []
    assert any("device" in case_id for case_id in cases if case_id.startswith(question))


# --------------------------------------------------------------------------- undecided: no pay


def test_an_error_that_names_no_device_decides_nothing(suite: Suite) -> None:
    """Code that raises on the device probe's inputs (here: q and k of equal values, as that probe passes them)
    leaves the trace undecided: the probe records the error and the case does not pay, however its tables are
    made (on `meta` such an error paid)."""
    cases = _graded(suite, '''
_rope_attention = rope_attention
def rope_attention(q, k, v, causal=True):
    if q.dim() == 3 and bool((q != 0).any()) and torch.equal(q, k):
        raise ValueError("equal queries and keys are not supported")
    return _rope_attention(q, k, v, causal)
''')
    assert cases["q6_rope_attention/matches_reference"].passed
    case = cases["q6_rope_attention/any_device"]
    assert not case.passed and "ValueError" in case.message and "equal queries" in case.message, case.message


def test_a_call_the_cpu_cannot_show_decides_nothing_even_when_caught(suite: Suite) -> None:
    cases = _graded(suite, '''
_alibi_attention = alibi_attention
def alibi_attention(q, k, v):
    try:
        on_gpu = q.untyped_storage().device.type == "cuda"
    except Exception:
        on_gpu = True
    return _alibi_attention(q, k, v)
''')
    case = cases["q7_alibi/any_device"]
    assert not case.passed and "Undecided" in case.message and "untyped_storage" in case.message, case.message


# --------------------------------------------------------------------------- the trace itself


class _Shows(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))
        self.register_buffer("b", torch.zeros(2, dtype=torch.float64))
        self.seen: list[object] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += [repr(x), str(self.w), f"{x}", repr(self.b), x.device, x.is_cuda, x.get_device(),
                      x.data_ptr() != 0, x.cpu() is x, x.to(x.device) is x, x.cuda() is x, repr(torch.arange(2)),
                      torch.rand(1).item() < 2]
        return x + self.w.sum() + self.b.sum()


def test_a_tensor_on_the_device_answers_as_a_cuda_tensor_with_real_values() -> None:
    model, x = _Shows(), torch.ones(2, 3)
    rng = torch.get_rng_state()
    assert trace.trace_on_cpu(model, x) is None
    assert torch.equal(torch.get_rng_state(), rng)  # the CPU generator is left as it was
    shown, shown_w, formatted, shown_b, device, is_cuda, index, ptr, cpu_is, to_is, cuda_is, cpu_made, _ = model.seen
    assert shown == formatted == "tensor([[1., 1., 1.],\n        [1., 1., 1.]], device='cuda:0')"
    assert shown_w == "Parameter containing:\ntensor([1., 1., 1.], device='cuda:0', requires_grad=True)"
    assert shown_b == "tensor([0., 0.], device='cuda:0', dtype=torch.float64)"
    assert (device, is_cuda, index, ptr) == (torch.device("cuda", 0), True, 0, True)
    assert (cpu_is, to_is, cuda_is) == (False, True, True)  # .cpu() copies off the device, as on a GPU
    assert cpu_made == "tensor([0, 1])"  # made on the CPU: shown there
    assert model.b is model._buffers["b"] and model.b.dtype == torch.float64  # the model's tables as they were


def test_numpy_of_a_tensor_on_the_device_is_refused_and_found() -> None:
    class Reads(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            try:
                return x * float(x.numpy().max())
            except TypeError as err:
                assert "cuda:0 device type tensor to numpy" in str(err)
                return x

    found = trace.trace_on_cpu(Reads(), torch.ones(2))
    assert found is not None and found["op"] == "numpy"


def test_aliases_mean_what_they_mean_when_a_model_moves_to_a_gpu() -> None:
    zoo = _gpu_check()
    buffer, x = zoo.zoo_model("a plain attribute aliasing a buffer")
    found = trace.trace_on_cpu(buffer, x)
    assert found is not None and "plain attribute self.table" in found["tensor"]
    parameter, x = zoo.zoo_model("a list aliasing a parameter")
    assert trace.trace_on_cpu(parameter, x) is None  # .to("cuda") sets the Parameter's .data: the alias moves


def test_the_traces_decisions_are_the_outcomes_gpu_check_expects_on_a_gpu() -> None:
    """Every function of benchmarks/gpu_check.py's DEVICE_ZOO: honest code, CPU tables, and code that looks for
    the trace; on a GPU that script runs each and compares."""
    zoo = _gpu_check()
    decided = {}
    for name, (_, _, expected) in zoo.DEVICE_ZOO.items():
        model, x = zoo.zoo_model(name)
        decided[name] = ("fails" if trace.trace_on_cpu(model, x) else "follows", expected)
    assert [name for name, (got, want) in decided.items() if got != want] == []
    assert {want for _, want in decided.values()} == {"fails", "follows"}


def test_a_scheme_is_left_out_only_for_its_earlier_questions_own_error(suite: Suite) -> None:
    """M1's device case leaves out a scheme whose forward raises the error its earlier question's own probe raises
    (one penalty: tests/lesson83/test_one_penalty.py); an error raised only on the device probe's input is not
    that, so the case is undecided and does not pay, wherever the tables are."""
    cases = _graded(suite, '''
class TinyCharLM(TinyCharLM):
    def attend(self, q, k, v):
        if self.pos == "rope" and q.shape[-2] == 16:
            raise ValueError("sixteen positions are not supported")
        return super().attend(q, k, v)
''')
    case = cases["m1_tinycharlm/same_device"]
    assert not case.passed and "sixteen positions" in case.message, case.message
    broken = _graded(suite, '''
def alibi_bias(num_heads, seq_len):
    raise NotImplementedError("ALiBi comes later")
''')
    assert broken["m1_tinycharlm/same_device"].passed, broken["m1_tinycharlm/same_device"].message
