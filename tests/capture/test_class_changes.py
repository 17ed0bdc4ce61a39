"""What a user class defines is guarded: a method, property, class attribute or protocol method
replaced on the class after the capture (``Cls.method = other``), a forward assigned to a module
object, or a function's code replaced, makes the next call recompile instead of running the
captured body (each was a wrong answer: the compiled function kept the old behaviour)."""

import torch
from torch import nn

import framejit
from framejit import _C


def _agrees(compiled, fn, *args):
    torch.testing.assert_close(compiled(*args), fn(*args))


def _follows(fn, *changes):
    """Compiled ``fn`` against eager before and after each change (a function of nothing) and
    once more after the last; returns the compiled function."""
    compiled = framejit.compile(fn)
    x = torch.randn(4)
    _agrees(compiled, fn, x)
    for change in changes:
        change()
        _agrees(compiled, fn, x)
    _agrees(compiled, fn, x)
    return compiled


def _make_class():
    class Scaler:
        factor = 2.0

        def __init__(self):
            self._v = 1.5

        @property
        def v(self):
            return self._v

        def apply(self, x):
            return x * 3

        @staticmethod
        def static(x):
            return x + 1

        @classmethod
        def from_class(cls, x):
            return x * cls.factor

    return Scaler


def test_a_method_replaced_on_the_class_recompiles(stats):
    Scaler = _make_class()
    obj = Scaler()

    _follows(lambda x: obj.apply(x), lambda: setattr(Scaler, "apply", lambda self, x: x * 11))
    assert stats.recompiles == 1
    assert "Scaler.__dict__['apply']: a different object" in stats.recompile_reasons[-1][1]


def test_a_property_replaced_on_the_class_recompiles(stats):
    Scaler = _make_class()
    obj = Scaler()

    _follows(lambda x: x * obj.v, lambda: setattr(Scaler, "v", property(lambda self: 9.0)),
             lambda: setattr(Scaler, "v", 4.0))  # a plain class attribute now
    assert stats.recompiles == 2


def test_static_and_class_methods_replaced_recompile(stats):
    Scaler = _make_class()
    obj = Scaler()

    def f(x):
        return Scaler.static(x) + obj.from_class(x) + Scaler.from_class(x)

    _follows(f)  # a bound classmethod is a new object on every read: no recompile
    assert stats.recompiles == 0
    _follows(f, lambda: setattr(Scaler, "static", staticmethod(lambda x: x * 100)),
             lambda: setattr(Scaler, "from_class", classmethod(lambda cls, x: x - cls.factor)))
    assert stats.recompiles == 2


def test_a_method_defined_later_on_a_subclass_hides_the_base_s(stats):
    class Base:
        def run(self, x):
            return x + 1

    class Derived(Base):
        pass

    obj = Derived()
    _follows(lambda x: obj.run(x), lambda: setattr(Derived, "run", lambda self, x: x * 7))
    assert stats.recompiles == 1
    assert "'run' in Derived.__dict__: False → True" in stats.recompile_reasons[-1][1]


def test_a_base_method_reached_through_super_replaced_recompiles(stats):
    class Base:
        def run(self, x):
            return x + 1

    class Derived(Base):
        def run(self, x):
            return super().run(x) * 2

    obj = Derived()
    _follows(lambda x: obj.run(x), lambda: setattr(Base, "run", lambda self, x: x - 5))
    assert stats.recompiles == 1


def test_protocol_methods_replaced_recompile(stats):
    class Table:
        def __init__(self):
            self.k = 2.0

        def __len__(self):
            return 2

        def __call__(self, x):
            return x * self.k

    table = Table()

    class Doubling:
        def __enter__(self):
            return 2.0

        def __exit__(self, *exc):
            return False

    def f(x):
        with Doubling() as d:
            y = table(x) * d
        return y + len(table)

    _follows(f, lambda: setattr(Table, "__call__", lambda self, x: x - self.k),
             lambda: setattr(Table, "__len__", lambda self: 5),
             lambda: setattr(Doubling, "__enter__", lambda self: 3.0))
    assert stats.recompiles == 3


def test_a_callable_object_held_by_a_class_is_read_through_it(stats):
    class Step:
        def __init__(self):
            self.k = 2.0

        def __call__(self, x):
            return x * self.k

    class Holder:
        step = Step()

    _follows(lambda x: Holder.step(x), lambda: setattr(Holder.step, "k", 5.0))
    assert stats.recompiles == 1


class _Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


class _Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Inner()

    def forward(self, x):
        return self.helper(self.inner(x))

    def helper(self, x):
        return x + 1


