/* framejit._C: the PEP 523 frame-evaluation hook.
 *
 * For every Python function frame that is about to start, the hook looks up the cache entries
 * stored on the frame's code object (co_extra).  An entry is a Python tuple
 * (guard, new_code, owner, ...): when guard(*arguments, *closure_cells) is true the frame runs
 * new_code instead of its own code (closure_cells: the function's closure, one cell per free
 * variable, so guards can check what a closure sees).  On a miss the thread's Python callback (the compiler) is asked for new code.
 *
 * New code is run in one of two ways (see shared/notes/cpython_frames.md):
 *   SWAP  re-point the not-yet-started frame at new_code and evaluate it in place.  CPython then
 *         clears and pops it as usual.  Needs room for the new frame size.
 *   CALL  build a function from new_code and call it with the frame's bound arguments, then
 *         dispose of the original frame, which never ran (3.11: the caller pops it; 3.12: our
 *         own clear-and-pop; 3.13: the exported _PyEval_FrameClearAndPop).
 *
 * The hook is per interpreter but the callback is per thread; the hook is installed only while
 * at least one thread has a callback other than None, because any installed hook turns off the
 * 3.11+ inlined Python-to-Python calls.  Everything here relies on the GIL.
 *
 * Python API:
 *   set_eval_frame(cb) -> previous     this thread's callback: None (off), False (run cached
 *   get_eval_frame() -> cb             code only) or cb(code, func, f_locals) -> code or None
 *   CompiledFunction(fn, callback)     calls fn with the thread's callback set to callback
 *   get_cache_entries(code) -> list    live list of (guard, new_code, owner, ...) entries
 *   set_code_mode(code, mode), get_code_mode(code), clear_code(code)
 *   MODE_DEFAULT, MODE_SKIP, MODE_RUN_ONLY
 *   stats(), reset_stats(), set_force_call(flag), hook_installed(), active_threads(),
 *   datastack_info()                   for tests and debugging
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT, READONLY (3.11) */
#include <stdbool.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define FJ_PY311 1
#elif PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000
#define FJ_PY312 1
#elif PY_VERSION_HEX >= 0x030D0000 && PY_VERSION_HEX < 0x030E0000
#define FJ_PY313 1
#else
#error "framejit._C knows the frame layout of CPython 3.11, 3.12 and 3.13 only; check the new version's _PyInterpreterFrame, frame ownership and disposal rules before adding it"
#endif

#ifdef Py_GIL_DISABLED
#error "framejit._C relies on the GIL; free-threaded builds are not supported"
#endif

/* The internal headers: only struct _PyInterpreterFrame and a few macros are used from them.
 * 3.12's pycore headers clash with the public PyObject_GC_IsFinalized macro (gh-105268). */
#ifdef FJ_PY312
#undef _PyGC_FINALIZED
#endif
#define Py_BUILD_CORE
#include <internal/pycore_frame.h>
#ifdef FJ_PY313
#include <internal/pycore_ceval.h> /* _PyEval_FrameClearAndPop (exported since 3.13) */
#endif
#undef Py_BUILD_CORE

/* ---- Version layer: everything that differs between 3.11, 3.12 and 3.13 ---------------- */

#if defined(FJ_PY311)
#define FRAME_CODE(f) ((f)->f_code)
#define FRAME_FUNC(f) ((f)->f_func)
/* 3.11 has no co_framesize; this is the size _PyEvalFramePushAndInit pushes. */
#define FRAME_WORDS(co) ((Py_ssize_t)(co)->co_nlocalsplus + (co)->co_stacksize + FRAME_SPECIALS_SIZE)
#define FRAME_STARTED(f) (_PyInterpreterFrame_LASTI(f) >= 0)
#define SET_FRAME_CODE(f, co)                                                                  \
    do {                                                                                       \
        (f)->f_code = (PyCodeObject *)Py_NewRef(co);                                           \
        (f)->prev_instr = _PyCode_CODE(co) - 1;                                                \
    } while (0)
#define Code_GetExtra _PyCode_GetExtra
#define Code_SetExtra _PyCode_SetExtra
#define RequestCodeExtraIndex _PyEval_RequestCodeExtraIndex
#else
#define FRAME_FUNC(f) ((PyFunctionObject *)(f)->f_funcobj)
#define FRAME_WORDS(co) ((Py_ssize_t)(co)->co_framesize)
#define Code_GetExtra PyUnstable_Code_GetExtra
#define Code_SetExtra PyUnstable_Code_SetExtra
#define RequestCodeExtraIndex PyUnstable_Eval_RequestCodeExtraIndex
#if defined(FJ_PY312)
#define FRAME_CODE(f) ((f)->f_code)
#define FRAME_STARTED(f) (_PyInterpreterFrame_LASTI(f) >= 0)
#define SET_FRAME_CODE(f, co)                                                                  \
    do {                                                                                       \
        (f)->f_code = (PyCodeObject *)Py_NewRef(co);                                           \
        (f)->prev_instr = _PyCode_CODE(co) - 1;                                                \
    } while (0)
