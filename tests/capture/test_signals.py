"""Exceptions raised by signal handlers during capture propagate out of the call unchanged (issue
9, item 11): only framejit's own errors fall back. The interpreter stays usable, the hook state
and the handlers are restored, and the function compiles on a later call."""

import signal
import threading

import pytest
import torch

import framejit
from framejit import _C
from framejit.capture import examples as example_engine


class Timeout(Exception):
    pass


@pytest.fixture
def alarm():
    """A SIGALRM handler raising Timeout; the raised instances are kept in ``alarm.raised``."""
    raised = []

    def handler(signum, frame):
        raised.append(Timeout(f"signal {signum}"))
        raise raised[-1]

    previous = signal.signal(signal.SIGALRM, handler)
    handler.raised = raised
    try:
        yield handler
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def many_ops(x):
    for i in range(400):
        x = torch.sin(x) * 1.001 + i
    return x


def _assert_hook_state_restored(handler):
    assert _C.get_eval_frame() is None
    assert not _C.hook_installed()
    assert _C.active_threads() == 0
    assert signal.getsignal(signal.SIGALRM) is handler


def test_timer_during_a_long_capture_propagates(alarm, stats):
    # A timer that fires while guards run is still lost (the guard function counts any error as
    # a miss; see the closing note of issue 9): on a loaded machine that can happen, so the
    # scenario gets three tries, each from a clean state.
    for _ in range(3):
        framejit.reset()
        compiled = framejit.compile(many_ops)
        signal.setitimer(signal.ITIMER_REAL, 0.005)
        try:
            compiled(torch.ones(3))
        except Timeout as e:
            info_value = e
            break
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    else:
        pytest.fail("the handler's Timeout never came out of the call")
    assert info_value is alarm.raised[-1]  # the handler's own exception, not a wrapper of it
    # On a loaded machine the timer may fire after the capture, while the graph runs: the
    # exception goes on all the same, and nothing is cached wrongly or decided as a fallback.
    captured = stats.captured
    assert captured in (0, 1) and stats.fallback_reasons == []
    _assert_hook_state_restored(alarm)
    torch.testing.assert_close(compiled(torch.ones(3)), many_ops(torch.ones(3)))
    assert stats.captured >= 1 and stats.eager_frames == 0 and stats.fallback_reasons == []


def test_handler_exception_turned_into_a_fallback_inside_capture_propagates(alarm, stats, monkeypatch):
    """The signal arrives while framejit runs an op on meta tensors, inside a `try` that turns
    any error there into "the frame runs as plain Python"."""
    run = example_engine._run_on_meta_retrying_foreach
    calls = []

    def run_with_signal(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            signal.raise_signal(signal.SIGALRM)
        return run(*args, **kwargs)

    monkeypatch.setattr(example_engine, "_run_on_meta_retrying_foreach", run_with_signal)

    def f(x):
        return (x.sin() + 1).cos() * 2

    compiled = framejit.compile(f)
    with pytest.raises(Timeout) as info:
        compiled(torch.ones(3))
    assert info.value is alarm.raised[0]
    assert stats.fallback_reasons == []
    _assert_hook_state_restored(alarm)
    monkeypatch.undo()
    torch.testing.assert_close(compiled(torch.ones(3)), f(torch.ones(3)))
    assert stats.captured == 1


def test_handler_exception_swallowed_inside_capture_propagates(alarm, stats):
    """A backend that catches everything: the handler's exception still leaves the call."""
    calls = []

    def backend(gm, example_inputs):
        calls.append(1)
        try:
            if len(calls) == 1:
                signal.raise_signal(signal.SIGALRM)
        except Exception:
            pass
        return gm.forward

    compiled = framejit.compile(lambda x: x * 2, backend=backend)
    with pytest.raises(Timeout):
        compiled(torch.ones(2))
    _assert_hook_state_restored(alarm)
    assert stats.captured == 0  # the call was interrupted: nothing was cached
    torch.testing.assert_close(compiled(torch.ones(2)), torch.ones(2) * 2)
    assert stats.captured == 1 and len(calls) == 2


def test_handler_that_does_not_raise_is_transparent(stats):
    seen = []

    def handler(signum, frame):
        seen.append(signum)

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        def backend(gm, example_inputs):
            signal.raise_signal(signal.SIGUSR1)
            return gm.forward

        compiled = framejit.compile(lambda x: x + 1, backend=backend)
        torch.testing.assert_close(compiled(torch.ones(2)), torch.ones(2) + 1)
        assert seen == [signal.SIGUSR1] and stats.captured == 1
        assert signal.getsignal(signal.SIGUSR1) is handler
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_handler_replaced_during_capture_stays_replaced(alarm):
    def other(signum, frame):
        pass

    def backend(gm, example_inputs):
        signal.signal(signal.SIGALRM, other)
        return gm.forward

    compiled = framejit.compile(lambda x: x - 1, backend=backend)
    compiled(torch.ones(2))
    assert signal.getsignal(signal.SIGALRM) is other


def test_keyboard_interrupt_during_capture_propagates(stats):
    def backend(gm, example_inputs):
        raise KeyboardInterrupt

    compiled = framejit.compile(lambda x: x * 3, backend=backend)
    with pytest.raises(KeyboardInterrupt):
        compiled(torch.ones(2))
    assert _C.get_eval_frame() is None and not _C.hook_installed()


def test_capture_on_another_thread_leaves_handlers_alone(alarm, stats):
    results = []

    def work():
        results.append(framejit.compile(many_ops)(torch.ones(2)))

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert len(results) == 1 and stats.captured == 1
    assert signal.getsignal(signal.SIGALRM) is alarm

