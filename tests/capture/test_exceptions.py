"""Exceptions raised and caught inside captured code, and the library idioms that rely on them.

Library code uses exceptions as control flow (``Mapping.get`` catches a ``KeyError``,
``Sequence.__iter__`` stops at an ``IndexError``); those paths are captured into one graph. An
exception that leaves the compiled function is raised by Python itself, after the graph of
what ran before it.

PYTEST_DONT_REWRITE: the `assert` statements of the captured functions must be Python's own.
"""

import abc
import collections
import contextlib
import copy
import dataclasses
import inspect
from collections.abc import Mapping, Sequence

import pytest
import torch

import framejit
from framejit.testing import assert_close_to_eager


def r(*shape):
    return torch.randn(*shape)


# -- try / except / finally -------------------------------------------------------------------------

def caught_key_error(x, d):
    try:
        v = d["missing"]
    except KeyError:
        v = 3
    return x + v


def caught_with_name(x):
    try:
        raise ValueError("boom", 2)
    except ValueError as e:
        scale = e.args[1]
    return x * scale


def finally_runs(x):
    y = x
    try:
        y = y + 1
    finally:
        y = y * 2
    return y


def finally_after_caught(x):
    out = []
    try:
        out.append(1)
        raise KeyError("k")
    except (TypeError, KeyError):
        out.append(2)
    finally:
        out.append(3)
    return x * sum(out)


def _get(d, k, default=None):
    try:
        return d[k]
    except KeyError:
        return default


def helper_catches(x, d):
    return x + _get(d, "a", 1) + _get(d, "b", 10)


def _deep(n):
    if n == 0:
        raise LookupError("bottom")
    return _deep(n - 1)


def caught_across_frames(x):
    try:
        _deep(3)
    except LookupError:
        return x - 1
    return x


def reraised_then_caught(x):
    try:
        try:
            raise IndexError("inner")
        except IndexError:
            x = x + 1
            raise
    except IndexError:
        x = x * 3
    return x


class MyError(ValueError):
    pass


def user_exception_class(x):
    try:
        raise MyError("mine")
    except ValueError as e:
        kind = type(e).__name__
    return x * len(kind)


def stop_iteration_caught(x):
    it = iter([1, 2])
    next(it)
    next(it)
    try:
        next(it)
    except StopIteration:
        return x - 1
    return x


def index_error_caught(x, items):
    try:
        v = items[5]
    except IndexError:
        v = items[-1]
    return x * v


def passing_assert(x):
    assert x.dim() == 1, "a vector"
    return x + 1


def attribute_error_caught(x):
    obj = Point(1, 2)
    try:
        z = obj.z
    except AttributeError:
        z = 0
    return x + z


# -- library idioms ---------------------------------------------------------------------------------

class Window(Sequence):
    """A Sequence ABC: iteration is Sequence.__iter__, which stops at __getitem__'s IndexError."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i >= self.n:
            raise IndexError("window index out of range")
        return i + 1


def sequence_abc_iteration(x):
    total = 0
    for v in Window(3):
        total += v
    return x * total, list(Window(2))


class Table(Mapping):
    def __init__(self, **kw):
        self._d = kw

    def __getitem__(self, k):
        return self._d[k]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)


def mapping_abc_get(x):
    t = Table(a=2)
    return x * t.get("a", 0) + t.get("b", 5)


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Output(collections.OrderedDict):
    """Like transformers' ModelOutput: a dataclass deriving from OrderedDict, whose
    __setattr__/__setitem__ keep attributes and items in step through super()."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = self.__dict__.get(f.name)
            if v is not None:
                self[f.name] = v

    def __setattr__(self, name, value):
        if name in {f.name for f in dataclasses.fields(self)} and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __getitem__(self, k):
        if isinstance(k, str):
            return dict(self.items())[k]
        return self.to_tuple()[k]

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


@dataclasses.dataclass
class LMOutput(Output):
    logits: torch.Tensor = None
    loss: torch.Tensor = None
    hidden: tuple = None


def dict_subclass_output(x):
    out = LMOutput(logits=x * 2)
    out.loss = out.logits.sum()
    return out.to_tuple()[0] + out["loss"], len(out), list(out.keys()), out[1]


