"""fx_ir/examples.py: the one memoised meta runner, and fx_ir's one in-place rule."""

import operator

import pytest
import torch

from framejit.fx_ir import clear_meta_memo, fresh_meta, is_inplace, run_on_meta
from framejit.fx_ir import examples as engine

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def empty_memo():
    clear_meta_memo()
    yield
    clear_meta_memo()


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def same_metadata(a, b):
    return (a.shape, a.stride(), a.storage_offset(), a.dtype, a.requires_grad) == \
        (b.shape, b.stride(), b.storage_offset(), b.dtype, b.requires_grad)


def test_memo_hit_is_a_fresh_tensor_of_the_same_metadata():
    x = meta(4, 6).t()  # strides (1, 6)
    first = run_on_meta("call_function", torch.mul, (x, 2.0), {})
    assert len(engine._memo) == 1
    second = run_on_meta("call_function", torch.mul, (x, 2.0), {})
    third = run_on_meta("call_function", torch.mul, (x, 2.0), {})
    assert second is not first and third is not second
    assert same_metadata(second, first) and second.stride() == (1, 6)
    assert len(engine._memo) == 1


def test_memo_key_tells_dtypes_strides_offsets_and_arguments_apart():
    run = lambda *args: run_on_meta("call_function", torch.sum, args, {})  # noqa: E731
    assert run(meta(4, 6), 0).shape == (6,)
    assert run(meta(4, 6), 1).shape == (4,)
    assert run(meta(4, 6, dtype=torch.int32), 1).dtype == torch.int64
    base = meta(5, 6)
    assert run(base[1:], 0).shape == (6,)  # an input with a storage offset: its own entry
    assert run_on_meta("call_method", "sum", (meta(4, 6),), {"dim": 1}).shape == (4,)
    assert len(engine._memo) == 5


def test_tuples_and_named_tuples_come_back_fresh():
    x = meta(3, 5)
    first = run_on_meta("call_function", torch.max, (x, 1), {})
    second = run_on_meta("call_function", torch.max, (x, 1), {})
    assert type(second) is type(first) and second.values is not first.values
    assert same_metadata(second.values, first.values)
    assert second.indices.dtype == torch.int64


@pytest.mark.parametrize("call", [
    ("call_method", "t", ()),
    ("call_function", operator.getitem, (slice(1, None),)),  # storage offset 5
    ("call_method", "narrow", (0, 1, 2)),
    ("call_method", "detach", ()),  # not a view, but x's storage
    ("call_method", "contiguous", ()),  # x itself
])
def test_views_and_aliases_are_not_memoised(call):
    op, target, rest = call
    x = meta(4, 5)
    first = run_on_meta(op, target, (x, *rest), {})
    second = run_on_meta(op, target, (x, *rest), {})
    assert not engine._memo
    assert same_metadata(second, first)
    assert second.untyped_storage()._cdata == x.untyped_storage()._cdata  # as eager: shares x
    if target is operator.getitem:
        assert second.storage_offset() == 5


def test_in_place_calls_always_run():
    x = meta(2, 3)
    run_on_meta("call_method", "unsqueeze_", (x, 0), {})
    run_on_meta("call_method", "unsqueeze_", (x, 0), {})
    assert x.shape == (1, 1, 2, 3) and not engine._memo
    out = meta(2, 3)
    run_on_meta("call_function", torch.add, (meta(2, 3), 1), {"out": out})
    assert not engine._memo


def test_requires_grad_results_stay_non_leaves():
    """A memoised result of an op on a tensor that requires grad is a non-leaf, so that an
    in-place op on it works as in eager."""
    w = meta(3).requires_grad_(True)
    run_on_meta("call_function", torch.mul, (w, 2), {})
    y = run_on_meta("call_function", torch.mul, (w, 2), {})
    assert y.requires_grad and not y.is_leaf
    y.add_(1)
    with torch.no_grad():  # without grad mode, requires_grad does not matter: its own entry
        z = run_on_meta("call_function", torch.mul, (w, 2), {})
    assert not z.requires_grad and len(engine._memo) == 2