#else /* 3.13: a fresh frame's instr_ptr is the first instruction (LASTI 0, not -1) */
#define FRAME_CODE(f) ((PyCodeObject *)(f)->f_executable)
#define FRAME_STARTED(f) (_PyInterpreterFrame_LASTI(f) > 0)
#define SET_FRAME_CODE(f, co)                                                                  \
    do {                                                                                       \
        (f)->f_executable = Py_NewRef(co);                                                     \
        (f)->instr_ptr = _PyCode_CODE(co);                                                     \
    } while (0)
#endif
#endif

#define GENERATOR_FLAGS (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE)

enum { MODE_DEFAULT = 0, MODE_SKIP = 1, MODE_RUN_ONLY = 2 };

/* ---- Module-wide state (single interpreter, protected by the GIL) ----------------------- */

static PyInterpreterState *hook_interp;
/* The eval function that ours displaced; it is put back when ours is removed.  Frames are
 * never passed on to it: a hook installed later over ours (torch's own, say) would chain back
 * to us and make a cycle.  A hook installed before ours is therefore idle while ours is in. */
static _PyFrameEvalFunction displaced_eval = _PyEval_EvalFrameDefault;
static Py_ssize_t active_threads; /* threads whose callback is not None */
static Py_ssize_t code_extra_index = -1;
static Py_tss_t thread_key = Py_tss_NEEDS_INIT;
static bool force_call;

static struct {
    unsigned long long swap, call, callback, hit, miss, guard_error;
} stats;

static PyObject *fj_eval_frame(PyThreadState *tstate, _PyInterpreterFrame *frame, int throwflag);

static void
install_hook(void)
{
    _PyFrameEvalFunction current = _PyInterpreterState_GetEvalFrameFunc(hook_interp);
    if (current != fj_eval_frame) {
        displaced_eval = current;
        _PyInterpreterState_SetEvalFrameFunc(hook_interp, fj_eval_frame);
    }
}

static void
uninstall_hook(void)
{
    /* Leave alone a hook that someone installed over ours. */
    if (_PyInterpreterState_GetEvalFrameFunc(hook_interp) == fj_eval_frame) {
        _PyInterpreterState_SetEvalFrameFunc(hook_interp, displaced_eval);
    }
}

/* ---- Per-thread state ------------------------------------------------------------------- *
 * A small object kept in the thread-state dict (so that it dies with the thread, giving back
 * its share of active_threads) and reached quickly through a Py_tss_t. */

typedef struct {
    PyObject_HEAD
    PyObject *callback;  /* strong; None = off, False = run only, else the compiler */
    PyObject *skip_code; /* borrowed, identity only: the CALL path's new code, let through once */
    int guard_depth;     /* > 0 while guards run: their frames are not hooked */
} ThreadHook;

static void
thread_hook_dealloc(PyObject *op)
{
    ThreadHook *th = (ThreadHook *)op;
    if (PyThread_tss_get(&thread_key) == th) {
        PyThread_tss_set(&thread_key, NULL);
    }
    if (th->callback != Py_None && --active_threads == 0) {
        uninstall_hook();
    }
    Py_CLEAR(th->callback);
    PyObject_Free(op);
}

static PyTypeObject ThreadHook_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "framejit._C._ThreadHook",
    .tp_basicsize = sizeof(ThreadHook),
    .tp_dealloc = thread_hook_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "framejit's per-thread hook state (internal).",
};

static inline ThreadHook *
thread_hook_get(void)
{
    return (ThreadHook *)PyThread_tss_get(&thread_key);
}

/* The thread's state, created on first use. Borrowed; NULL with an exception on failure. */
static ThreadHook *
thread_hook_ensure(void)
{
    ThreadHook *th = thread_hook_get();
    if (th != NULL) {
        return th;
    }
    PyObject *dict = PyThreadState_GetDict();
    if (dict == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "framejit: this thread has no thread-state dict");
        return NULL;
    }
    th = PyObject_New(ThreadHook, &ThreadHook_Type);
    if (th == NULL) {
        return NULL;
    }
    th->callback = Py_NewRef(Py_None);
    th->skip_code = NULL;
    th->guard_depth = 0;
    /* Keyed by our type object: unique even when two copies of this module are loaded. */
    int failed = PyDict_SetItem(dict, (PyObject *)&ThreadHook_Type, (PyObject *)th);
    Py_DECREF(th); /* the thread-state dict owns it */
    if (failed) {
        return NULL;
    }
    if (PyThread_tss_set(&thread_key, th) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "framejit: cannot set thread-local storage");
        return NULL;
    }
    return th;
}

/* Make `callback` (a reference we give away) the thread's callback and return the previous one
 * (a reference the caller now owns).  Installs or removes the hook as the count of threads with
 * capture on moves between 0 and 1. Runs no Python code. */
static PyObject *
swap_callback(ThreadHook *th, PyObject *callback)
{
    PyObject *previous = th->callback;
    th->callback = callback;
    bool was_on = previous != Py_None, is_on = callback != Py_None;
    if (is_on && !was_on) {
        if (active_threads++ == 0) {
            install_hook();
        }
    }
    else if (was_on && !is_on) {
        if (--active_threads == 0) {
            uninstall_hook();
        }
    }
    return previous;
}

