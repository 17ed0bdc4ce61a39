"""``copy.copy`` and ``copy.deepcopy`` inside captured code.

Values the capture models are copied symbolically; an object from outside that holds plain data
(a config object) is copied from its state, with one guard that the original still holds the
same data. ``transformers``' T5 deep-copies its config inside the forward this way.
"""

import copy

import pytest
import torch

import framejit
from framejit.testing import assert_close_to_eager


def r(*shape):
    return torch.randn(*shape)


class Config:
    """A config object as libraries write them: plain data in the instance dict."""

    def __init__(self, **kw):
        self.scale = 2.0
        self.names = ["enc", "dec"]
        self.sizes = {"enc": 2, "dec": 3}
        self.flag = True
        self.__dict__.update(kw)


class MappedConfig(Config):
    """A class that renames attributes on every read, as transformers' configs do."""

    attribute_map = {"hidden": "size"}

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


class Custom:
    def __init__(self):
        self.v = 1

    def __deepcopy__(self, memo):
        return Custom()


CONFIG = Config()
MAPPED = MappedConfig(size=4)


# -- round trips ----------------------------------------------------------------------------------

def deepcopy_containers(x):
    a = [1, [2, 3], {"k": (4, [5])}]
    b = copy.deepcopy(a)
    b[1].append(9)
    b[2]["k"][1].append(6)
    return x + len(a[1]) + len(b[1]) + len(a[2]["k"][1]) + len(b[2]["k"][1])


def deepcopy_keeps_sharing(x):
    inner = [1]
    pair = [inner, inner]
    c = copy.deepcopy(pair)
    c[0].append(2)  # the copy's two items are still one list
    return x + len(c[1]) + len(inner)


def shallow_copy_shares_items(x):
    inner = [1]
    outer = [inner, 2]
    c = copy.copy(outer)
    c.append(3)
    c[0].append(4)
    return x + len(outer) + len(inner) + len(c)


def deepcopy_fresh_object(x):
    p = Config(extra=[1])
    q = copy.deepcopy(p)
    q.extra.append(2)
    q.scale = 5.0
    return x * p.scale + q.scale + len(p.extra) + len(q.extra)


def deepcopy_outside_config(x):
    c = copy.deepcopy(CONFIG)
    c.names.append("mid")
    c.scale = c.scale + 1
    return x * c.scale + len(c.names) + len(CONFIG.names) + c.sizes["dec"]


def deepcopy_renaming_config(x):
    c = copy.deepcopy(MAPPED)
    c.size = 6
    return x + c.hidden + MAPPED.hidden + hasattr(c, "hidden")


def copied_object_returned(x):
    c = copy.deepcopy(CONFIG)
    c.names.append("out")
    return x + 1, c


CASES = [
    (deepcopy_containers, lambda: (r(3),)),
    (deepcopy_keeps_sharing, lambda: (r(3),)),
    (shallow_copy_shares_items, lambda: (r(3),)),
    (deepcopy_fresh_object, lambda: (r(3),)),
    (deepcopy_outside_config, lambda: (r(3),)),
    (deepcopy_renaming_config, lambda: (r(3),)),
]


@pytest.mark.parametrize("fn, make_args", CASES, ids=[c[0].__name__ for c in CASES])
def test_copies_are_one_graph(check, fn, make_args):
    check(fn, *make_args())


def test_copied_outside_object_returned_is_a_new_object(stats, recorder):
    x = r(3)
    compiled = framejit.compile(copied_object_returned, backend=recorder)
    first = compiled(x)[1]
    second = compiled(x)[1]
    assert recorder.graph_count == 1 and stats.graph_breaks == 0 and stats.recompiles == 0
    assert type(first) is Config and first is not CONFIG and first is not second
    assert first.names == ["enc", "dec", "out"] and CONFIG.names == ["enc", "dec"]
    assert first.names is not second.names and first.sizes == CONFIG.sizes
    first.sizes["enc"] = 0
    assert CONFIG.sizes["enc"] == 2  # a deep copy: nothing shared with the original


def test_change_to_the_original_recompiles_with_its_name(stats, recorder):
    cfg = Config()

    def f(x, c):
        return x * copy.deepcopy(c).scale + len(copy.deepcopy(c).names)

    compiled = framejit.compile(f, backend=recorder)
    x = r(3)
    assert_close_to_eager(compiled(x, cfg), f(x, cfg))
    cfg.names.append("more")  # a change inside a nested list
    assert_close_to_eager(compiled(x, cfg), f(x, cfg))
    assert stats.recompiles == 1
    assert stats.recompile_reasons[-1][1] == "c.names: ['enc', 'dec'] → ['enc', 'dec', 'more']"
    cfg.flag = 1  # equal to True, but no longer a bool
    assert_close_to_eager(compiled(x, cfg), f(x, cfg))
    assert stats.recompiles == 2 and stats.eager_frames == 0


def test_copy_after_writing_the_original_breaks(stats, recorder):
    cfg = Config()

    def f(x, c):
        c.scale = 7.0
        return x * copy.deepcopy(c).scale

    out = framejit.compile(f, backend=recorder)(torch.ones(3), cfg)
    assert_close_to_eager(out, torch.full((3,), 7.0))
    assert cfg.scale == 7.0
    assert stats.graph_breaks == 1
    assert "copy.deepcopy() of the Config object c after the compiled function changed it" \
        in stats.break_reasons[0][1]


@pytest.mark.parametrize("value, why", [
    (Custom(), "defines __deepcopy__"),
    (Config(model=torch.nn.Linear(2, 2)), "holds a Linear object"),
])
def test_objects_not_copied_say_why(value, why):
    def f(x, c):
        return x + len(copy.deepcopy(c).__dict__)

    with pytest.raises(framejit.GraphBreakError) as e:
        framejit.compile(f, fullgraph=True)(r(3), value)
    assert why in str(e.value) and "copy.deepcopy()" in str(e.value)


def test_objects_not_copied_still_give_eager_answers(stats):
    c = Custom()

    def f(x, c):
        return x + copy.deepcopy(c).v

    x = r(3)
    assert_close_to_eager(framejit.compile(f)(x, c), x + 1)


def test_an_object_copied_twice_is_guarded_once(stats):
    """T5's decoder copies its config twice: one guard on the original's state, not two (each
    compares the whole instance dict at every call)."""
    from framejit import _C
    from framejit.capture.values.copying import state_matches

    cfg = Config()

    def f(x, c):
        return x * copy.deepcopy(c).scale + len(copy.deepcopy(c).names)

    compiled = framejit.compile(f)
    x = r(3)
    assert_close_to_eager(compiled(x, cfg), f(x, cfg))
    ((guard_fn, _, _, _),) = _C.get_cache_entries(f.__code__)
    (name,) = [k for k, v in guard_fn.__globals__.items() if v is state_matches]
    assert guard_fn.__framejit_source__.count(f"{name}(") == 1
    cfg.scale = 3.0
    assert_close_to_eager(compiled(x, cfg), f(x, cfg))
    assert stats.recompiles == 1