def _module_follows(change):
    model = _Outer()
    compiled = framejit.compile(model)
    x = torch.randn(2, 4)
    _agrees(compiled, model, x)
    undo = change(model)
    try:
        _agrees(compiled, model, x)
    finally:
        if undo is not None:
            undo()


def test_a_module_method_replaced_on_its_class_recompiles(stats):
    def change(model):
        old = _Outer.helper
        _Outer.helper = lambda self, x: x * 30
        return lambda: setattr(_Outer, "helper", old)

    _module_follows(change)
    assert stats.recompiles == 1


def test_a_submodule_s_class_forward_replaced_recompiles(stats):
    def change(model):
        old = _Inner.forward
        _Inner.forward = lambda self, x: self.fc(x) * 50
        return lambda: setattr(_Inner, "forward", old)

    _module_follows(change)
    assert stats.recompiles == 1


def test_a_forward_assigned_to_a_submodule_object_recompiles(stats):
    _module_follows(lambda model: setattr(model.inner, "forward", lambda x: x * 100))
    assert "model.inner.forward: assigned to the module object" in stats.recompile_reasons[-1][1] \
        or ".inner.forward: assigned to the module object" in stats.recompile_reasons[-1][1]
    _module_follows(lambda model: setattr(model.inner.fc, "forward", lambda x: x * 100))
    assert stats.recompiles == 2


def helper(x):
    return x * 2


def _times_five(x):
    return x * 5


def test_a_function_s_code_replaced_recompiles(stats):
    def f(x):
        return helper(x) + 1

    compiled = framejit.compile(f)
    x = torch.randn(4)
    _agrees(compiled, f, x)
    old = helper.__code__
    helper.__code__ = _times_five.__code__
    try:
        _agrees(compiled, f, x)
    finally:
        helper.__code__ = old
    _agrees(compiled, f, x)
    assert stats.recompiles == 1
    assert "helper.__code__: a different object" in stats.recompile_reasons[0][1]


def test_library_classes_add_no_class_guards():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    compiled = framejit.compile(model)
    compiled(torch.randn(2, 4))
    ((guard_fn, _, _, _),) = _C.get_cache_entries(type(model).forward.__code__)
    guards = guard_fn.__framejit_source__
    assert "__dict__[" not in guards and "__code__" not in guards, guards


class _Doubling(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)

    def __call__(self, x):
        return super().__call__(x) * 2


class _CallsDoubling(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Doubling()

    def forward(self, x):
        return self.inner(x) + nn.Module.__call__(self.inner.fc, x) + self.inner.fc._call_impl(x)


def test_a_submodule_s_own_call_runs_and_is_guarded(stats):
    """A module class's own __call__ was skipped (its forward ran alone)."""
    model = _CallsDoubling()
    compiled = framejit.compile(model, fullgraph=True)
    x = torch.randn(2, 4)
    _agrees(compiled, model, x)
    assert stats.graphs == 1 and stats.graph_breaks == 0
    old = _Doubling.__call__
    _Doubling.__call__ = lambda self, x: nn.Module.__call__(self, x) - 3
    try:
        _agrees(compiled, model, x)
    finally:
        _Doubling.__call__ = old
    assert stats.recompiles == 1


def test_a_submodule_whose_class_is_assigned_recompiles(stats):
    class Tripling(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 3

    _module_follows(lambda model: setattr(model.inner.fc, "__class__", Tripling))
    assert stats.recompiles == 1
    assert "type(" in stats.recompile_reasons[-1][1] and "Linear → Tripling" in stats.recompile_reasons[-1][1]


class _WithTable(nn.Module):
    TABLE = {"k": 2.0}
    SIZES = [1.0, 2.0]

    def forward(self, x):
        return x * self.TABLE["k"] + sum(self.SIZES)


def test_a_module_class_s_dict_and_list_are_guarded(stats):
    """What a module class's dict or list held was taken as fixed."""
    model = _WithTable()
    compiled = framejit.compile(model)
    x = torch.randn(2, 4)
    _agrees(compiled, model, x)
    _WithTable.TABLE["k"] = 5.0
    _WithTable.SIZES.append(4.0)
    try:
        _agrees(compiled, model, x)
    finally:
        _WithTable.TABLE["k"] = 2.0
        _WithTable.SIZES.pop()
    assert stats.recompiles == 1


def test_a_method_found_on_a_shared_base_is_guarded_for_each_subclass(stats):
    class Base:
        def run(self, x):
            return x + 1

    class Left(Base):
        pass

    class Right(Base):
        pass

    left, right = Left(), Right()
    _follows(lambda x: left.run(x) * right.run(x), lambda: setattr(Right, "run", lambda self, x: x * 7))
    assert stats.recompiles == 1