static int
check_callback(PyObject *callback)
{
    if (callback == Py_None || callback == Py_False || PyCallable_Check(callback)) {
        return 0;
    }
    PyErr_Format(PyExc_TypeError,
                 "framejit: the callback must be None, False or a callable, not %.100s",
                 Py_TYPE(callback)->tp_name);
    return -1;
}

/* ---- Per-code state in co_extra --------------------------------------------------------- */

typedef struct {
    PyObject *entries; /* list of (guard, new_code, owner, ...), or NULL */
    int mode;
} CodeState;

/* Called when the code object dies or its slot is overwritten; 3.11 also calls it for NULL. */
static void
code_state_free(void *ptr)
{
    CodeState *state = (CodeState *)ptr;
    if (state == NULL) {
        return;
    }
    Py_XDECREF(state->entries);
    PyMem_Free(state);
}

static inline CodeState *
code_state_peek(PyCodeObject *code)
{
    void *state = NULL;
    if (Code_GetExtra((PyObject *)code, code_extra_index, &state) < 0) {
        PyErr_Clear();
        return NULL;
    }
    return (CodeState *)state;
}

static CodeState *
code_state_ensure(PyCodeObject *code)
{
    CodeState *state = code_state_peek(code);
    if (state != NULL) {
        return state;
    }
    state = PyMem_Malloc(sizeof(CodeState));
    if (state == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    state->entries = NULL;
    state->mode = MODE_DEFAULT;
    if (Code_SetExtra((PyObject *)code, code_extra_index, state) < 0) {
        PyMem_Free(state);
        return NULL;
    }
    return state;
}

/* ---- Frame helpers ---------------------------------------------------------------------- */

/* Argument slots localsplus[0:n]: positional, keyword-only, *args, **kwargs. */
static inline int
argument_count(PyCodeObject *code)
{
    return code->co_argcount + code->co_kwonlyargcount + ((code->co_flags & CO_VARARGS) != 0) +
           ((code->co_flags & CO_VARKEYWORDS) != 0);
}

/* Clear and pop a frame that the hook received but never evaluated. */
static void
dispose_unrun_frame(PyThreadState *tstate, _PyInterpreterFrame *frame)
{
#if defined(FJ_PY311)
    /* _PyEval_Vector clears and pops it after the hook returns. */
    (void)tstate;
    (void)frame;
#elif defined(FJ_PY312)
    /* The callee pops on 3.12.  This mirrors clear_thread_frame() and _PyThreadState_PopFrame()
     * of 3.12 for a frame that never ran: no frame object, no started stack, not linked into
     * the frame chain, and still the topmost frame of the data stack. */
    assert(frame->frame_obj == NULL); /* only made for started frames */
    tstate->c_recursion_remaining--;
    for (int i = 0; i < frame->stacktop; i++) {
        Py_XDECREF(frame->localsplus[i]);
    }
    Py_XDECREF(frame->f_locals);
    Py_DECREF(frame->f_funcobj);
    Py_DECREF(frame->f_code);
    tstate->c_recursion_remaining++;

    PyObject **base = (PyObject **)frame;
    _PyStackChunk *chunk = tstate->datastack_chunk;
    if (base == &chunk->data[0]) {
        /* The frame opened this chunk: give the chunk back, as CPython does. */
        _PyStackChunk *previous = chunk->previous;
        PyObjectArenaAllocator arena;
        PyObject_GetArenaAllocator(&arena);
        tstate->datastack_top = &previous->data[previous->top];
        tstate->datastack_chunk = previous;
        tstate->datastack_limit = (PyObject **)(((char *)previous) + previous->size);
        arena.free(arena.ctx, chunk, chunk->size);
    }
    else {
        tstate->datastack_top = base;
    }
#else
    _PyEval_FrameClearAndPop(tstate, frame);
#endif
}

static PyObject *
dispose_and_fail(PyThreadState *tstate, _PyInterpreterFrame *frame)
{
    assert(PyErr_Occurred());
    dispose_unrun_frame(tstate, frame);
    return NULL;
}

/* Rewritten code must bind the same arguments and have the same cells and free variables. */
static int
check_compatible(PyCodeObject *old, PyCodeObject *new)
{
    const char *what = NULL;
    int have = 0, want = 0;
#define FJ_SAME(expr_old, expr_new, name)                                                      \
    if (what == NULL && (expr_old) != (expr_new)) {                                            \
        what = name;                                                                           \
        want = (expr_old);                                                                     \
        have = (expr_new);                                                                     \
    }
    FJ_SAME(old->co_argcount, new->co_argcount, "co_argcount");
    FJ_SAME(old->co_posonlyargcount, new->co_posonlyargcount, "co_posonlyargcount");
    FJ_SAME(old->co_kwonlyargcount, new->co_kwonlyargcount, "co_kwonlyargcount");
    FJ_SAME(old->co_flags & CO_VARARGS, new->co_flags & CO_VARARGS, "CO_VARARGS flag");
    FJ_SAME(old->co_flags & CO_VARKEYWORDS, new->co_flags & CO_VARKEYWORDS, "CO_VARKEYWORDS flag");
    FJ_SAME(old->co_ncellvars, new->co_ncellvars, "number of cell variables");
    FJ_SAME(old->co_nfreevars, new->co_nfreevars, "number of free variables");
#undef FJ_SAME
    if (what == NULL) {
        return 0;
    }
    PyErr_Format(PyExc_RuntimeError,
                 "framejit: the rewritten code for %U (%U:%d) cannot replace the original: "
                 "its %s is %d, the original's is %d. Rewritten code must keep the original's "
                 "arguments, cell variables and free variables.",
                 old->co_qualname, old->co_filename, old->co_firstlineno, what, have, want);
    return -1;
}

/* SWAP: re-point the unstarted frame at new_code if the new frame fits where the old one is.
 * Returns 1 when done (the frame now holds new_code), 0 when the CALL path must be used. */
static int
try_swap(PyThreadState *tstate, _PyInterpreterFrame *frame, PyCodeObject *old, PyCodeObject *new)
{
    /* A generator's frame would be sized from func->func_code (the old code) by
     * RETURN_GENERATOR; and a frame that pushed anything is not the fresh frame we know. */
    if (force_call || (new->co_flags & GENERATOR_FLAGS) || frame->stacktop != old->co_nlocalsplus) {
        return 0;
    }
    PyObject **base = (PyObject **)frame;
    Py_ssize_t old_words = FRAME_WORDS(old), new_words = FRAME_WORDS(new);
    bool topmost = base + old_words == tstate->datastack_top;
    if (new_words > old_words && (!topmost || new_words >= tstate->datastack_limit - base)) {
        return 0;
    }
    if (topmost) {
        tstate->datastack_top = base + new_words;
    }
    /* Slots past the arguments are NULL in a fresh frame; make the new ones NULL too. */
    for (int i = old->co_nlocalsplus; i < new->co_nlocalsplus; i++) {
        frame->localsplus[i] = NULL;
    }
    frame->stacktop = new->co_nlocalsplus;
    SET_FRAME_CODE(frame, new);
    Py_DECREF(old); /* the frame's reference; the function still holds the old code */
    return 1;
}

/* A function like the frame's, running new_code. */
static PyObject *
function_for_code(PyCodeObject *new_code, PyFunctionObject *orig)
{
    PyFunctionObject *fn = (PyFunctionObject *)PyFunction_NewWithQualName(
        (PyObject *)new_code, orig->func_globals, orig->func_qualname);
    if (fn == NULL) {
        return NULL;
    }
    Py_SETREF(fn->func_builtins, Py_NewRef(orig->func_builtins));
    Py_SETREF(fn->func_name, Py_NewRef(orig->func_name));
    if ((orig->func_defaults && PyFunction_SetDefaults((PyObject *)fn, orig->func_defaults) < 0) ||
        (orig->func_kwdefaults &&
         PyFunction_SetKwDefaults((PyObject *)fn, orig->func_kwdefaults) < 0) ||
        (orig->func_closure && PyFunction_SetClosure((PyObject *)fn, orig->func_closure) < 0)) {
        Py_DECREF(fn);
        return NULL;
    }
    return (PyObject *)fn;
}

#define SMALL_CALL_ARGS 16

/* CALL: call a function made from new_code with the frame's bound arguments, then dispose of
 * the original frame. */
static PyObject *
run_by_call(PyThreadState *tstate, _PyInterpreterFrame *frame, ThreadHook *th,
            PyCodeObject *new_code)
{
    PyObject *fn = function_for_code(new_code, FRAME_FUNC(frame));
    if (fn == NULL) {
        return dispose_and_fail(tstate, frame);
    }
    PyObject **slots = frame->localsplus;
    int argcount = new_code->co_argcount, kwonly = new_code->co_kwonlyargcount;
    int next = argcount + kwonly;
    PyObject *varargs = (new_code->co_flags & CO_VARARGS) ? slots[next++] : NULL;
    PyObject *varkw = (new_code->co_flags & CO_VARKEYWORDS) ? slots[next++] : NULL;
    Py_ssize_t nvarargs = varargs ? PyTuple_GET_SIZE(varargs) : 0;
    Py_ssize_t npos = argcount + nvarargs;
    Py_ssize_t nkw = kwonly + (varkw ? PyDict_GET_SIZE(varkw) : 0);

    PyObject *small[SMALL_CALL_ARGS];
    PyObject **stack = small;
    PyObject *kwnames = NULL;
    if (npos + nkw > SMALL_CALL_ARGS) {
        stack = PyMem_Malloc((npos + nkw) * sizeof(PyObject *));
        if (stack == NULL) {
            Py_DECREF(fn);
            PyErr_NoMemory();
            return dispose_and_fail(tstate, frame);
        }
    }
    /* Borrowed references: the frame keeps every argument alive until it is disposed of. */
    for (int i = 0; i < argcount; i++) {
        stack[i] = slots[i];
    }
    for (Py_ssize_t i = 0; i < nvarargs; i++) {
        stack[argcount + i] = PyTuple_GET_ITEM(varargs, i);
    }
    if (nkw > 0) {
        kwnames = PyTuple_New(nkw);
        if (kwnames == NULL) {
            goto fail;
        }
        Py_ssize_t k = 0;
        for (; k < kwonly; k++) {
            PyObject *name = PyTuple_GET_ITEM(new_code->co_localsplusnames, argcount + k);
            PyTuple_SET_ITEM(kwnames, k, Py_NewRef(name));
            stack[npos + k] = slots[argcount + k];
        }
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (varkw && PyDict_Next(varkw, &pos, &key, &value)) {
            PyTuple_SET_ITEM(kwnames, k, Py_NewRef(key));
            stack[npos + k] = value;
            k++;
        }
    }
    th->skip_code = (PyObject *)new_code;
    PyObject *result = PyObject_Vectorcall(fn, stack, npos, kwnames);
    th->skip_code = NULL;
    Py_XDECREF(kwnames);
    if (stack != small) {
        PyMem_Free(stack);
    }
    Py_DECREF(fn);
    dispose_unrun_frame(tstate, frame);
    return result;

fail:
    if (stack != small) {
        PyMem_Free(stack);
    }
    Py_DECREF(fn);
    return dispose_and_fail(tstate, frame);
}

/* Run new_code (a reference we own) for the frame, by SWAP when it fits, else by CALL. */
static PyObject *
run_new_code(PyThreadState *tstate, _PyInterpreterFrame *frame, ThreadHook *th,
             PyCodeObject *code, PyObject *new_code)
{
    if (!PyCode_Check(new_code)) {
        PyErr_Format(PyExc_TypeError,
                     "framejit: the new code for %U must be a code object, not %.100s",
                     code->co_qualname, Py_TYPE(new_code)->tp_name);
        Py_DECREF(new_code);
        return dispose_and_fail(tstate, frame);
    }
    PyCodeObject *new = (PyCodeObject *)new_code;
    if (check_compatible(code, new) < 0) {
        Py_DECREF(new_code);
        return dispose_and_fail(tstate, frame);
    }
    PyObject *result;
    if (try_swap(tstate, frame, code, new)) {
        stats.swap++;
        result = _PyEval_EvalFrameDefault(tstate, frame, 0);
    }
    else {
        stats.call++;
        result = run_by_call(tstate, frame, th, new);
    }
    Py_DECREF(new_code);
    return result;
}

/* Walk the cache entries; on a hit return the entry's new code (a new reference).  Returns
 * NULL without an exception on a miss, NULL with one for a malformed entry or a guard that
 * raised something other than an Exception. */
static PyObject *
lookup(ThreadHook *th, _PyInterpreterFrame *frame, int nargs, PyObject *entries,
       PyObject *callback)
{
    bool compare_owner = callback != Py_False;
    PyObject *found = NULL;
    /* Guards take the argument slots, then the function's closure cells (one per free
     * variable), so a guard can check what a closure sees. Borrowed references suffice. */
    PyObject *const *guard_args = frame->localsplus;
    Py_ssize_t guard_nargs = nargs;
    PyObject *small[16];
    PyObject **heap = NULL;
    PyObject *closure = FRAME_FUNC(frame)->func_closure;
    Py_ssize_t nfree = closure != NULL ? PyTuple_GET_SIZE(closure) : 0;
    if (nfree > 0) {
        Py_ssize_t total = nargs + nfree;
        PyObject **buf = small;
        if (total > (Py_ssize_t)(sizeof(small) / sizeof(small[0]))) {
            heap = PyMem_Malloc(total * sizeof(PyObject *));
            if (heap == NULL) {
                PyErr_NoMemory();
                return NULL;
            }
            buf = heap;
        }
        for (int i = 0; i < nargs; i++) {
            buf[i] = frame->localsplus[i];
        }
        for (Py_ssize_t i = 0; i < nfree; i++) {
            buf[nargs + i] = PyTuple_GET_ITEM(closure, i);
        }
        guard_args = buf;
        guard_nargs = total;
    }
    Py_INCREF(entries); /* a guard may clear the code's state */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(entries); i++) {
        PyObject *entry = PyList_GET_ITEM(entries, i);
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 3) {
            PyErr_Format(PyExc_TypeError,
                         "framejit: a cache entry must be a tuple (guard, new_code, owner, ...), "
                         "not %.100s",
                         Py_TYPE(entry)->tp_name);
            break;
        }
        PyObject *owner = PyTuple_GET_ITEM(entry, 2);
        if (compare_owner && owner != Py_None && owner != callback) {
            continue;
        }
        Py_INCREF(entry);
        th->guard_depth++;
        PyObject *verdict =
            PyObject_Vectorcall(PyTuple_GET_ITEM(entry, 0), guard_args, guard_nargs, NULL);
        th->guard_depth--;
        int ok = -1;
        if (verdict != NULL) {
            ok = verdict == Py_True ? 1 : verdict == Py_False ? 0 : PyObject_IsTrue(verdict);
            Py_DECREF(verdict);
        }
        if (ok < 0) {
            stats.guard_error++;
            /* A failing guard is a miss, but KeyboardInterrupt and SystemExit go through. */
            if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                Py_DECREF(entry);
                break;
            }
            PyErr_Clear();
            ok = 0;
        }
        if (ok) {
            found = Py_NewRef(PyTuple_GET_ITEM(entry, 1));
        }
        Py_DECREF(entry);
        if (found) {
            break;
        }
    }
    Py_DECREF(entries);
    PyMem_Free(heap);
    return found;
}

