"""Constructs from real model code (Bloom, CodeGen, ...) that torch.compile captures: each is
compared with eager and its graphs, breaks and recompiles are counted."""

import collections

import pytest
import torch

import framejit
from framejit.testing import RecordingBackend, assert_close_to_eager

# -- torch.autograd.Function.apply ----------------------------------------------------------------


class BloomGelu(torch.autograd.Function):
    """Bloom's GELU: a static forward and a hand-written backward."""

    @staticmethod
    def forward(ctx, input):
        ctx.save_for_backward(input)
        return input * 0.5 * (1.0 + torch.tanh(0.79788456 * input * (1 + 0.044715 * input * input)))

    @staticmethod
    def backward(ctx, grad_output):
        input = ctx.saved_tensors
        input = input[0]
        tanh_out = torch.tanh(0.79788456 * input * (1 + 0.044715 * input * input))
        ff = 0.5 * input * ((1 - tanh_out * tanh_out) * (0.79788456 + 0.1070322243 * input * input)) \
            + 0.5 * (1 + tanh_out)
        return ff * grad_output


class ScaleGrad(torch.autograd.Function):
    """Identity forward, a backward that is not the derivative (eager's backward must be used),
    a non-tensor argument and two outputs."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.clone(), x * 2

    @staticmethod
    def backward(ctx, g1, g2):
        return g1 * ctx.scale + g2, None


def _grads_match(fn, *shapes):
    inputs = [torch.randn(*s, requires_grad=True) for s in shapes]
    eager_inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    compiled = framejit.compile(fn, backend=RecordingBackend())
    out = compiled(*inputs)
    expected = fn(*eager_inputs)
    assert_close_to_eager(out, expected)
    out.sum().backward()
    expected.sum().backward()
    for a, b in zip(inputs, eager_inputs):
        assert_close_to_eager(a.grad, b.grad)


def test_autograd_function_apply_is_one_graph_with_eager_gradients(stats):
    def f(x, w):
        return BloomGelu.apply(x @ w) * 2

    _grads_match(f, (4, 8), (8, 8))
    assert (stats.graphs, stats.graph_breaks, stats.eager_frames) == (1, 0, 0)
    _grads_match(f, (4, 8), (8, 8))  # a second call of the same kind reuses the graph
    assert stats.recompiles == 0


bloom_gelu = BloomGelu.apply  # the function kept under a name of its own


def test_autograd_function_apply_kept_as_a_global(stats):
    def f(x):
        return bloom_gelu(x + 1).sum(-1)

    _grads_match(f, (3, 4))
    assert (stats.graphs, stats.graph_breaks, stats.eager_frames) == (1, 0, 0)


def test_autograd_function_with_several_outputs_and_a_number(stats):
    def f(x):
        a, b = ScaleGrad.apply(x + 1, 3.0)
        return a * b

    _grads_match(f, (5,))
    assert (stats.graphs, stats.graph_breaks, stats.eager_frames) == (1, 0, 0)


def test_autograd_function_in_a_module(check):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(6, 6)

        def forward(self, x):
            return BloomGelu.apply(self.fc(x))

    check(Block(), torch.randn(3, 6))


def test_autograd_function_class_is_guarded(stats):
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    class Triple(Double):
        @staticmethod
        def forward(ctx, x):
            return x * 3

    def f(fn, x):
        return fn.apply(x) + 1

    compiled = framejit.compile(f, backend=RecordingBackend())
    x = torch.randn(3)
    assert_close_to_eager(compiled(Double, x), x * 2 + 1)
    assert_close_to_eager(compiled(Triple, x), x * 3 + 1)
    assert stats.recompiles == 1 and stats.graph_breaks == 0


# -- modules created inside forward ---------------------------------------------------------------


class CodeGenAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_dropout = torch.nn.Dropout(0.0)

    def forward(self, q, k):
        w = q @ k.transpose(-1, -2)
        w = torch.nn.Softmax(dim=-1)(w)
        return self.attn_dropout(w)


def test_stateless_module_created_in_forward(check):
    check(CodeGenAttention(), torch.randn(2, 4, 8), torch.randn(2, 4, 8))


def test_several_created_modules(check):
    def f(x):
        y = torch.nn.GELU(approximate="tanh")(x)
        return torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Flatten(0))(y) + torch.nn.Identity()(x).sum()

    check(f, torch.randn(3, 4))


def test_created_module_kept_across_a_break(stats):
    def f(x):
        act = torch.nn.LeakyReLU(0.2)
        y = act(x)
        print("break")
        return act(y), act

    compiled = framejit.compile(f, backend=RecordingBackend())
    x = torch.randn(5)
    out, act = compiled(x)
    expected, eager_act = f(x)
    assert_close_to_eager(out, expected)
    assert type(act) is torch.nn.LeakyReLU and act.negative_slope == 0.2
    for _ in range(3):
        assert_close_to_eager(compiled(x)[0], expected)
    assert stats.graph_breaks == 1 and stats.eager_frames == 0 and stats.recompiles == 0


def test_module_with_parameters_created_in_forward_still_breaks(stats):
    def f(x):
        return torch.nn.Linear(3, 3)(x)

    torch.manual_seed(0)
    expected = f(torch.ones(2, 3))
    torch.manual_seed(0)
    out = framejit.compile(f)(torch.ones(2, 3))
    assert_close_to_eager(out, expected)  # the random stream is eager's
    reasons = [m for _, m in stats.fallback_reasons + stats.break_reasons]
    assert any("creating the module Linear()" in m for m in reasons), reasons


# -- collections.namedtuple made in the function, dict.fromkeys -----------------------------------


def test_namedtuple_class_made_in_the_function(check):
    def f(x):
        Pair = collections.namedtuple("Pair", ["a", "b"], defaults=[2.0])
        p = Pair(x, x + 1)
        q = Pair(a=x)
        return p.a * p.b + q.b, p._replace(a=x * 3).a

    check(f, torch.randn(3))


def test_namedtuple_class_kept_across_a_break_does_not_recompile(stats):
    def f(x):
        Pair = collections.namedtuple("Pair", "a b")
        p = Pair(x, x + 1)
        print("break")
        return p.a * p.b, Pair(x, x)

    compiled = framejit.compile(f, backend=RecordingBackend())
    for _ in range(4):
        x = torch.randn(3)
        out, pair = compiled(x)
        assert_close_to_eager(out, x * (x + 1))
        assert type(pair).__name__ == "Pair" and pair._fields == ("a", "b")
        assert type(pair).__module__ == __name__
    assert (stats.graphs, stats.graph_breaks, stats.recompiles, stats.eager_frames) == (2, 1, 0, 0)


def test_dict_fromkeys(check):
    def f(x):
        d = dict.fromkeys(["a", "b"], 0)
        d["a"] = x
        e = collections.OrderedDict.fromkeys("xy")
        return d["a"] + d["b"], list(e), dict.fromkeys(range(2))

    check(f, torch.randn(3))


# -- torch predicates and flags -------------------------------------------------------------------


def test_torch_type_predicates_without_tensor_arguments(check):
    def f(x, n):
        a = torch.is_tensor([x]) or torch.is_tensor(None) or torch.is_tensor(n)
        b = torch.is_storage(None) or torch.jit.isinstance(x, torch.Tensor)
        names = torch.jit.annotate(list[str], [])
        names.append("y")
        y = torch.jit.annotate(torch.Tensor, x)
        return y + int(a) + int(b), names

    check(f, torch.randn(3), 2)


def test_global_state_queries_are_guarded(stats):
    def f(x):
        if torch.are_deterministic_algorithms_enabled():
            x = x + 1
        if torch.cuda.is_available() or torch.distributed.is_available() and torch.distributed.is_initialized():
            x = x + 10
        return x * 2

    compiled = framejit.compile(f, backend=RecordingBackend())
    x = torch.randn(3)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        assert_close_to_eager(compiled(x), f(x))
        torch.use_deterministic_algorithms(not before)
        assert_close_to_eager(compiled(x), f(x))
    finally:
        torch.use_deterministic_algorithms(before)
    assert_close_to_eager(compiled(x), f(x))
    assert (stats.graphs, stats.graph_breaks, stats.eager_frames, stats.recompiles) == (2, 0, 0, 1)


def test_torch_backends_flags_are_read_and_guarded(stats):
    def f(x):
        if torch.backends.cuda.matmul.allow_tf32 or not torch.backends.cudnn.enabled:
            return x + 1
        if torch.backends.cudnn.is_available() and torch.backends.mha.get_fastpath_enabled():
            return x - 1
        return x * torch.backends.cudnn.allow_tf32

    compiled = framejit.compile(f, backend=RecordingBackend())
    x = torch.randn(3)
    assert_close_to_eager(compiled(x), f(x))
    assert_close_to_eager(compiled(x), f(x))
    assert (stats.graphs, stats.graph_breaks, stats.eager_frames, stats.recompiles) == (1, 0, 0, 0)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = not old
    try:
        assert_close_to_eager(compiled(x), f(x))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    with torch.backends.cudnn.flags(enabled=not torch.backends.cudnn.enabled):
        assert_close_to_eager(compiled(x), f(x))
    assert stats.recompiles == 2 and stats.eager_frames == 0


# -- module subclasses with their own __getitem__, ParameterDict ----------------------------------


class Stack(torch.nn.Module):
    """A module that indexes its layers through its own __getitem__/__len__/__iter__."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)])

    def __getitem__(self, i):
        return self.layers[i]

    def __len__(self):
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)

    def forward(self, x):
        x = self[0](x)
        for i in range(1, len(self)):
            x = self[i](x).relu()
        return sum(layer(x) for layer in self)