def test_factories_depend_on_the_default_dtype():
    assert run_on_meta("call_function", torch.zeros, ((2,),), {"device": "meta"}).dtype == torch.float32
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert run_on_meta("call_function", torch.zeros, ((2,),), {"device": "meta"}).dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)


def test_unhashable_arguments_and_errors():
    x = meta(2, 3)

    def scale(t, options):
        return t * options["by"]

    assert run_on_meta("call_function", scale, (x, {"by": 2}), {}).shape == (2, 3)  # dicts: keyed
    assert len(engine._memo) == 1

    class Options:
        __hash__ = None
        by = 2

    assert run_on_meta("call_function", lambda t, o: t * o.by, (x, Options()), {}).shape == (2, 3)
    assert len(engine._memo) == 1  # an unhashable argument: run, not memoised
    with pytest.raises(RuntimeError):
        run_on_meta("call_function", torch.mm, (x, x), {})
    assert len(engine._memo) == 1  # nothing recorded for a failing call


def test_fresh_meta_keeps_offsets_strides_and_leafness():
    base = meta(4, 5)
    w = meta(4, 5).requires_grad_(True)
    views = fresh_meta((base[1:, ::2], (w * 2)[1:], [None, 3, torch.float16]))
    v, g, rest = views
    assert same_metadata(v, base[1:, ::2]) and v.storage_offset() == 5
    assert same_metadata(g, (w * 2)[1:]) and not g.is_leaf
    assert rest == [None, 3, torch.float16]
    with pytest.raises(TypeError):
        fresh_meta("a string")


@pytest.mark.parametrize("op, target, kwargs, expected", [
    ("call_method", "add_", None, True),
    ("call_method", "copy_", None, True),
    ("call_method", "__iadd__", None, True),
    ("call_method", "__setitem__", None, True),
    ("call_method", "add", None, False),
    ("call_method", "__add__", None, False),
    ("call_function", operator.iadd, None, True),
    ("call_function", operator.setitem, None, True),
    ("call_function", operator.add, None, False),
    ("call_function", aten.add_.Tensor, None, True),
    ("call_function", aten.copy_.default, None, True),
    ("call_function", aten.add.Tensor, None, False),
    ("call_function", torch.Tensor.copy_, None, True),
    ("call_function", torch.relu_, None, True),
    ("call_function", torch.add, None, False),
    ("call_function", torch.add, {"out": None}, True),
    ("call_function", torch.nn.functional.relu, {"inplace": True}, True),
    ("call_function", torch.nn.functional.relu, {"inplace": False}, False),
    ("placeholder", "x_", None, False),
])
def test_is_inplace(op, target, kwargs, expected):
    assert is_inplace(op, target, kwargs) is expected


# -- the disk memo ------------------------------------------------------------------------------


@pytest.fixture
def disk(tmp_path, monkeypatch):
    """A disk memo of its own, in a fresh cache folder, in place of the process's."""
    monkeypatch.setenv("FRAMEJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FRAMEJIT_META_CACHE", raising=False)
    fresh = engine._DiskMemo()
    monkeypatch.setattr(engine, "_disk", fresh)
    return fresh


def _as_new_process(monkeypatch):
    """Save what this "process" learnt, then start another: empty memo, disk read afresh."""
    engine._disk.save()
    clear_meta_memo()
    fresh = engine._DiskMemo()
    monkeypatch.setattr(engine, "_disk", fresh)
    return fresh