static PyObject *
argument_dict(PyCodeObject *code, _PyInterpreterFrame *frame, int nargs)
{
    PyObject *dict = PyDict_New();
    for (int i = 0; dict != NULL && i < nargs; i++) {
        PyObject *name = PyTuple_GET_ITEM(code->co_localsplusnames, i);
        if (PyDict_SetItem(dict, name, frame->localsplus[i]) < 0) {
            Py_CLEAR(dict);
        }
    }
    return dict;
}

/* The frame is a fresh function frame and this thread has a callback: cache, then compiler. */
static PyObject *
hooked_eval(PyThreadState *tstate, _PyInterpreterFrame *frame, ThreadHook *th,
            PyCodeObject *code)
{
    CodeState *state = code_state_peek(code);
    int mode = state ? state->mode : MODE_DEFAULT;
    if (mode == MODE_SKIP) {
        return _PyEval_EvalFrameDefault(tstate, frame, 0);
    }
    int nargs = argument_count(code);
    PyObject *callback = Py_NewRef(th->callback);
    if (state != NULL && state->entries != NULL && PyList_GET_SIZE(state->entries) > 0) {
        PyObject *new_code = lookup(th, frame, nargs, state->entries, callback);
        if (new_code != NULL) {
            stats.hit++;
            Py_DECREF(callback);
            return run_new_code(tstate, frame, th, code, new_code);
        }
        if (PyErr_Occurred()) {
            Py_DECREF(callback);
            return dispose_and_fail(tstate, frame);
        }
    }
    stats.miss++;
    if (callback == Py_False || mode == MODE_RUN_ONLY) {
        Py_DECREF(callback);
        return _PyEval_EvalFrameDefault(tstate, frame, 0);
    }

    PyObject *f_locals = argument_dict(code, frame, nargs);
    if (f_locals == NULL) {
        Py_DECREF(callback);
        return dispose_and_fail(tstate, frame);
    }
    /* Nothing is hooked while the compiler runs. */
    Py_INCREF(th);
    PyObject *previous = swap_callback(th, Py_NewRef(Py_None));
    stats.callback++;
    PyObject *args[3] = {(PyObject *)code, (PyObject *)FRAME_FUNC(frame), f_locals};
    PyObject *result = PyObject_Vectorcall(callback, args, 3, NULL);
    Py_DECREF(swap_callback(th, previous));
    Py_DECREF(f_locals);
    Py_DECREF(callback);
    if (result == NULL) {
        Py_DECREF(th);
        return dispose_and_fail(tstate, frame);
    }
    if (result == Py_None) {
        Py_DECREF(result);
        Py_DECREF(th);
        return _PyEval_EvalFrameDefault(tstate, frame, 0);
    }
    PyObject *value = run_new_code(tstate, frame, th, code, result);
    Py_DECREF(th);
    return value;
}

