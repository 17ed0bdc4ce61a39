"""Dynamic shapes (issue 12): automatic dynamic, dynamic=True/False, mark_dynamic/mark_static,
size guards and their messages, sizes used in Python, what user backends receive."""

import logging

import pytest
import torch

import framejit
from framejit.capture import convert_frame as cf
from framejit.testing import RecordingBackend, declined_kernels


def _entries(fn):
    return cf.mine_entries(fn.__wrapped__.__code__, fn._framejit_context)


def _guard_source(fn, i=-1):
    return _entries(fn)[i][3].guard_fn.__framejit_source__


def _size_guard_texts(fn, i=-1):
    g = _entries(fn)[i][3].guards.size_guard
    return [] if g is None else g.texts()


def _check(fn, *args):
    torch.testing.assert_close(fn(*args), fn.__wrapped__(*args))


# -- automatic dynamic ---------------------------------------------------------------------------

def test_ten_sizes_give_two_graphs_and_log_which_dim(stats, caplog):
    @framejit.compile(backend="eager")
    def f(x):
        return torch.relu(x) * 2 + x.sum(-1, keepdim=True)

    with caplog.at_level(logging.INFO, logger="framejit.recompiles"):
        for n in range(2, 12):
            _check(f, torch.randn(n, 16))
    assert stats.graphs == 2
    assert stats.recompiles == 1
    assert stats.eager_frames == 0
    assert "x.shape[0] is now dynamic: 2 → 3" in caplog.text
    assert stats.recompile_reasons[0][1] == "x.shape[0]: 2 → 3"
    assert _size_guard_texts(f) == ["2 <= x.shape[0]  # 0/1 specialization"]


def test_mlp_over_batch_sizes(stats):
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    compiled = framejit.compile(mlp, backend="eager")
    for b in (1, 2, 3, 4, 8):
        x = torch.randn(b, 16)
        torch.testing.assert_close(compiled(x), mlp(x))
    assert stats.graphs == 2  # batch 1 (static), then every batch >= 2
    assert stats.eager_frames == 0


def test_reset_forgets_the_sizes_seen(stats):
    @framejit.compile(backend="eager")
    def f(x):
        return x + 1

    for n in (2, 3):
        _check(f, torch.randn(n))
    assert _entries(f)[-1][3].guards.size_guard is not None
    framejit.reset()
    _check(f, torch.randn(4))
    assert stats.graphs == 1 and _entries(f)[-1][3].guards.size_guard is None  # static again


def test_dynamic_false_specializes_every_shape(stats):
    @framejit.compile(backend="eager", dynamic=False)
    def f(x):
        return x * 2

    for n in range(2, 7):
        _check(f, torch.randn(n, 3))
    assert stats.graphs == 5
    assert _size_guard_texts(f) == []


def test_dynamic_true_one_graph_from_the_first_call(stats):
    @framejit.compile(backend="eager", dynamic=True)
    def f(x):
        return (x + 1).softmax(-1)

    for n in (2, 5, 9):
        for m in (3, 7):
            _check(f, torch.randn(n, m))
    assert stats.graphs == 1
    assert _size_guard_texts(f) == ["2 <= x.shape[0]  # 0/1 specialization",
                                    "2 <= x.shape[1]  # 0/1 specialization"]


def test_sizes_zero_and_one_stay_specialized(stats):
    @framejit.compile(backend="eager", dynamic=True)
    def f(x):
        return x.sum(0) + 1

    _check(f, torch.randn(1, 4))
    _check(f, torch.randn(0, 4))
    _check(f, torch.randn(5, 4))
    _check(f, torch.randn(6, 4))
    _check(f, torch.randn(1, 4))
    assert stats.graphs == 3  # 1, 0, and one for every size >= 2
    assert stats.recompile_reasons[0][1] == "x.shape[0]: 1 → 0"