class MyModuleList(torch.nn.ModuleList):
    def __getitem__(self, idx):
        return super().__getitem__(idx % len(self))


def test_module_with_its_own_getitem(check):
    check(Stack(), torch.randn(2, 4))


def test_module_list_subclass_overriding_getitem(check):
    layers = MyModuleList([torch.nn.Linear(3, 3), torch.nn.Tanh()])

    def f(x):
        return layers[3](layers[0](x))

    check(f, torch.randn(2, 3))


class Scales(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scales = torch.nn.ParameterDict({"a": torch.nn.Parameter(torch.randn(3)),
                                              "b": torch.nn.Parameter(torch.randn(3))})

    def forward(self, x):
        y = x * self.scales["a"] + self.scales["b"]
        if "c" not in self.scales and "a" in self.scales:
            y = y + sum(p.sum() for p in self.scales.values())
        for k in self.scales:
            y = y * self.scales[k]
        return y + len(self.scales) + sum(v.mean() for _, v in self.scales.items())


def test_parameter_dict_indexing(check):
    m = Scales()
    check(m, torch.randn(2, 3))
    out = framejit.compile(m)(torch.randn(2, 3))
    out.sum().backward()  # gradients reach the dict's parameters
    assert m.scales["a"].grad is not None


# -- a staticmethod forward -----------------------------------------------------------------------


class StaticForward(torch.nn.Module):
    @staticmethod
    def forward(x, scale=2.0):
        return torch.relu(x) * scale


class UsesStatic(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act = StaticForward()

    def forward(self, x):
        return self.act(x) + self.act(x, scale=3.0) + self.act.forward(x)


def test_staticmethod_forward(check):
    check(StaticForward(), torch.randn(4))


def test_staticmethod_forward_of_a_submodule(check):
    check(UsesStatic(), torch.randn(4))


# -- min/max on tensors ---------------------------------------------------------------------------


def test_min_max_of_one_element_tensors(check):
    def f(a, b, c):
        return min(a, b) + max(a, b, c) * 2 + max([c, b, a]) - min(a.reshape(1), b.reshape(1))

    check(f, torch.tensor(1.0), torch.tensor(-2.0), torch.tensor(3.0))


@pytest.mark.parametrize("values", [(1.0, 1.0, 2.0), (2.0, 1.0, 1.0), (float("nan"), 1.0, 0.0),
                                    (1.0, float("nan"), 0.0)])
def test_min_max_pick_the_item_python_picks(values, stats):
    def f(a, b, c):
        return min(a, b, c), max(a, b, c), max(c, b, a)

    args = [torch.tensor(v) for v in values]
    out = framejit.compile(f, backend=RecordingBackend())(*args)
    for a, b in zip(out, f(*args)):
        torch.testing.assert_close(a, b, equal_nan=True)  # NaN compares false, as in Python
    assert stats.graph_breaks == 0 and stats.graphs == 1


def test_min_max_with_a_tensor_key(check):
    def f(ts):
        return max(ts, key=lambda t: t.sum()) - min(ts, key=lambda t: t.abs().max())

    check(f, [torch.randn(2, 3) for _ in range(4)])


def test_min_max_over_a_tensor(check):
    def f(x):
        return min(x) * max(x)

    check(f, torch.randn(5))


def test_min_max_keys_that_are_not_tensors_still_fold(check):
    def f(ts):
        return max(ts, key=lambda t: t.shape[0]) + min(t.dim() for t in ts)

    check(f, [torch.randn(2), torch.randn(3), torch.randn(3)])


def test_min_max_of_a_tensor_and_a_number_breaks(stats):
    def f(x):
        return max(x, 0.5) * 2

    x = torch.tensor(0.25)
    assert f(x) == 1.0 and type(max(x, 0.5)) is float  # the result's type depends on the values
    assert framejit.compile(f)(x) == 1.0
    assert framejit.compile(f)(torch.tensor(2.0)) == 4.0
    reasons = [m for _, m in stats.break_reasons]
    assert any("max() comparing tensors" in m for m in reasons), reasons


def test_min_max_of_several_element_tensors_raise_like_eager():
    def f(x, y):
        return max(x, y)

    with pytest.raises(RuntimeError, match="ambiguous"):
        framejit.compile(f)(torch.randn(3), torch.randn(3))


# -- sequence repetition, function attributes -----------------------------------------------------


def test_sequence_repetition_with_the_count_first(check):
    def f(x, xs):
        parts = 4 * [x]
        pair = 2 * (x, x + 1)
        xs *= 2
        return torch.cat(parts + list(pair)), len(xs), xs

    check(f, torch.randn(2), [torch.randn(1)])


def _helper(x):
    return x + 1


_helper.enabled = True
_helper.scale = 3


def _plain(x):
    return x


def test_truth_of_a_function_attribute(check):
    def f(x):
        if _helper.enabled and getattr(_plain, "enabled", False) is False:
            x = _helper(x) * _helper.scale
        if hasattr(_plain, "scale"):
            x = x * 100
        if _plain and (lambda: 0) and torch.nn.Linear.forward:
            x = x - 1
        return x

    check(f, torch.randn(3))


def test_function_attribute_is_guarded(stats):
    def f(x):
        return x * 2 if _helper.enabled else x * 3

    compiled = framejit.compile(f, backend=RecordingBackend())
    x = torch.randn(3)
    assert_close_to_eager(compiled(x), x * 2)
    _helper.enabled = False
    try:
        assert_close_to_eager(compiled(x), x * 3)
    finally:
        _helper.enabled = True
    assert stats.recompiles == 1 and stats.graph_breaks == 0


# -- numbers computed by .item() and carried across the break -------------------------------------


def test_item_in_a_condition_compiles_once_per_outcome(stats):
    def f(y):  # the README's pattern
        if y.sum().item() > 0:
            return y * 2
        return y - 1

    compiled = framejit.compile(f, backend=RecordingBackend())
    for i in range(20):
        y = torch.randn(4) + (1 if i % 2 else -1) * 3
        assert_close_to_eager(compiled(y), f(y))
    assert stats.eager_frames == 0 and stats.graph_breaks >= 1
    assert stats.recompiles <= 1 and stats.graphs <= 3, stats


def test_item_in_tensor_arithmetic_is_a_graph_input(stats):
    def f(t):
        s = t.sum().item()
        u = t * s + s / 2 - 1 / (1 + s * 0 + 1) + (s ** 2 - 1 if s > 0 else 1 - s)
        return u * t.max().item()

    backend = RecordingBackend()
    compiled = framejit.compile(f, backend=backend)
    for _ in range(20):
        t = torch.randn(3)
        assert_close_to_eager(compiled(t), f(t))
    # One more version of the first resume function for the other side of `s > 0`.
    assert stats.eager_frames == 0 and stats.recompiles == 1
    assert stats.graphs == 4, stats
    placeholders = [n.name for n in backend.graphs[1].graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 2, placeholders  # t and the carried number


def test_item_times_a_tensor(stats):
    def f(t):
        return t * t.sum().item()

    compiled = framejit.compile(f, backend=RecordingBackend())
    for _ in range(10):
        t = torch.randn(3)
        assert_close_to_eager(compiled(t), f(t))
    assert (stats.graphs, stats.recompiles, stats.eager_frames) == (2, 0, 0)


def test_item_dtypes_follow_python_numbers(stats):
    def f(i, h, d):
        n = i.sum().item()          # an int
        x = h.sum().item()          # a float
        return i * n, h * x, i * x, d * x, (h > x), i // max(n, 1)

    compiled = framejit.compile(f, backend=RecordingBackend())
    for k in range(5):
        args = (torch.arange(4) + k, torch.randn(3, dtype=torch.float16), torch.randn(2, dtype=torch.float64))
        out, expected = compiled(*args), f(*args)
        assert [t.dtype for t in out] == [t.dtype for t in expected]
        assert_close_to_eager(out, expected)
    assert stats.eager_frames == 0


def test_item_in_computed_comparisons_and_returned(stats):
    def f(t):
        s = t.sum().item()
        flag = 0 < s
        big = (s * 2) > 1  # computed from the number: guarded on the number's value
        return t * s if flag else t, s, flag, s + 1, big

    compiled = framejit.compile(f, backend=RecordingBackend())
    for _ in range(6):
        t = torch.randn(3)
        assert_close_to_eager(compiled(t), f(t))
    assert stats.eager_frames == 0


def test_item_through_int_float_abs_and_negation(stats):
    def f(t, i):
        n = int(i.sum().item())
        s = t.sum().item()
        return t * n + i * -n + t * abs(s) + t * float(n) - round(s) * t + (+s) * t

    compiled = framejit.compile(f, backend=RecordingBackend())
    for k in range(8):
        t, i = torch.randn(3), torch.arange(3) * k - 4
        out, expected = compiled(t, i), f(t, i)
        assert out.dtype == expected.dtype
        assert_close_to_eager(out, expected)
    assert stats.eager_frames == 0 and stats.recompiles == 0, stats


def test_tolist_items_in_tensor_arithmetic(stats):
    def f(t):
        a, b = t[:2].tolist()
        return t * a + b

    compiled = framejit.compile(f, backend=RecordingBackend())
    for _ in range(6):
        t = torch.randn(3)
        assert_close_to_eager(compiled(t), f(t))
    assert (stats.graphs, stats.recompiles, stats.eager_frames) == (2, 0, 0)


def test_item_used_as_a_size_is_guarded_on_its_value(stats):
    def f(t):
        n = int(t.sum().item())
        return torch.ones(n) * 2

    compiled = framejit.compile(f, backend=RecordingBackend())
    for n in (2, 3, 2):
        t = torch.tensor([float(n)])
        assert_close_to_eager(compiled(t), f(t))
    assert stats.eager_frames == 0 and stats.recompiles == 1


def test_bloom_training_step_uses_its_gelu_backward(stats):
    """transformers' Bloom in train mode calls its GELU autograd.Function: one graph, and the
    gradients of every parameter equal eager's."""
    import copy
    import warnings

    T = pytest.importorskip("transformers")
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = T.BloomForCausalLM(T.BloomConfig(n_layer=2, hidden_size=64, n_head=4, vocab_size=128,
                                                 hidden_dropout=0.0, attention_dropout=0.0)).train()
    reference = copy.deepcopy(model)
    compiled = framejit.compile(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(ids).logits.sum().backward()
        reference(ids).logits.sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert (stats.graphs, stats.graph_breaks, stats.eager_frames) == (1, 0, 0)


class ReadsValues(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * float(x.sum())  # reads a value: fake tensors cannot run it

    @staticmethod
    def backward(ctx, g):
        return g


def test_autograd_function_whose_forward_reads_values_breaks(stats):
    def f(x):
        return ReadsValues.apply(x + 1) * 2

    x = torch.randn(3)
    assert_close_to_eager(framejit.compile(f, backend=RecordingBackend())(x), f(x))
    reasons = [m for _, m in stats.break_reasons + stats.fallback_reasons]
    assert any("ReadsValues.apply(), whose forward cannot run on fake tensors" in m for m in reasons), reasons


def test_torch_backends_setters_run_on_every_call(stats):
    def f(x, on):
        torch.backends.mha.set_fastpath_enabled(on)
        return x * 2 if torch.backends.mha.get_fastpath_enabled() else x * 3

    compiled = framejit.compile(f, backend=RecordingBackend())
    x = torch.randn(3)
    before = torch.backends.mha.get_fastpath_enabled()
    try:
        for on in (True, False, True):
            assert_close_to_eager(compiled(x, on), x * 2 if on else x * 3)
            assert torch.backends.mha.get_fastpath_enabled() is on
    finally:
        torch.backends.mha.set_fastpath_enabled(before)
    assert stats.eager_frames == 0



def test_a_carried_number_through_thousands_of_steps_is_one_graph_input(stats):
    """``s = s + 1`` 2000 times on a number from ``.item()``, then tensor arithmetic with it: the
    graph computes the chain from one input (built without recursion per step)."""
    def f(t):
        s = t.sum().item()
        for _ in range(2000):
            s = s + 1
        return t * s

    backend = RecordingBackend()
    compiled = framejit.compile(f, backend=backend)
    for _ in range(3):
        t = torch.randn(3)
        assert_close_to_eager(compiled(t), f(t))
    assert stats.eager_frames == 0 and stats.recompiles == 0, stats
    placeholders = [n.name for n in backend.graphs[-1].graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 2, placeholders  # t and the carried number