static PyObject *
fj_eval_frame(PyThreadState *tstate, _PyInterpreterFrame *frame, int throwflag)
{
    ThreadHook *th;
    /* Cheapest tests first: most frames of most threads pass straight through. */
    if (throwflag || (th = thread_hook_get()) == NULL || th->callback == Py_None ||
        th->guard_depth > 0 || frame->owner != FRAME_OWNED_BY_THREAD) {
        return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
    }
    PyCodeObject *code = FRAME_CODE(frame);
    if ((PyObject *)code == th->skip_code) {
        th->skip_code = NULL; /* the CALL path's own call of the new code */
        return _PyEval_EvalFrameDefault(tstate, frame, 0);
    }
    /* Inside trace/profile functions; module, class and exec bodies (they have f_locals);
     * frames already running; generators and coroutines: all run as they are. */
    if (tstate->tracing > 0 || frame->f_locals != NULL || FRAME_STARTED(frame) ||
        (code->co_flags & GENERATOR_FLAGS)) {
        return _PyEval_EvalFrameDefault(tstate, frame, 0);
    }
    return hooked_eval(tstate, frame, th, code);
}

/* ---- CompiledFunction ------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *fn;
    PyObject *callback;
    PyObject *dict;
    PyObject *weakreflist;
    vectorcallfunc vectorcall;
} CompiledFunction;

static PyObject *
compiled_function_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames)
{
    CompiledFunction *self = (CompiledFunction *)op;
    ThreadHook *th = thread_hook_ensure();
    if (th == NULL) {
        return NULL;
    }
    Py_INCREF(th);
    PyObject *previous = swap_callback(th, Py_NewRef(self->callback));
    PyObject *result = PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    Py_DECREF(swap_callback(th, previous));
    Py_DECREF(th);
    return result;
}

static PyObject *
compiled_function_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"fn", "callback", NULL};
    PyObject *fn, *callback;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:CompiledFunction", kwlist, &fn,
                                     &callback)) {
        return NULL;
    }
    if (!PyCallable_Check(fn)) {
        PyErr_Format(PyExc_TypeError, "CompiledFunction: fn must be callable, not %.100s",
                     Py_TYPE(fn)->tp_name);
        return NULL;
    }
    if (check_callback(callback) < 0) {
        return NULL;
    }
    CompiledFunction *self = (CompiledFunction *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->fn = Py_NewRef(fn);
    self->callback = Py_NewRef(callback);
    self->vectorcall = compiled_function_vectorcall;
    return (PyObject *)self;
}

static int
compiled_function_traverse(CompiledFunction *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fn);
    Py_VISIT(self->callback);
    Py_VISIT(self->dict);
    return 0;
}

static int
compiled_function_clear(CompiledFunction *self)
{
    Py_CLEAR(self->fn);
    Py_CLEAR(self->callback);
    Py_CLEAR(self->dict);
    return 0;
}

static void
compiled_function_dealloc(CompiledFunction *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    compiled_function_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Bind like a plain function: instance.attr gives a bound method. */
static PyObject *
compiled_function_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static PyObject *
compiled_function_repr(CompiledFunction *self)
{
    return PyUnicode_FromFormat("<framejit CompiledFunction of %R>", self->fn);
}

