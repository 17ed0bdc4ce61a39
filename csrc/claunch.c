/* framejit._claunch: call a generated C kernel with tensors, without ctypes.
 *
 * A kernel rendered by framejit/kernels/c_render.py is `void f(char **bufs, int64_t nthreads)`.
 * launch(address, nthreads, *tensors) fills `bufs` with the tensors' data pointers (storage
 * offset included) and calls it. The data pointer comes from torch's own C helper when
 * set_data_ptr_fn(address) was given one (torch._C._dynamo.guards
 * ._torchinductor_pyobject_tensor_data_ptr, what Inductor's generated bindings use), otherwise
 * from tensor.data_ptr(). This module is separate from framejit._C so that the frame hook never
 * depends on it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef void (*kernel_fn)(char **bufs, int64_t nthreads);

#define MAX_BUFFERS 512

static void *(*tensor_data_ptr)(PyObject *) = NULL;

static PyObject *
set_data_ptr_fn(PyObject *self, PyObject *arg)
{
    void *p = PyLong_AsVoidPtr(arg);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    tensor_data_ptr = (void *(*)(PyObject *))p;
    Py_RETURN_NONE;
}

static PyObject *
launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    char *bufs[MAX_BUFFERS];
    if (nargs < 2 || nargs - 2 > MAX_BUFFERS) {
        PyErr_SetString(PyExc_TypeError,
                        "launch(address, nthreads, *tensors): wrong number of arguments");
        return NULL;
    }
    kernel_fn fn = (kernel_fn)PyLong_AsVoidPtr(args[0]);
    if (fn == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "launch: null kernel address");
        return NULL;
    }
    int64_t nthreads = PyLong_AsLongLong(args[1]);
    if (nthreads == -1 && PyErr_Occurred())
        return NULL;
    for (Py_ssize_t i = 2; i < nargs; i++) {
        if (tensor_data_ptr != NULL) {
            bufs[i - 2] = (char *)tensor_data_ptr(args[i]);
            continue;
        }
        PyObject *ptr = PyObject_CallMethod(args[i], "data_ptr", NULL);
        if (ptr == NULL)
            return NULL;
        bufs[i - 2] = (char *)PyLong_AsVoidPtr(ptr);
        Py_DECREF(ptr);
        if (PyErr_Occurred())
            return NULL;
    }
    fn(bufs, nthreads);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(address, nthreads, *tensors): call a generated C kernel."},
    {"set_data_ptr_fn", set_data_ptr_fn, METH_O,
     "set_data_ptr_fn(address): the C function giving a tensor's data pointer (0: none)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "framejit._claunch",
    "Calls generated C kernels (framejit.kernels.c_runtime).", -1, methods,
};

PyMODINIT_FUNC
PyInit__claunch(void)
{
    return PyModule_Create(&module_def);
}
