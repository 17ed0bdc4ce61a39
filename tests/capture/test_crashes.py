"""Generated code that must never crash the interpreter: graph breaks inside ``with`` blocks
whose resume functions are left by an exception (issue 9, items 2 and 10).

The cases live in crash_cases.py and run in a child interpreter, so that a crash fails the
cases from the crashed one on instead of killing the test run; each case compares its results,
exceptions, tracebacks and global state with eager, and checks every code object framejit
generated for it with ``check_code``.
"""

import json
import os
import subprocess
import sys
import types

import pytest
import torch
from bytecode import Bytecode, TryBegin

import framejit
from framejit.capture import resume
from framejit.capture.codecheck import BadCode, check_code, exception_table
from framejit.capture.interpreter import decode

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import crash_cases  # noqa: E402

NAMES = [n + mode for n in crash_cases.CASES for mode in ("", ":raw")]
#: Cases expected to fail (none now: a graph that raises inside a user context manager runs its
#: frame again as plain Python, which calls the manager's __exit__ as eager does).
KNOWN: set = set()


@pytest.fixture(scope="module")
def outcomes():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "crash_cases.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            results[record["case"]] = record
    return results, proc


@pytest.mark.parametrize("name", NAMES)
def test_break_inside_with_blocks(outcomes, name):
    results, proc = outcomes
    if name not in results:
        pytest.fail(f"the child interpreter ended (exit status {proc.returncode}) before case {name}:\n"
                    f"{proc.stderr[-4000:]}")
    record = results[name]
    if name in KNOWN:
        if record["ok"]:
            pytest.fail(f"{name} passes now: remove it from KNOWN")
        pytest.xfail(record["detail"])
    assert record["ok"], record["detail"]


def test_child_interpreter_exits_cleanly(outcomes):
    results, proc = outcomes
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert set(results) == set(NAMES)


# -- in process: the resume code itself ---------------------------------------------------------

def two_blocks(x):
    with crash_cases.Ctx(), torch.no_grad():
        if bool(x.any()):
            raise ValueError("boom")
    z = x + 1
    return z


def test_resume_code_keeps_the_original_exception_table():
    code = two_blocks.__code__
    insts = decode(code)
    jump = next(i for i, ins in enumerate(insts) if ins.name.startswith("POP_JUMP"))
    for target in (jump + 1, insts[jump].target):  # both successors of `if bool(...)`
        rcode = resume.resume_code(code, target, 2, ("x",))
        check_code(rcode, disassemble=True)
        assert rcode.co_stacksize == code.co_stacksize
        original = sorted((d, lasti) for *_, d, lasti in exception_table(code))
        assert sorted((d, lasti) for *_, d, lasti in exception_table(rcode)) == original


def test_check_code_rejects_an_unreachable_handler_depth():
    """The code the bytecode library made before the fix: a `with` region whose depth it never
    computed (32768)."""
    bc = Bytecode.from_code(two_blocks.__code__, conserve_exception_block_stackdepth=True)
    for item in bc:
        if isinstance(item, TryBegin):
            item.stack_depth = 32768
    bad = bc.to_code(stacksize=two_blocks.__code__.co_stacksize, compute_exception_stack_depths=False)
    with pytest.raises(BadCode, match="depth"):
        check_code(bad)


def test_check_code_rejects_a_too_small_stack():
    bad = two_blocks.__code__.replace(co_stacksize=2)
    with pytest.raises(BadCode):
        check_code(bad)


def test_check_code_accepts_python_compiled_code():
    import inspect
    import json as json_module
    import traceback

    for module in (inspect, json_module.decoder, traceback, crash_cases):
        for value in vars(module).values():
            for fn in [value, *vars(value).values()] if isinstance(value, type) else [value]:
                if isinstance(getattr(fn, "__code__", None), types.CodeType):
                    check_code(fn.__code__, disassemble=True)


def test_resume_after_break_in_two_blocks_is_captured(stats):
    compiled = framejit.compile(crash_cases.break_in_two_blocks)
    expected = crash_cases.break_in_two_blocks(torch.ones(2))
    actual = compiled(torch.ones(2))
    torch.testing.assert_close(actual[0], expected[0])
    assert actual[1] == expected[1] and torch.is_grad_enabled()
    assert stats.graph_breaks == 1
    assert not any("internal error" in r for _, r in stats.fallback_reasons), stats.fallback_reasons