def test_a_size_of_one_after_dynamic_compiles_again(stats):
    @framejit.compile(backend="eager")
    def f(x):
        return x * 3

    for n in (4, 5, 1, 7):
        _check(f, torch.randn(n, 2))
    assert stats.graphs == 3
    assert stats.recompile_reasons[1][1].startswith("2 <= x.shape[0] no longer holds: x.shape[0] is 1")


# -- marks -----------------------------------------------------------------------------------------

def test_mark_dynamic_one_graph_over_five_sizes(stats):
    @framejit.compile(backend="eager")
    def f(x):
        return torch.cumsum(x, 0) - x.mean()

    for n in (3, 4, 6, 10, 17):
        x = torch.randn(n, 5)
        framejit.mark_dynamic(x, 0)
        _check(f, x)
    assert stats.graphs == 1
    assert stats.recompiles == 0


@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_marked_dimension_fixed_by_the_code_raises(stats, fullgraph):
    @framejit.compile(backend="eager", fullgraph=fullgraph)
    def f(x):
        if x.shape[0] == 5:
            return x + 1
        return x - 1

    x = torch.randn(5, 3)
    framejit.mark_dynamic(x, 0)
    with pytest.raises(framejit.errors.ConstraintViolation,
                       match=r"x.shape\[0\] was marked dynamic .* only works for x.shape\[0\] == 5"
                             r".*Remove the mark_dynamic call.*while compiling .*f at .*test_dynamic.py"):
        f(x)
    _check(f, torch.randn(5, 3))  # unmarked: static, as usual
    assert stats.graphs == 1


def test_marked_dimensions_get_their_own_symbols(stats):
    @framejit.compile(backend="eager")
    def f(x, y):
        return x.sum() + y.sum()

    for n, m in ((4, 4), (5, 7), (9, 3)):
        x, y = torch.randn(n), torch.randn(m)
        framejit.mark_dynamic(x, 0)
        framejit.mark_dynamic(y, 0)
        _check(f, x, y)
    assert stats.graphs == 1  # no duck sizing between marked sizes: 4 and 4 were not tied
    assert _size_guard_texts(f) == ["2 <= x.shape[0]  # 0/1 specialization",
                                    "2 <= y.shape[0]  # 0/1 specialization"]


def test_mark_dynamic_with_range_guards_the_range(stats):
    @framejit.compile(backend="eager")
    def f(x):
        return x + 1

    for n in (4, 8, 9):
        x = torch.randn(n)
        framejit.mark_dynamic(x, 0, min=3, max=8)
        _check(f, x)
    assert stats.graphs == 2
    texts = _size_guard_texts(f, 0)
    assert "3 <= x.shape[0]" in texts and "x.shape[0] <= 8" in texts
    assert stats.recompile_reasons[0][1] == "x.shape[0] <= 8 no longer holds: x.shape[0] is 9"


def test_mark_static_keeps_a_dimension_fixed(stats):
    @framejit.compile(backend="eager", dynamic=True)
    def f(x):
        return x * 2

    for n in (2, 3, 4):
        x = torch.randn(5, n)
        framejit.mark_static(x, 1)
        _check(f, x)
    assert stats.graphs == 3
    assert "x.shape[0]" in _guard_source(f) and "___t[1] != 4" in _guard_source(f)


# -- sizes in Python --------------------------------------------------------------------------------

