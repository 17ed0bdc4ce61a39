"""The fast decoder (capture/decoding.py) agrees with ``Bytecode.from_code`` on every code
object of several libraries: names, arguments, line numbers, jump targets, exception handlers
and positions in the ``Bytecode`` list."""

import importlib
import types

import pytest

from framejit.capture import decoding, interpreter

MODULES = ["json.decoder", "collections", "contextlib", "dataclasses", "functools", "typing",
           "asyncio.tasks", "inspect", "enum", "re._parser", "framejit.capture.interpreter",
           "framejit.capture.convert_frame", "torch.nn.modules.module", "torch.nn.functional",
           "torch._tensor", "transformers.models.gpt2.modeling_gpt2",
           "transformers.models.llama.modeling_llama", "transformers.cache_utils"]


def _codes(obj, seen):
    if isinstance(obj, types.CodeType):
        if id(obj) not in seen:
            seen.add(id(obj))
            yield obj
            for c in obj.co_consts:
                yield from _codes(c, seen)


def _module_codes(name):
    try:
        module = importlib.import_module(name)
    except ImportError:
        pytest.skip(f"{name} is not installed")
    with open(module.__file__) as f:
        top = compile(f.read(), module.__file__, "exec")
    return list(_codes(top, set()))


def _key(arg):
    # Labels are new objects each time: only their kind is compared.
    return ("label",) if type(arg).__name__ == "Label" else (type(arg), arg)


@pytest.mark.skipif(not decoding._SUPPORTED, reason="the fast decoder does not apply here")
@pytest.mark.parametrize("module", MODULES)
def test_fast_decoding_agrees_with_the_bytecode_library(module):
    codes = _module_codes(module)
    assert codes
    for code in codes:
        rows, offsets = decoding.instructions(code)
        slow = interpreter._decode_with_bytecode(code)
        interpreter._attach_handlers(code, slow)
        fast = [interpreter.Inst(n, a, line, t, code=code) for n, a, line, t in rows]
        interpreter._attach_handlers(code, fast, offsets)
        assert len(fast) == len(slow), code
        interpreter._decoded[code] = fast
        try:
            for f, s in zip(fast, slow):
                where = (code.co_qualname, code.co_firstlineno, s)
                assert (f.name, _key(f.arg), f.lineno, f.target, f.handler) == \
                       (s.name, _key(s.arg), s.lineno, s.target, s.handler), where
                assert f.pos == s.pos, where
        finally:
            interpreter._decoded.pop(code, None)