static PyMemberDef compiled_function_members[] = {
    {"fn", T_OBJECT, offsetof(CompiledFunction, fn), READONLY, "the wrapped callable"},
    {"callback", T_OBJECT, offsetof(CompiledFunction, callback), READONLY,
     "the callback set for the thread during each call"},
    {NULL},
};

static PyGetSetDef compiled_function_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict},
    {NULL},
};

static PyTypeObject CompiledFunction_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "framejit._C.CompiledFunction",
    .tp_basicsize = sizeof(CompiledFunction),
    .tp_dealloc = (destructor)compiled_function_dealloc,
    .tp_vectorcall_offset = offsetof(CompiledFunction, vectorcall),
    .tp_repr = (reprfunc)compiled_function_repr,
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE |
                Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "CompiledFunction(fn, callback)\n--\n\n"
              "Call fn with the thread's frame callback set to callback, restoring the\n"
              "previous callback afterwards (also when fn raises). Binds like a function.",
    .tp_traverse = (traverseproc)compiled_function_traverse,
    .tp_clear = (inquiry)compiled_function_clear,
    .tp_weaklistoffset = offsetof(CompiledFunction, weakreflist),
    .tp_members = compiled_function_members,
    .tp_getset = compiled_function_getset,
    .tp_descr_get = compiled_function_get,
    .tp_dictoffset = offsetof(CompiledFunction, dict),
    .tp_new = compiled_function_new,
};