def test_size_arithmetic_in_views_stays_symbolic(stats):
    backend = RecordingBackend()

    @framejit.compile(backend=backend, dynamic=True)
    def f(x):
        n = x.shape[0]
        return x.reshape(n * 2, -1).sum(1), torch.zeros(n + 1), x.view(-1, x.shape[1] // 2, 2)

    for n in (2, 3, 7):
        x = torch.randn(n, 4)
        for a, b in zip(f(x), f.__wrapped__(x)):
            torch.testing.assert_close(a, b)
    assert stats.graphs == 1
    # A user backend gets a graph of the tensor alone, which reads the sizes it needs from it.
    gm = backend.graphs[0]
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    assert placeholders == ["x"]
    example = backend.example_inputs[0]
    assert [type(e) for e in example] == [torch.Tensor]
    sizes = [n.args for n in gm.graph.nodes if n.op == "call_method" and n.target == "size"]
    assert [a[1] for a in sizes] == [0, 1]
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    import operator
    assert operator.mul in targets and operator.add in targets and operator.floordiv in targets
    # The native graph takes the sizes as inputs, bound by the entry function from x.shape.
    entry = _entries(f)[0][3].entry_source
    assert "x.shape[0]" in entry and "x.shape[1]" in entry


def test_a_size_of_a_tensor_used_only_for_its_size(stats):
    backend = RecordingBackend()

    @framejit.compile(backend=backend, dynamic=True)
    def f(x):
        return torch.arange(x.shape[0]) * 2

    for n in (3, 6):
        torch.testing.assert_close(f(torch.randn(n)), torch.arange(n) * 2)
    assert stats.graphs == 1
    assert backend.example_inputs[0] == [3]  # the size alone: x is not an input of the graph


def test_guard_function_checks_sizes_over_ints(stats):
    @framejit.compile(backend="eager", dynamic=True)
    def f(x, y):
        return x.sum(0) + y.sum(0)

    f(torch.randn(4, 3), torch.randn(4, 3))
    src = _guard_source(f)
    assert "x.is_contiguous()" in src and "len(___t) != 2" in src
    assert "if not (2 <= ___v0): return False" in src
    assert "___v0 = x.shape[0]" in src
    assert "# y.shape[0] == x.shape[0]  # duck sizing: equal sizes at capture share a symbol" in src


def test_returned_sizes_are_the_calls_sizes(stats):
    @framejit.compile(backend="eager", dynamic=True)
    def f(x):
        return x.shape[0] * 2 + 1, x.size(), x.sum()

    @framejit.compile(backend="eager", dynamic=True)
    def g(x):
        return ((x.shape[0], (x.shape[1] - 1, 2)), x.shape[1:]), x * 2

    for n in (3, 8):
        x = torch.randn(n, 5)
        r = f(x)
        assert r[0] == n * 2 + 1 and r[1] == torch.Size([n, 5])
        assert type(r[0]) is int and type(r[1]) is torch.Size
        x = torch.randn(n + 1, n)
        assert g(x)[0] == ((n + 1, (n - 1, 2)), torch.Size([n]))
    assert stats.graphs == 2


def test_a_shape_formatted_into_text_is_the_calls_shape(stats):
    @framejit.compile(backend="eager", dynamic=True)
    def f(x):
        return x + 1, f"{x.shape}", str(x.shape[1:]), "%d rows" % x.shape[0]  # noqa: UP031

    for n in (3, 4):
        x = torch.randn(n, 5)
        assert f(x)[1:] == (f"{x.shape}", str(x.shape[1:]), f"{n} rows")
    assert stats.graphs == 2  # the text depends on the sizes: specialized


def test_range_over_a_size_specializes(stats):
    @framejit.compile(backend="eager", dynamic=True)
    def f(x):
        total = x[0]
        for i in range(x.shape[0]):
            total = total + x[i] * i
        return total

    for n in (3, 3, 4):
        _check(f, torch.randn(n, 2))
    assert stats.graphs == 2
    assert "x.shape[0] == 3" in " ".join(_size_guard_texts(f, 0))
    assert stats.recompile_reasons[0][1].startswith("x.shape[0] == 3 no longer holds")


def test_comparison_adds_a_guard(stats):
    @framejit.compile(backend="eager", dynamic=True)
    def f(x):
        if x.shape[0] > 8:
            return x * 2
        return x - 1

    for n in (10, 12, 20):
        _check(f, torch.randn(n))
    assert stats.graphs == 1
    for n in (3, 5):
        _check(f, torch.randn(n))
    assert stats.graphs == 2
    assert "8 < x.shape[0]" in _size_guard_texts(f, 0) or "x.shape[0] > 8" in _size_guard_texts(f, 0)
    assert "no longer holds: x.shape[0] is 3" in stats.recompile_reasons[0][1]


def test_equal_then_unequal_sizes_of_two_inputs(stats):
    @framejit.compile(backend="eager", dynamic=True)
    def f(x, y):
        return x.sum(0) + y.sum(0)

    _check(f, torch.randn(4, 3), torch.randn(4, 3))
    _check(f, torch.randn(6, 3), torch.randn(6, 3))
    assert stats.graphs == 1
    assert "y.shape[0] == x.shape[0]  # duck sizing: equal sizes at capture share a symbol" \
        in _size_guard_texts(f)
    _check(f, torch.randn(8, 3), torch.randn(9, 3))
    assert stats.graphs == 2
    assert stats.recompile_reasons[0][1] == "y.shape[0] == x.shape[0] no longer holds: 9 vs 8"
    _check(f, torch.randn(5, 3), torch.randn(7, 3))
    assert stats.graphs == 2


def test_broadcast_of_equal_sizes_guards_equality(stats):
    @framejit.compile(backend="eager")
    def f(x, y):
        return x * y

    _check(f, torch.randn(4, 3), torch.randn(4, 3))
    _check(f, torch.randn(5, 3), torch.randn(5, 3))
    _check(f, torch.randn(7, 3), torch.randn(7, 3))
    assert stats.graphs == 2
    _check(f, torch.randn(6, 3), torch.randn(1, 3))  # broadcasting: another graph, still right
    assert stats.graphs == 3


@pytest.mark.parametrize("op", ["softmax", "sum", "amax", "mean", "var", "layer_norm"])
def test_reductions_over_a_dynamic_last_dim(stats, op):
    def body(x):
        if op == "softmax":
            return torch.softmax(x, -1)
        if op == "layer_norm":
            return torch.nn.functional.layer_norm(x, x.shape[-1:])
        return getattr(torch, op)(x, -1)

    f = framejit.compile(body, backend="eager")
    for m in (5, 6, 9, 33):
        x = torch.randn(3, m)
        torch.testing.assert_close(f(x), body(x))
    assert stats.graphs == 2
    assert stats.eager_frames == 0


@pytest.mark.parametrize("backend", ["triton", "c"])  # ("default" is "c" on CPU tensors)
def test_kernel_backends_serve_every_size_with_one_set_of_kernels(stats, backend):
    def body(x):
        return torch.softmax(x * 2, -1).sum(0), x.mean(-1)

    f = framejit.compile(body, backend=backend)
    kernels = []
    for m in (5, 6, 9, 17):
        x = torch.randn(4, m)
        torch.testing.assert_close(f(x), body(x))
        kernels.append(framejit.stats()["kernels"])
    assert stats.graphs == 2
    static = kernels[0]
    assert static >= 2 and kernels[1] > static  # the dynamic graph has kernels of its own...
    assert kernels[1] == kernels[2] == kernels[3]  # ...which serve the sizes after it


def test_guard_failure_is_explained_for_other_changes(stats):
    @framejit.compile(backend="eager")
    def f(x):
        return x + 1

    for n in (2, 3, 4):
        _check(f, torch.randn(n, 2))
    _check(f, torch.randn(4, 2, dtype=torch.float64))
    assert stats.recompile_reasons[-1][1].startswith("x.dtype: torch.float32 → torch.float64")
    _check(f, torch.randn(4, 3, dtype=torch.float64))
    assert stats.recompile_reasons[-1][1].startswith("x.shape[1]: 2 → 3")


def test_non_contiguous_input_stays_static(stats):
    @framejit.compile(backend="eager")
    def f(x):
        return x * 2

    for n in (3, 4, 5):
        _check(f, torch.randn(2, n).t())
    assert stats.eager_frames == 0
    _check(f, torch.randn(6, 2))


def broadcast_baddbmm(alibi, q, k):
    return torch.baddbmm(alibi, q, k, beta=1.0, alpha=0.5)  # Bloom's ALiBi scores


def test_an_op_that_fails_on_symbolic_sizes_logs_no_error(stats, caplog):
    # baddbmm's meta function cannot broadcast a symbolic `self`: torch's fake tensors log the
    # traceback at ERROR before raising. framejit handles the error (the sizes are specialised,
    # which costs a recompile), so nothing must reach the user's log.
    compiled = framejit.compile(broadcast_baddbmm, dynamic=True)
    with caplog.at_level(logging.DEBUG):
        for s in (8, 12):
            args = (torch.randn(8, 1, s), torch.randn(8, s, 4), torch.randn(8, 4, s))
            torch.testing.assert_close(compiled(*args), broadcast_baddbmm(*args))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert stats.graph_breaks == 0


class WithPositions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("positions", torch.arange(64.0).expand(1, -1))

    def forward(self, x):
        return (x + self.positions[:, :8]).relu() * 2  # BERT's position_ids[:, :seq]


def test_a_module_buffer_keeps_its_sizes_under_dynamic_true(stats):
    # dynamic=True made the buffer's 64 a symbol too; its slice then held only for 64 >= 8, and
    # the graph ran as torch ops. Like parameters, buffers keep their sizes: fused kernels.
    model = WithPositions()
    compiled = framejit.compile(model, dynamic=True, backend="c")  # C also under the fx run
    with declined_kernels() as declined:
        for batch in (2, 3, 5):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(compiled(x), model(x))
    assert declined == []
    assert stats.graphs == 1 and stats.recompiles == 0 and stats.kernels >= 1


def first_eight(x):
    return (x[:, :8] * 2).relu() + 1


def test_kernels_that_need_a_size_relation_get_it_guarded(stats):
    # x[:, :8] on a symbolic width w holds only for w >= 8: the kernels are compiled for every
    # such width and the relation joins the entry's size guard, so a narrower input recompiles.
    compiled = framejit.compile(first_eight, dynamic=True, backend="c")
    with declined_kernels() as declined:
        for width in (10, 12, 9, 6):
            x = torch.randn(3, width)
            torch.testing.assert_close(compiled(x), first_eight(x))
    assert declined == [] and stats.kernels >= 1
    assert stats.graphs == 2 and stats.recompiles == 1  # widths 10, 12, 9: one graph; 6: another


def shift_right(ids):
    # BART's shift_tokens_right: a size of max(1, s - 1) in the kernels' arithmetic.
    shifted = ids.new_zeros(ids.shape)
    shifted[:, 1:] = ids[:, :-1].clone()
    shifted[:, 0] = 2
    return shifted * 3


def test_kernels_compute_a_size_of_max_1_s_minus_1(stats):
    # BART's shift: the sizes of the shifted slice are max(1, s - 1), which the wrapper now
    # computes for the kernels (they ran as torch ops: "no graph arithmetic").
    compiled = framejit.compile(shift_right, dynamic=True, backend="c")
    for s in (5, 7, 4):
        ids = torch.arange(2 * s).reshape(2, s)
        torch.testing.assert_close(compiled(ids), shift_right(ids))
    assert stats.graphs == 1 and stats.eager_frames == 0 and stats.graph_breaks == 0
    assert stats.kernels >= 1


def stepped(x):
    return (x[:, ::2] * 3).relu() + x.view(-1)[: x.numel() // 4].sum()


def test_kernels_compute_sizes_of_stepped_slices_and_floor_divisions(stats):
    # (w + 1) // 2 and 3 * w // 4 had no graph arithmetic: the graph ran as torch ops.
    compiled = framejit.compile(stepped, dynamic=True, backend="c")
    for w in (5, 8, 9, 13):
        x = torch.randn(3, w)
        torch.testing.assert_close(compiled(x), stepped(x))
    assert stats.graphs == 1 and stats.recompiles == 0 and stats.kernels >= 1


def test_a_size_kernels_cannot_compute_runs_the_torch_ops(stats, monkeypatch):
    # A size expression the wrapper cannot compute made the backend fail (the whole frame ran
    # as plain Python); now only the kernels are declined and the graph runs its torch ops.
    from framejit import pipeline
    from framejit.passes.symbolic import NotSizeGeneric

    def no_arithmetic(expr, *args, **kwargs):
        raise NotSizeGeneric(f"no graph arithmetic for the size {expr}")

    monkeypatch.setattr(pipeline, "size_node", no_arithmetic)
    compiled = framejit.compile(stepped, dynamic=True, backend="c")
    for w in (5, 8, 9):
        x = torch.randn(3, w)
        torch.testing.assert_close(compiled(x), stepped(x))
    assert stats.graphs == 1 and stats.eager_frames == 0 and stats.graph_breaks == 0
    assert stats.kernels == 0  # none of the kernels lowered before the failure is counted


class WithPositionTable(torch.nn.Module):
    """BERT's embeddings: position ids sliced to the sequence length from a buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("position_ids", torch.arange(64).expand(1, -1))
        self.positions = torch.nn.Embedding(64, 8)

    def forward(self, x):
        n = x.shape[1]
        return (x + self.positions(self.position_ids[:, :n])).relu() * 2


def test_a_slice_bounded_by_a_size_stays_symbolic(stats):
    # The slice bound specialized to the length seen: BERT, RoBERTa and the other models with
    # a position-id buffer compiled once per sequence length under dynamic=True.
    torch.manual_seed(0)
    model = WithPositionTable()
    compiled = framejit.compile(model, dynamic=True, backend="c")
    with declined_kernels() as declined:
        for n in (5, 9, 17, 64):
            x = torch.randn(2, n, 8)
            with torch.no_grad():  # the embedding's weight requires grad: kernels only without
                torch.testing.assert_close(compiled(x), model(x))
    assert declined == []
    assert stats.graphs == 1 and stats.recompiles == 0 and stats.kernels >= 1


def test_a_slice_bound_past_the_end_is_clamped_as_in_eager(stats):
    table = torch.arange(10.0)

    @framejit.compile(backend="eager", dynamic=True)
    def f(x):
        return table[: x.shape[0]] * 2 + table[x.shape[0] // 2:].sum()

    for n in (4, 6, 12, 3, 15):
        _check(f, torch.randn(n))
    assert stats.eager_frames == 0


@pytest.mark.parametrize("backend", ["eager", "c"])
def test_symbolic_slices_with_steps_negative_bounds_and_assignment(stats, backend):
    @framejit.compile(backend=backend, dynamic=True)
    def f(x):
        n = x.shape[0]
        y = x.clone()
        y[1:n - 1] = x[: n - 2] * 3  # a slice assignment with symbolic bounds
        return y[::2] + 1, x[-(n // 2):].sum(0), x[1:n:n // 2]

    for n in (6, 7, 10):
        x = torch.randn(n, 3)
        torch.testing.assert_close(f(x), f.__wrapped__(x))
    assert stats.graphs == 1 and stats.recompiles == 0


def test_a_list_sliced_by_a_size_uses_the_size_it_had(stats):
    # A Python list has no symbolic length: its slice specializes the size (a guard), and a
    # new size compiles again rather than reusing the old slice.
    weights = [torch.full((3,), float(i)) for i in range(8)]

    @framejit.compile(backend="eager", dynamic=True)
    def f(x):
        return x.sum(0) + sum(weights[: x.shape[0]])

    for n in (2, 3, 5, 3):
        _check(f, torch.randn(n, 3))
    assert stats.graphs == 3 and stats.recompiles == 2


def test_a_symbolic_slice_kept_across_a_graph_break(stats):
    @framejit.compile(backend="eager", dynamic=True)
    def f(x):
        s = slice(1, x.shape[0] - 1)
        y = x * 2
        torch._dynamo.graph_break()
        return y[s] + x[s]

    for n in (4, 6, 9):
        _check(f, torch.randn(n, 2))
    assert stats.eager_frames == 0


@pytest.mark.parametrize("form", ["method", "function"])
def test_baddbmm_over_symbolic_sizes(stats, form):
    # Bloom's ALiBi scores: torch's meta kernel of baddbmm reads its input's expanded sizes as
    # ints and fails on symbols, so capture fell back to static shapes (a graph per length)
    # and, past that, the kernels were declined.
    def scores(q, k, alibi):
        if form == "method":
            s = alibi.baddbmm(q, k.transpose(1, 2), beta=1.0, alpha=0.25)
        else:
            s = torch.baddbmm(alibi, q, k.transpose(1, 2), beta=0.5, alpha=0.25)
        return torch.softmax(s, -1)

    compiled = framejit.compile(scores, dynamic=True, backend="c")
    with declined_kernels() as declined:
        for n in (5, 8, 11):
            q, k, alibi = torch.randn(6, n, 4), torch.randn(6, n, 4), torch.randn(6, 1, n)
            torch.testing.assert_close(compiled(q, k, alibi), scores(q, k, alibi))
    assert declined == []
    assert stats.graphs == 1 and stats.recompiles == 0 and not stats.static_retries
    assert stats.kernels >= 1


def test_max_and_min_of_sizes_stay_symbolic(stats):
    # MPT's ALiBi: position_bias[:, max(0, position_bias.size(1) - query_length):] read the
    # max as an int (a guard), so each sequence length compiled again.
    table = torch.randn(1, 16)

    @framejit.compile(backend="c", dynamic=True)
    def f(x):
        start = max(0, table.size(1) - x.shape[1])
        stop = min(table.shape[1], x.shape[1] + 3, 40)
        return (x + table[:, start:]) * table[:, :stop].sum()

    for n in (5, 8, 11):
        _check(f, torch.randn(2, n))
    assert stats.graphs == 1 and stats.recompiles == 0 and not stats.static_retries


def test_max_of_a_size_used_as_an_int_is_guarded(stats):
    @framejit.compile(backend="eager", dynamic=True)
    def f(x):
        total = x.sum()
        for i in range(max(2, x.shape[0] - 1)):  # range() reads the value: a guard
            total = total + i
        return total + max(x.shape[0], 3.5)  # a float among them: decided at capture

    for n in (4, 4, 6):
        _check(f, torch.randn(n))
    assert stats.graphs == 2 and stats.recompiles == 1


def trigram(x):
    # MobileBERT's embeddings: the sequence shifted both ways by padding slices of it.
    import torch.nn.functional as F
    left = F.pad(x[:, 1:], [0, 0, 0, 1, 0, 0], value=0.0)
    right = torch.constant_pad_nd(x[:, :-1], [0, 0, 1, 0])
    edge = F.pad(x, [1, 1], mode="replicate")
    return torch.cat([left, x, right], dim=2) * 2, edge


@pytest.mark.parametrize("backend", ["eager", "c"])
def test_constant_padding_keeps_sizes_symbolic(stats, backend):
    # The C++ pad kernel read its input's sizes as ints on fake tensors: a guard s == 8 and a
    # graph per sequence length.
    compiled = framejit.compile(trigram, dynamic=True, backend=backend)
    for n in (5, 8, 11):
        x = torch.randn(2, n, 4)
        got, want = compiled(x), trigram(x)
        torch.testing.assert_close(got, want)
        assert [t.stride() for t in got] == [t.stride() for t in want]
    assert stats.graphs == 1 and stats.recompiles == 0 and not stats.static_retries