def test_disk_memo_gives_a_new_process_the_recorded_metadata(disk, monkeypatch):
    x = meta(4, 6).t()
    calls = [("call_function", torch.mul, (x, 2.0), {}),
             ("call_function", torch.max, (meta(3, 5), 1), {}),
             ("call_function", aten.sum.dim_IntList, (meta(2, 3, 4), [1]), {"keepdim": True}),
             ("call_method", "softmax", (meta(2, 3),), {"dim": -1}),
             ("call_function", torch.nn.functional.layer_norm, (meta(2, 8), (8,)), {}),
             ("call_function", operator.add, (meta(2, 3, dtype=torch.float16), 1.5), {}),
             ("call_function", torch.zeros, ((2, 3),), {"device": "meta", "dtype": torch.int64})]
    first = [run_on_meta(*call) for call in calls]
    assert len(disk.new) == len(calls)
    fresh = _as_new_process(monkeypatch)
    again = [run_on_meta(*call) for call in calls]
    assert fresh.read == len(calls) and not fresh.new  # every one came from the disk
    for a, b in zip(first, again):
        assert type(a) is type(b)
        for u, v in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            assert same_metadata(u, v)


def test_disk_memo_is_what_a_new_process_reads(disk, monkeypatch):
    # The record is used as it is, without running the kernel: shown with a doctored one.
    run_on_meta("call_function", torch.neg, (meta(2, 3),), {})
    ((key, value),) = disk.new.items()
    disk.new[key] = ("T", (7, 7), (7, 1), "torch.float64", False, True)
    _as_new_process(monkeypatch)
    doctored = run_on_meta("call_function", torch.neg, (meta(2, 3),), {})
    assert doctored.shape == (7, 7) and doctored.dtype == torch.float64
    # Other arguments are other keys: -0.0 and 0.0, dtypes, strides, grad mode.
    assert run_on_meta("call_function", torch.neg, (meta(2, 3, dtype=torch.float64),), {}).shape == (2, 3)
    assert run_on_meta("call_function", torch.neg, (meta(3, 2).t(),), {}).shape == (2, 3)
    with torch.no_grad():
        assert run_on_meta("call_function", torch.neg, (meta(2, 3),), {}).shape == (2, 3)


def test_only_callables_known_in_every_process_go_to_disk(disk):
    import functools

    x = meta(2, 3)

    @functools.wraps(torch.nn.functional.relu)
    def patched(t, inplace=False):  # looks like torch's (name, module), is not
        return t * 2

    def mine(t):
        return t + 1

    for target in (patched, mine, lambda t: t - 1):
        run_on_meta("call_function", target, (x,), {})
    assert not disk.new and len(engine._memo) == 3  # memoised in the process only
    run_on_meta("call_function", torch.nn.functional.relu, (x,), {})
    run_on_meta("call_function", torch.Tensor.add, (x, 1), {})
    run_on_meta("call_function", aten.add.Tensor, (x, x), {})
    assert len(disk.new) == 3
    # An argument of a type that is not plainly a value: not on disk either.
    class Count(int):
        pass

    run_on_meta("call_function", torch.add, (x, Count(1)), {})
    assert len(disk.new) == 3 and len(engine._memo) == 7


def test_disk_memo_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("FRAMEJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FRAMEJIT_META_CACHE", "0")
    off = engine._DiskMemo()
    monkeypatch.setattr(engine, "_disk", off)
    run_on_meta("call_function", torch.neg, (meta(2, 3),), {})
    off.save()
    assert not off.new and not list(tmp_path.rglob("*.marshal"))


def test_disk_memo_is_written_when_the_process_exits(tmp_path):
    import os
    import subprocess
    import sys

    script = ("import torch\n"
              "from framejit.fx_ir import run_on_meta\n"
              "run_on_meta('call_function', torch.neg, (torch.empty(2, 5, device='meta'),), {})\n")
    env = {**os.environ, "FRAMEJIT_CACHE_DIR": str(tmp_path)}
    env.pop("FRAMEJIT_META_CACHE", None)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-c", script], env=env, cwd=root, check=True)
    (path,) = tmp_path.rglob("*.marshal")
    import marshal

    with open(path, "rb") as f:
        key, value = marshal.load(f)
    assert value == ("T", (2, 5), (5, 1), "torch.float32", False, True)
    assert key[:2] == ("call_function", ("builtin", "torch", "neg"))