/* ---- Module functions ------------------------------------------------------------------- */

static PyObject *
set_eval_frame(PyObject *module, PyObject *callback)
{
    if (check_callback(callback) < 0) {
        return NULL;
    }
    ThreadHook *th = thread_hook_ensure();
    if (th == NULL) {
        return NULL;
    }
    return swap_callback(th, Py_NewRef(callback));
}

static PyObject *
get_eval_frame(PyObject *module, PyObject *unused)
{
    ThreadHook *th = thread_hook_get();
    return Py_NewRef(th ? th->callback : Py_None);
}

static PyCodeObject *
as_code(PyObject *obj)
{
    if (!PyCode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "expected a code object, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return (PyCodeObject *)obj;
}

static PyObject *
get_cache_entries(PyObject *module, PyObject *arg)
{
    PyCodeObject *code = as_code(arg);
    CodeState *state = code ? code_state_ensure(code) : NULL;
    if (state == NULL) {
        return NULL;
    }
    if (state->entries == NULL && (state->entries = PyList_New(0)) == NULL) {
        return NULL;
    }
    return Py_NewRef(state->entries);
}

static PyObject *
set_code_mode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_code_mode(code, mode) takes 2 arguments");
        return NULL;
    }
    PyCodeObject *code = as_code(args[0]);
    if (code == NULL) {
        return NULL;
    }
    long mode = PyLong_AsLong(args[1]);
    if (mode == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (mode != MODE_DEFAULT && mode != MODE_SKIP && mode != MODE_RUN_ONLY) {
        PyErr_Format(PyExc_ValueError,
                     "mode must be MODE_DEFAULT (0), MODE_SKIP (1) or MODE_RUN_ONLY (2), not %ld",
                     mode);
        return NULL;
    }
    CodeState *state = code_state_ensure(code);
    if (state == NULL) {
        return NULL;
    }
    state->mode = (int)mode;
    Py_RETURN_NONE;
}

static PyObject *
get_code_mode(PyObject *module, PyObject *arg)
{
    PyCodeObject *code = as_code(arg);
    if (code == NULL) {
        return NULL;
    }
    CodeState *state = code_state_peek(code);
    return PyLong_FromLong(state ? state->mode : MODE_DEFAULT);
}