def dict_subclass_returned(x):
    return LMOutput(logits=x + 1, loss=x.mean())


class Registry(dict):
    def get(self, key):
        return super().get(key) or {}


REGISTRY = Registry(Point={"scale": 3})


def registry_lookup(x):
    flags = REGISTRY.get(type(Point(1, 2)).__name__)
    missing = REGISTRY.get("nothing")
    return x * flags["scale"] + len(missing)


class Base(abc.ABC):
    @abc.abstractmethod
    def scale(self):
        ...

    def apply(self, x):
        return x * self.scale()


class Concrete(Base):
    def scale(self):
        return 4


def abc_object(x):
    return Concrete().apply(x)


def signature_of_method(x):
    m = Concrete().apply
    n = len(inspect.signature(m).parameters)
    return x * n + len(inspect.signature(_get).parameters)


def id_of_fixed_objects(x):
    memo = {id(Concrete): "c", id(len): "len"}
    return x * len(memo[id(Concrete)] + memo[id(len)])


class Cache:
    def __init__(self):
        self.layers = []

    @property
    def compileable(self):
        if not self.layers:
            raise AttributeError("no layers yet")
        return True

    @property
    def size(self):
        return len(self.layers)


def getattr_default_on_raising_property(x):
    c = Cache()
    a = getattr(c, "compileable", False)
    b = hasattr(c, "compileable")
    c.layers.append(1)
    return x * (1 + a + b + getattr(c, "compileable", False) + hasattr(c, "size") + c.size)


def iterates_outside_sequence(x, window):
    return x * sum(v for v in window) + len(list(window))


def device_moves(x, y):
    a = x.to(y.device) + 1
    b = y.to(device=x.device, dtype=torch.float64)
    c = x.cpu().to("cpu", torch.float16)
    d = torch.arange(3, device=x.device) + x.to(x)
    return a, b, c, d


class Scale:
    """A context manager written in Python: __enter__/__exit__ are inlined."""

    def __init__(self, k):
        self.k = k
        self.depth = 0

    def __enter__(self):
        self.depth += 1
        return self.k

    def __exit__(self, *exc):
        self.depth -= 1
        return False

    def __eq__(self, other):  # for comparing the arguments after the call with eager's
        return type(other) is Scale and (self.k, self.depth) == (other.k, other.depth)


@contextlib.contextmanager
def tagged(log, name):
    log.append("enter " + name)
    try:
        yield name.upper()
    finally:
        log.append("exit " + name)


def user_context_managers(x, scale):
    with scale as k:
        y = x * k
    log = []
    with tagged(log, "a") as t, Scale(2) as two:
        y = y + len(t) * two
    return y, log, scale.depth


def deletes_fresh_attribute(x):
    p = Point(1, 2)
    p.extra = 5
    del p.extra
    return x + hasattr(p, "extra")


CASES = [
    (user_context_managers, lambda: (r(3), Scale(3))),
    (deletes_fresh_attribute, lambda: (r(3),)),
    (getattr_default_on_raising_property, lambda: (r(3),)),
    (iterates_outside_sequence, lambda: (r(3), Window(4))),
    (device_moves, lambda: (r(3), r(3))),
    (caught_key_error, lambda: (r(3), {"a": 1})),
    (caught_with_name, lambda: (r(3),)),
    (finally_runs, lambda: (r(3),)),
    (finally_after_caught, lambda: (r(3),)),
    (helper_catches, lambda: (r(3), {"a": 2})),
    (caught_across_frames, lambda: (r(3),)),
    (reraised_then_caught, lambda: (r(3),)),
    (user_exception_class, lambda: (r(3),)),
    (stop_iteration_caught, lambda: (r(3),)),
    (index_error_caught, lambda: (r(3), [1, 2, 3])),
    (passing_assert, lambda: (r(3),)),
    (attribute_error_caught, lambda: (r(3),)),
    (sequence_abc_iteration, lambda: (r(3),)),
    (mapping_abc_get, lambda: (r(3),)),
    (dict_subclass_output, lambda: (r(3),)),
    (registry_lookup, lambda: (r(3),)),
    (abc_object, lambda: (r(3),)),
    (signature_of_method, lambda: (r(3),)),
    (id_of_fixed_objects, lambda: (r(3),)),
]


