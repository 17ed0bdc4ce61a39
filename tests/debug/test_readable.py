"""The readable rendering of each cache entry (capture/readable/): read, and run in place of
the rewritten bytecode, it gives what the compiled function gives."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import framejit
from framejit import _C
from framejit.capture import readable

G = 1.0
LOG: list = []
SCALE = 2.0


class CountingBackend:
    """Runs each graph as torch.fx runs it, counting the calls of compiled graphs: a rendering
    that fell back to plain Python where it should run a graph would call fewer."""

    def __init__(self):
        self.calls = 0

    def __call__(self, gm, example_inputs):
        def run(*args):
            self.calls += 1
            return gm(*args)
        return run


_alive: list = []


@pytest.fixture(autouse=True)
def _drop_compiled():
    yield
    _alive.clear()


def entries(code):
    return [e[3] for e in _C.get_cache_entries(code)]


def run_both(fn, make_args, reset=lambda: None):
    """(eager, compiled, rendered) results and printed output of ``fn`` on fresh arguments each
    time; ``reset`` puts the globals back before each run. The rendering runs each cache entry's
    readable source, following the resume functions through their renderings."""
    reset()
    eager = fn(*make_args())
    backend = CountingBackend()
    compiled = framejit.compile(fn, backend=backend)
    reset()
    out = compiled(*make_args())
    compiled_calls = backend.calls
    (info,) = entries(fn.__code__)
    run = readable.load(info)
    reset()
    backend.calls = 0
    rendered = run(*make_args())
    assert backend.calls == compiled_calls  # every graph ran, none replaced by plain Python
    _alive.append(compiled)  # cache entries (the resume functions' too) live as long as it does
    return eager, out, rendered, info


def no_generated_names(text: str) -> bool:
    return re.search(r"\b___\w+", text) is None


# -- no graph break --------------------------------------------------------------------------------


def scaled(x, w):
    return torch.relu(x @ w) * SCALE


def test_whole_frame_runs_as_rendered_and_reads_as_python():
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    eager, out, rendered, info = run_both(scaled, lambda: (x, w))
    torch.testing.assert_close(rendered, eager)
    torch.testing.assert_close(rendered, out)
    text = info.readable_source
    assert no_generated_names(text), text
    assert "def guards_scaled(x, w):" in text and "def rewritten_scaled(x, w):" in text
    assert "graph_out = compiled_graph(x, w)" in text
    assert "#   compiled_graph: the compiled graph (3 operations" in text
    assert "return graph_out[0]" in text


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.steps = 0

    def forward(self, x):
        self.steps += 1
        return self.fc(x).relu()


def test_module_attribute_write_is_replayed_by_the_rendering():
    m = Counter()
    x = torch.randn(2, 4)
    compiled = framejit.compile(m)
    out = compiled(x)
    assert m.steps == 1
    (info,) = entries(Counter.forward.__code__)
    text = info.readable_source
    assert "self_fc_weight = self_fc._parameters['weight']  # self.fc.weight" in text
    assert "self.steps = new_number_0" in text
    rendered = readable.load(info)(m, x)
    assert m.steps == 2  # the rendering replays the write
    torch.testing.assert_close(rendered, out)


# -- one graph break, with side effects ------------------------------------------------------------


def one_break(x):
    global G
    y = x + 1
    LOG.append(y.shape[0])
    G = G + 1
    print("value", y.shape[0], sep="|")
    return y * 2


def reset_globals():
    global G
    G = 1.0
    LOG.clear()


def test_one_break_with_global_write_list_append_and_print(capsys):
    x = torch.randn(2, 3)
    eager, out, rendered, info = run_both(one_break, lambda: (x,), reset_globals)
    torch.testing.assert_close(rendered, eager)
    torch.testing.assert_close(rendered, out)
    assert G == 2.0 and LOG == [2]  # the rendering made the same writes (after a reset)
    assert capsys.readouterr().out == "value|2\n" * 3
    text = info.readable_source
    assert no_generated_names(text), text
    # The side effects, the native line and the resume call, in the user's names.
    assert "G = module_globals['G']  # global G" in text
    assert "LOG.append(*new_value_0)" in text and "module_globals['G'] = new_number_1" in text
    # the number written is computed before the graph, and a failure runs one_break again
    assert "new_number_1 = G + 1" in text and "return run_one_break_as_plain_python" in text
    assert "y = graph_out[0]" in text
    assert "result = print('value', 2, sep='|')" in text
    assert re.search(r"return one_break_resume_at_line_\d+\(x, result, y\)", text)
    (name, sources), = info.resume_sources.items()
    assert name.startswith("one_break_resume_at_line_") and len(sources) == 1
    assert "def rewritten_one_break_resume_at_line_" in sources[0]


# -- two graph breaks, one a condition on a tensor -------------------------------------------------


def two_breaks(x):
    y = x.sin()
    print("first")
    y = y - 0.5
    if y.sum() > 0:
        y = y * 2
    else:
        y = y - 2
    return y.cos()


@pytest.mark.parametrize("start", [1.5, 5.0])  # sin(x) - 0.5 > 0, then < 0
def test_two_breaks_condition_runs_both_ways(start, capsys):
    x = torch.full((3,), start)
    eager, out, rendered, info = run_both(two_breaks, lambda: (x,))
    torch.testing.assert_close(rendered, eager)
    torch.testing.assert_close(rendered, out)
    assert capsys.readouterr().out == "first\n" * 3
    (name, (resume_text,)), = info.resume_sources.items()
    # The branch taken was captured through the resume function's own rendering; the other not.
    (resume,) = [e for e in entries(info.rendering().resume_names[name].__code__)]
    first = two_breaks.__code__.co_firstlineno
    taken_line = first + 5 if start < 3 else first + 7
    captured = {n: len(texts) for n, texts in resume.resume_sources.items()}
    assert captured == {f"two_breaks_resume_at_line_{first + 5}": int(start < 3),
                        f"two_breaks_resume_at_line_{first + 7}": int(start > 3)}, captured
    assert f"two_breaks_resume_at_line_{taken_line}" in resume_text
    # The resume function's rendering tests the condition as plain Python and calls one of two
    # resume functions.
    assert "if not stack_0:" in resume_text, resume_text
    assert resume_text.count("return two_breaks_resume_at_line_") == 2
    assert no_generated_names(resume_text)


# -- a break inside a loop and inside a `with` block -----------------------------------------------


def loop_break(x, n):
    for i in range(n):
        x = x + i
        print(i)
    return x


def test_break_inside_a_loop_runs_through_the_resume_renderings(capsys):
    x = torch.randn(3)
    eager, out, rendered, info = run_both(loop_break, lambda: (x, 3))
    torch.testing.assert_close(rendered, eager)
    torch.testing.assert_close(rendered, out)
    assert capsys.readouterr().out == "0\n1\n2\n" * 3
    text = info.readable_source
    assert "stack_0 = iter(rebuilt_0)" in text  # the loop's iterator, rebuilt from what is left
    assert "(x, list(stack_0), result, n, i)" in text


def with_break(x):
    with torch.no_grad():
        y = x * 2
        print("inside")
        y = y + 1
    return y * x


def test_break_inside_a_with_block(capsys):
    x = torch.randn(3, requires_grad=True)
    eager, out, rendered, info = run_both(with_break, lambda: (x,))
    torch.testing.assert_close(rendered, eager)
    torch.testing.assert_close(rendered, out)
    assert rendered.requires_grad and torch.is_grad_enabled()
    text = info.readable_source
    # (the name is error_1 when the graph call's own handler, for a plain-Python rerun, took error)
    name = re.search(r"except BaseException as (error(?:_\d+)?):\n", text).group(1)
    assert f"leave_block(stack_0, {name})" in text
    assert "#   leave_block: framejit's" in text


def closure_maker(k):
    def scaled_by(t):
        return t * k + SCALE
    return scaled_by


def test_closure_cells_are_parameters_of_the_rendering():
    fn = closure_maker(3)
    x = torch.randn(4)
    compiled = framejit.compile(fn)  # (its cache entries live as long as it does)
    out = compiled(x)
    (info,) = entries(fn.__code__)
    assert "def rewritten_scaled_by(t, k_cell):" in info.readable_source
    assert "k_cell.cell_contents == 3  # k (closed over) == 3 (an int)" in info.guards_source
    torch.testing.assert_close(readable.load(info)(x, *fn.__closure__), out)


# -- guards ----------------------------------------------------------------------------------------


def guard_fn_of(info):
    namespace = dict(info.readable_namespace)
    exec(info.guards_source, namespace)
    (name,) = re.findall(r"^def (\w+)\(", info.guards_source, re.M)
    return namespace[name]


def test_guards_one_line_each_with_a_comment_in_user_terms():
    compiled = framejit.compile(scaled)
    compiled(torch.randn(4, 16), torch.randn(16, 2))
    (info,) = entries(scaled.__code__)
    text = info.guards_source
    assert no_generated_names(text), text
    conditions = [line for line in text.splitlines() if line.strip().startswith(("torch.", "and "))]
    assert all("  # " in line for line in conditions)
    # grad mode, default dtype, autocast, no torch function mode, no dispatch mode
    assert len(conditions) == 5 + len(info.guards.guards)
    assert any("x.shape == (4, 16)" in line and line.endswith("# x is a 4x16 float32 tensor on cpu, contiguous")
               for line in conditions), text
    assert "module_globals['torch'] is torch  # global torch is the module torch" in text
    assert "module_globals['SCALE'] == 2.0  # global SCALE == 2.0 (a float)" in text
    assert f"#   module_globals: the globals of module {__name__}" in text


def test_rendered_guards_agree_with_the_real_ones():
    global SCALE
    x, w = torch.randn(4, 16), torch.randn(16, 2)
    compiled = framejit.compile(scaled)
    compiled(x, w)
    (info,) = entries(scaled.__code__)
    rendered = guard_fn_of(info)
    cases = [(x, w), (torch.randn(5, 16), w), (x.double(), w), (x.t().contiguous().t(), w),
             (x, torch.randn(16, 2, requires_grad=True)), ("not a tensor", w)]
    for args in cases:
        assert rendered(*args) is info.guard_fn(*args)
    assert [rendered(*a) for a in cases] == [True, False, False, False, False, False]
    old = SCALE
    try:
        SCALE = 3.0
        assert rendered(x, w) is False and info.guard_fn(x, w) is False
    finally:
        SCALE = old
    with torch.no_grad():
        assert rendered(x, w) is False and info.guard_fn(x, w) is False


def test_module_guards_name_identity_and_hooks():
    m = Counter()
    compiled = framejit.compile(m)
    compiled(torch.randn(2, 4))
    (info,) = entries(Counter.forward.__code__)
    text = info.guards_source
    assert "self is captured_self  # self is the same Counter object as at capture" in text
    assert "self.fc has no hooks" in text and "no global module hook is registered" in text
    assert "# self.fc.weight is a 4x4 float32 Parameter on cpu, contiguous, requires grad" in text
    guards = guard_fn_of(info)
    x = torch.randn(2, 4)
    assert guards(m, x) is True
    handle = m.fc.register_forward_hook(lambda *a: None)
    try:
        assert guards(m, x) is False and info.guard_fn(m, x) is False
    finally:
        handle.remove()
    assert guards(Counter(), x) is False


# -- what cannot be rendered -----------------------------------------------------------------------


def test_an_instruction_it_cannot_show_says_so_and_refuses_to_run():
    x = torch.randn(2, 3)
    reset_globals()
    compiled = framejit.compile(one_break)
    compiled(x)
    (info,) = entries(one_break.__code__)
    from framejit.capture.interpreter import Inst
    info.frame_break.plan.native.insert(0, Inst("SETUP_ANNOTATIONS", None, 16))
    info._rendering = None
    text = re.sub(r"\n *# ", " ", info.readable_source)  # comments unwrapped
    assert "framejit cannot show it as Python (the instruction SETUP_ANNOTATIONS)" in text
    with pytest.raises(NotImplementedError, match="cannot show line"):
        readable.load(info)(x)


# -- dumps -----------------------------------------------------------------------------------------


def test_dump_holds_the_rendering_and_the_guards(tmp_path, capsys):
    reset_globals()
    x = torch.randn(2, 3)
    compiled = framejit.compile(one_break, options={"dump_dir": str(tmp_path)})
    compiled(x)
    run = tmp_path / (tmp_path / "latest").read_text().strip()
    folder = run / "one_break" / "one_break" / "0"
    text = (folder / "readable.py").read_text()
    (info,) = entries(one_break.__code__)
    assert text == info.readable_source
    assert (folder / "guards.py").read_text().endswith(info.guards_source)
    # The dumped rendering runs with the entry's namespace.
    namespace = dict(info.readable_namespace)
    exec(compile(text, str(folder / "readable.py"), "exec"), namespace)
    reset_globals()
    torch.testing.assert_close(namespace["one_break"](x), (x + 1) * 2)
    assert G == 2.0 and LOG == [2]


# -- the native line: what the rendering shows as Python -------------------------------------------


class Box:
    pass


BOX = Box()
TABLE: dict = {}


def store_attr(x):
    BOX.val = x.sum().item()
    return x + BOX.val


def store_subscr(x):
    TABLE["k"] = x.sum().item()
    return x * TABLE["k"]


def nested_call(x):
    y = torch.tensor([x.sum().item(), 2.0])
    return y * 3


def formatted(x):
    print(f"total {x.sum().item():.2f}!", end="|\n")
    return x + 1


def compared(x):
    n = len(LOG) + int(x.sum().item() > 0)
    return x * n


def global_store(x):
    global G
    G = x.sum().item()
    return x - G


NATIVE_CASES = [store_attr, store_subscr, nested_call, formatted, compared, global_store]


@pytest.mark.parametrize("fn", NATIVE_CASES, ids=lambda f: f.__name__)
def test_native_line_as_python(fn, capsys):
    x = torch.arange(4.0)

    def reset():
        reset_globals()
        TABLE.clear()
        BOX.__dict__.clear()

    eager, out, rendered, info = run_both(fn, lambda: (x,), reset)
    torch.testing.assert_close(rendered, eager)
    torch.testing.assert_close(rendered, out)
    text = info.readable_source
    assert "cannot show" not in text and no_generated_names(text), text
    printed = capsys.readouterr().out
    assert printed == printed[:len(printed) // 3] * 3  # each run printed the same
    (resume_text,) = [t for texts in info.resume_sources.values() for t in texts]
    if fn is formatted:  # the whole print() is the native line: the item() call is inside it
        assert printed == "total 6.00!|\n" * 3
        assert re.search(r"result = print\(f'total \{stack_\d+\.item\(\):\.2f\}!', end='\|\\n'\)", text)
    if fn is nested_call:
        assert re.search(r"result = torch\.tensor\(\[stack_\d+\.item\(\), 2\.0\]\)", text), text
    if fn is store_attr:  # the write comes after the break: the resume function replays it
        assert "BOX = module_globals['BOX']  # global BOX" in resume_text
        assert "BOX.val = new_number_0" in resume_text
    if fn is global_store:
        assert "module_globals['G'] = new_number_0" in resume_text and G == 6.0


def raise_in_with(x):
    with torch.no_grad():
        y = x * 2
        raise ValueError(y.sum().item())


def test_native_raise_inside_a_with_block_leaves_the_block():
    x = torch.arange(3.0, requires_grad=True)
    compiled = framejit.compile(raise_in_with)
    _alive.append(compiled)
    with pytest.raises(ValueError, match="6.0"):
        compiled(x)
    assert torch.is_grad_enabled()
    (info,) = entries(raise_in_with.__code__)
    text = info.readable_source
    assert re.search(r"result = ValueError\(stack_\d+\.item\(\)\)", text), text
    assert re.search(r"leave_block\(stack_0, error(_\d+)?\)", text), text
    # The resume function raises, as the native line of its own rendering.
    (resume_text,) = [t for texts in info.resume_sources.values() for t in texts]
    assert "raise stack_1" in resume_text and "leave_block(stack_0, error)" in resume_text
    with pytest.raises(ValueError, match="6.0"):
        readable.load(info)(x)
    assert torch.is_grad_enabled()  # the rendering left the no_grad block as eager does


def star_args(x, *rest, scale=2, **kw):
    y = x * scale
    print("star", len(rest), sorted(kw))
    return y + rest[0] + kw["b"]


def test_star_args_and_keyword_only_arguments(capsys):
    x, r, b = torch.ones(2), torch.full((2,), 2.0), torch.full((2,), 3.0)
    compiled = framejit.compile(star_args)
    _alive.append(compiled)
    out = compiled(x, r, scale=3, b=b)
    (info,) = entries(star_args.__code__)
    text = info.readable_source
    # The hook passes the argument slots: positional, keyword-only, *args, **kwargs.
    assert "def rewritten_star_args(x, scale, rest, kw):" in text
    assert "return plain(x, *rest, scale=scale, **kw)" in text
    run = readable.load(info)
    torch.testing.assert_close(run(x, 3, (r,), {"b": b}), out)
    # Guards that fail send the dispatcher to the original code, as plain Python.
    torch.testing.assert_close(run(x, 5, (r,), {"b": b}), star_args(x, r, scale=5, b=b))
    assert capsys.readouterr().out == "star 1 ['b']\n" * 4


def test_break_in_a_closure_builds_the_resume_function_with_the_cells(capsys):
    def make(k):
        def inner(x):
            y = x * k
            print("inner")
            return y + k
        return inner

    fn = make(3)
    x = torch.ones(2)
    compiled = framejit.compile(fn)
    _alive.append(compiled)
    out = compiled(x)
    (info,) = entries(fn.__code__)
    text = info.readable_source
    assert re.search(r"return FunctionType\(inner_resume_at_line_\d+, module_globals, None, None, "
                     r"\(k_cell,\)\)\(x, result, y\)", text), text
    torch.testing.assert_close(readable.load(info)(x, *fn.__closure__), out)
    assert capsys.readouterr().out == "inner\n" * 2


def test_a_guard_kind_it_does_not_know_renders_as_its_own_test():
    from framejit.capture.guards import Guard
    from framejit.capture.sources import LocalSource

    class SumGuard(Guard):  # a kind capture/readable/ has no words for
        def __init__(self, source):
            self.source = source

        def code(self, v, names):
            return [f"if {v}.sum() != 2: return False"]

        def describe(self):
            return f"{self.source.name()} sums to 2"

    def takes_n(x, n):
        return x * n

    compiled = framejit.compile(takes_n)
    _alive.append(compiled)
    compiled(torch.ones(2), 7)
    (info,) = entries(takes_n.__code__)
    info.guards.guards.append(SumGuard(LocalSource("x")))
    info._rendering = None
    assert "and not (x.sum() != 2)  # x sums to 2" in info.guards_source
    guards = guard_fn_of(info)
    assert guards(torch.ones(2), 7) is True and guards(torch.tensor([3.0, -1.0]), 7) is True
    assert guards(torch.zeros(2), 7) is False  # only the new guard tells these apart


def test_two_breaks_on_one_line_of_a_lambda(capsys):
    # Both resume functions are named <lambda>_resume_at_line_N: the rendering of the first
    # must call the second, not define a function of the same name over it.
    fn = lambda x: print("a", x.sum().item()) or print("b") or x + 1  # noqa: E731
    x = torch.ones(2)
    eager, out, rendered, info = run_both(fn, lambda: (x,))
    torch.testing.assert_close(rendered, eager)
    torch.testing.assert_close(rendered, out)
    assert capsys.readouterr().out == "a 2.0\nb\n" * 3
    (resume_text,) = [t for texts in info.resume_sources.values() for t in texts]
    called = re.findall(r"return (lambda_resume_at_line_\d+(?:_\d+)?)\(", resume_text)
    defined = re.findall(r"^def (\w+)\(", resume_text, re.M)
    assert called and not set(called) & set(defined), resume_text


class Logged:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")

    def __exit__(self, *exc):
        self.log.append("exit")


def undefined_in_with(x, log):
    with Logged(log):
        y = x + x.sum().item()
        z = y + undefined_name  # noqa: F821  (a NameError, raised by the native line)
    return z


def test_a_native_name_error_inside_a_with_block_reaches_its_exit():
    x = torch.ones(2)
    compiled = framejit.compile(undefined_in_with)
    _alive.append(compiled)
    log: list = []
    with pytest.raises(NameError):
        compiled(x, log)
    assert log == ["enter", "exit"]
    (info,) = entries(undefined_in_with.__code__)
    (resume_text,) = [t for texts in info.resume_sources.values() for t in texts]
    # The name is read inside the `try` that leaves the block, where the instruction ran.
    assert re.search(r"try:\n +result = undefined_name\n +except BaseException", resume_text), resume_text
    log.clear()
    with pytest.raises(NameError):
        readable.load(info)(x, log)
    assert log == ["enter", "exit"]


# -- renderings in place of the rewritten code, over capture tests ---------------------------------


def test_renderings_run_in_place_only_when_asked():
    from framejit.capture import convert_frame

    patched = convert_frame._capture.__name__ == "capture_and_render"
    assert patched is (os.environ.get("FRAMEJIT_TEST_READABLE") == "1")


#: Capture tests with graph breaks, side effects, `with` blocks and native errors, run with every
#: cache entry's rendering in place of its rewritten bytecode. Left out: one test that checks
#: that a traceback points at the user's line, which a rendering (its own source) does not do.
_IN_PLACE = ["tests/capture/test_graph_breaks.py", "tests/capture/test_side_effects.py",
             "tests/capture/test_with_blocks.py", "tests/capture/test_wrong_answers.py",
             "tests/capture/test_break_points.py"]
_NOT_IN_PLACE = "tests/capture/test_graph_breaks.py::test_resume_function_has_readable_name_and_user_lines"


def test_capture_tests_pass_with_the_renderings_in_place():
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, FRAMEJIT_TEST_READABLE="1")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *_IN_PLACE, "tests/debug/test_readable.py::"
         "test_renderings_run_in_place_only_when_asked", "-q", "-p", "no:cacheprovider",
         "--deselect", _NOT_IN_PLACE],
        cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    progress = [line.split(" [")[0] for line in result.stdout.splitlines() if line.endswith("%]")]
    assert sum(line.count(".") for line in progress) > 100, result.stdout[-2000:]  # tests that ran