static PyObject *
clear_code(PyObject *module, PyObject *arg)
{
    PyCodeObject *code = as_code(arg);
    if (code == NULL) {
        return NULL;
    }
    CodeState *state = code_state_peek(code);
    if (state != NULL) {
        /* Detach the list first: dropping it can run arbitrary code, which must not find a
         * half-freed state. */
        PyObject *entries = state->entries;
        state->entries = NULL;
        int failed = Code_SetExtra((PyObject *)code, code_extra_index, NULL);
        Py_XDECREF(entries);
        if (failed) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

static PyObject *
get_stats(PyObject *module, PyObject *unused)
{
    return Py_BuildValue("{sKsKsKsKsKsK}", "swap", stats.swap, "call", stats.call, "callback",
                         stats.callback, "hit", stats.hit, "miss", stats.miss, "guard_error",
                         stats.guard_error);
}

static PyObject *
reset_stats(PyObject *module, PyObject *unused)
{
    memset(&stats, 0, sizeof(stats));
    Py_RETURN_NONE;
}

static PyObject *
set_force_call(PyObject *module, PyObject *arg)
{
    int value = PyObject_IsTrue(arg);
    if (value < 0) {
        return NULL;
    }
    bool previous = force_call;
    force_call = value;
    return PyBool_FromLong(previous);
}

static PyObject *
hook_installed(PyObject *module, PyObject *unused)
{
    return PyBool_FromLong(_PyInterpreterState_GetEvalFrameFunc(hook_interp) == fj_eval_frame);
}

static PyObject *
get_active_threads(PyObject *module, PyObject *unused)
{
    return PyLong_FromSsize_t(active_threads);
}

/* For leak tests: (number of data-stack chunks, words used in the top chunk). */
static PyObject *
datastack_info(PyObject *module, PyObject *unused)
{
    PyThreadState *tstate = PyThreadState_Get();
    Py_ssize_t chunks = 0;
    for (_PyStackChunk *c = tstate->datastack_chunk; c != NULL; c = c->previous) {
        chunks++;
    }
    Py_ssize_t used =
        tstate->datastack_chunk ? tstate->datastack_top - &tstate->datastack_chunk->data[0] : 0;
    return Py_BuildValue("nn", chunks, used);
}

static PyMethodDef module_methods[] = {
    {"set_eval_frame", set_eval_frame, METH_O,
     "set_eval_frame(callback) -> previous\n\nSet this thread's callback: None (off), False "
     "(run cached code only) or a callable callback(code, func, f_locals) -> code or None."},
    {"get_eval_frame", get_eval_frame, METH_NOARGS, "This thread's callback."},
    {"get_cache_entries", get_cache_entries, METH_O,
     "get_cache_entries(code) -> list\n\nThe live list of (guard, new_code, owner, ...) "
     "entries of code, created on demand."},
    {"set_code_mode", (PyCFunction)(void (*)(void))set_code_mode, METH_FASTCALL,
     "set_code_mode(code, mode): MODE_DEFAULT, MODE_SKIP or MODE_RUN_ONLY."},
    {"get_code_mode", get_code_mode, METH_O, "get_code_mode(code) -> int"},
    {"clear_code", clear_code, METH_O, "clear_code(code): drop the entries and mode of code."},
    {"stats", get_stats, METH_NOARGS, "Counters of the hook's decisions (a new dict)."},
    {"reset_stats", reset_stats, METH_NOARGS, "Zero the counters."},
    {"set_force_call", set_force_call, METH_O,
     "set_force_call(flag) -> previous\n\nRun every hit through the CALL path (for tests)."},
    {"hook_installed", hook_installed, METH_NOARGS,
     "Whether framejit's eval-frame hook is the interpreter's eval function now."},
    {"active_threads", get_active_threads, METH_NOARGS,
     "Number of threads whose callback is not None."},
    {"datastack_info", datastack_info, METH_NOARGS,
     "(chunks, words used in the top chunk) of this thread's frame data stack (for tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "framejit._C",
    .m_doc = "framejit's PEP 523 frame-evaluation hook and per-code cache.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__C(void)
{
    if (code_extra_index < 0) {
        hook_interp = PyInterpreterState_Get();
        if (PyThread_tss_create(&thread_key) != 0) {
            PyErr_SetString(PyExc_ImportError, "framejit._C: cannot create thread-local storage");
            return NULL;
        }
        code_extra_index = RequestCodeExtraIndex(code_state_free);
        if (code_extra_index < 0) {
            PyErr_SetString(PyExc_ImportError, "framejit._C: no code-object extra slot is free");
            return NULL;
        }
        if (PyType_Ready(&ThreadHook_Type) < 0 ||
            PyType_Ready(&CompiledFunction_Type) < 0) {
            return NULL;
        }
    }
    else if (PyInterpreterState_Get() != hook_interp) {
        PyErr_SetString(PyExc_ImportError,
                        "framejit._C can be used in one interpreter of a process only");
        return NULL;
    }
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "MODE_DEFAULT", MODE_DEFAULT) < 0 ||
        PyModule_AddIntConstant(module, "MODE_SKIP", MODE_SKIP) < 0 ||
        PyModule_AddIntConstant(module, "MODE_RUN_ONLY", MODE_RUN_ONLY) < 0 ||
        PyModule_AddObjectRef(module, "CompiledFunction", (PyObject *)&CompiledFunction_Type) <
            0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