def test_calls_without_a_tensor_result_always_run(disk):
    # _set_grad_enabled returns None: a memo hit would skip its effect on the grad mode.
    for _ in range(2):
        run_on_meta("call_function", torch._C._set_grad_enabled, (False,), {})
        assert not torch.is_grad_enabled()
        run_on_meta("call_function", torch._C._set_grad_enabled, (True,), {})
        assert torch.is_grad_enabled()
    assert run_on_meta("call_method", "dim", (meta(2, 3),), {}) == 2
    assert not engine._memo and not disk.new


def _records(tmp_path):
    return [p for p in tmp_path.rglob("*.marshal") if p.parent.name != "packs"]


def test_a_pack_gives_a_new_process_its_records_and_its_views_without_a_file_each(
        disk, monkeypatch, tmp_path):
    x = meta(4, 6)
    calls = [("call_function", torch.mul, (x, 2.0), {}),
             ("call_method", "softmax", (meta(2, 3),), {"dim": -1}),
             ("call_method", "view", (x, 24), {}),  # a view: never memoised
             ("call_method", "t", (x,), {})]
    with engine.meta_pack("f.py:1:f"):
        first = [run_on_meta(*call) for call in calls]
    assert len(disk.new) == 2
    fresh = _as_new_process(monkeypatch)
    (pack,) = tmp_path.rglob("packs/*.marshal")
    for path in _records(tmp_path):  # the records' own files are gone: the pack answers
        path.unlink()
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: opened.append(str(p)) or real_open(p, *a, **k))
    with engine.meta_pack("f.py:1:f"):
        again = [run_on_meta(*call) for call in calls]
    monkeypatch.setattr("builtins.open", real_open)
    assert opened == [str(pack)]  # the views' keys too: the pack says they have no record
    assert fresh.read == 2 and not fresh.new
    for a, b in zip(first, again):
        assert same_metadata(a, b)
    assert again[2]._base is x and again[3]._base is x  # a view is still a view of its input
    # Another capture's pack does not hold them: it reads the records' files (gone now).
    fresh = _as_new_process(monkeypatch)
    with engine.meta_pack("g.py:1:g"):
        run_on_meta(*calls[0])
    assert fresh.read == 0


def test_a_pack_s_record_is_what_a_new_process_reads_and_a_full_pack_starts_afresh(
        disk, monkeypatch, tmp_path):
    with engine.meta_pack("f"):
        run_on_meta("call_function", torch.neg, (meta(2, 3),), {})
    disk.save()
    ((key, value),) = disk.packs["f"].items()
    disk.packs["f"][key] = ("T", (7, 7), (7, 1), "torch.float64", False, True)
    with engine.meta_pack("f"):  # a pack is read once, then kept: this process's copy answers
        clear_meta_memo()
        doctored = run_on_meta("call_function", torch.neg, (meta(2, 3),), {})
    assert doctored.shape == (7, 7) and doctored.dtype == torch.float64
    # Past PACK_LIMIT a pack holds the last process's records alone.
    monkeypatch.setattr(engine, "PACK_LIMIT", 2)
    sizes = []
    for n in (3, 4):
        fresh = _as_new_process(monkeypatch)
        with engine.meta_pack("f"):
            run_on_meta("call_function", torch.neg, (meta(n, 3),), {})
        fresh.save()
        sizes.append(len(fresh._read_pack("f")))
    assert sizes == [2, 1]
    # Outside a pack, nothing goes to one.
    fresh = _as_new_process(monkeypatch)
    run_on_meta("call_function", torch.neg, (meta(5, 3),), {})
    assert not fresh.pack_new


def test_a_capture_keeps_its_records_in_a_pack_named_by_its_function(disk, monkeypatch):
    import framejit

    def double_relu(x):
        return (x * 2).relu() + x.t().sum()

    framejit.reset()
    compiled = framejit.compile(double_relu, backend="eager")
    compiled(torch.randn(3, 3))
    code = double_relu.__code__
    name = f"{code.co_filename}:{code.co_firstlineno}:{code.co_qualname}"
    assert disk.pack_new[name], disk.pack_new
    assert None in disk.pack_new[name].values()  # x.t(): a view, no record
    framejit.reset()