@pytest.mark.parametrize("fn, make_args", CASES, ids=[c[0].__name__ for c in CASES])
def test_exception_paths_are_one_graph(check, fn, make_args):
    check(fn, *make_args())


def test_dict_subclass_object_returned_is_rebuilt(stats, recorder):
    x = r(3)
    expected = dict_subclass_returned(x)
    out = framejit.compile(dict_subclass_returned, backend=recorder)(x)
    assert stats.eager_frames == 0 and recorder.graph_count == 1
    assert type(out) is LMOutput and list(out.keys()) == list(expected.keys())
    assert_close_to_eager(dict(out), dict(expected))
    assert_close_to_eager(out.logits, expected.logits)
    assert out.hidden is None


def test_guarded_key_error_recompiles_when_the_key_appears(stats, recorder):
    compiled = framejit.compile(caught_key_error, backend=recorder)
    x = r(3)
    assert_close_to_eager(compiled(x, {"a": 1}), x + 3)
    assert_close_to_eager(compiled(x, {"missing": 7}), x + 7)  # keys are guarded: not a stale path
    assert stats.recompiles == 1 and stats.eager_frames == 0


def test_registry_contents_are_guarded(stats, recorder):
    compiled = framejit.compile(registry_lookup, backend=recorder)
    x = r(3)
    assert_close_to_eager(compiled(x), registry_lookup(x))
    REGISTRY["nothing"] = {"a": 1, "b": 2}
    try:
        assert_close_to_eager(compiled(x), registry_lookup(x))
        assert stats.recompiles == 1
    finally:
        dict.pop(REGISTRY, "nothing")


# -- exceptions that leave the compiled function ----------------------------------------------------

def raises_after_work(x, limit):
    y = x * 2
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return y + limit


def _check(v):
    if v > 3:
        raise OverflowError("too big")
    return v


def raises_in_helper(x, v):
    y = x + 1
    return y * _check(v)


def failing_assert(x, n):
    assert n < 2, "n too large"
    return x + n


def _raised(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 (the exception is the result compared)
        return e
    raise AssertionError("expected an exception")


@pytest.mark.parametrize("fn, args, breaks", [
    (raises_after_work, lambda: (r(3), -1), 1),
    # The call to the helper runs natively; the helper's own frame is then captured up to its raise.
    (raises_in_helper, lambda: (r(3), 5), 2),
    (failing_assert, lambda: (r(3), 4), 1),
], ids=["raise", "raise_in_helper", "assert"])
def test_uncaught_exception_is_raised_like_eager(stats, fn, args, breaks):
    a = args()
    expected = _raised(fn, *copy.deepcopy(a))
    actual = _raised(framejit.compile(fn), *a)
    assert type(actual) is type(expected) and str(actual) == str(expected)
    assert stats.eager_frames == 0  # the frame is split at the raise, not run wholly eager
    assert stats.graph_breaks == breaks


def test_uncaught_exception_under_fullgraph_names_it():
    with pytest.raises(framejit.GraphBreakError, match=r"raising OverflowError\('too big'\)") as info:
        framejit.compile(raises_in_helper, fullgraph=True)(r(3), 5)
    assert "test_exceptions.py" in str(info.value)


def test_generator_raising_stop_iteration_is_not_swallowed():
    def gen():
        yield 1
        raise StopIteration  # RuntimeError in Python (PEP 479)

    def consume(x):
        return x * sum(gen())

    expected = _raised(consume, r(3))
    actual = _raised(framejit.compile(consume), r(3))
    assert type(actual) is type(expected) is RuntimeError


def test_abstract_class_still_refuses_instances():
    class Abstract(abc.ABC):
        @abc.abstractmethod
        def f(self):
            ...

    def make(x):
        return Abstract(), x

    with pytest.raises(framejit.GraphBreakError, match="it is abstract"):
        framejit.compile(make, fullgraph=True)(r(3))
