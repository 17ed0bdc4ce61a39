/* framejit._claunch: call a generated C kernel with tensors and sizes, without ctypes.
 *
 * A kernel rendered by framejit/kernels/c_render.py is
 * `void f(char **bufs, int64_t nthreads, const int64_t *sizes)`.
 * launch(address, nthreads, *tensors, *sizes) fills `bufs` with the tensors' data pointers
 * (storage offset included) and `sizes` with the Python ints (the kernel's run-time sizes, in
 * order; none for a static kernel), then calls it. The data pointer comes from torch's own C
 * helper when set_data_ptr_fn(address, tensor_type) was given one
 * (torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr, what Inductor's generated
 * bindings use; it trusts its argument to be a tensor, so each argument is checked against
 * `tensor_type` first), otherwise from tensor.data_ptr(). This module is separate from
 * framejit._C so that the frame hook never depends on it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef void (*kernel_fn)(char **bufs, int64_t nthreads, const int64_t *sizes);

#define MAX_BUFFERS 512
#define MAX_SIZES 64

static void *(*tensor_data_ptr)(PyObject *) = NULL;
static PyTypeObject *tensor_type = NULL;  /* a strong reference while tensor_data_ptr is set */

static PyObject *
set_data_ptr_fn(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2 || (nargs == 2 && !PyType_Check(args[1]))) {
        PyErr_SetString(PyExc_TypeError,
                        "set_data_ptr_fn(address, tensor_type): an int and a type");
        return NULL;
    }
    void *p = PyLong_AsVoidPtr(args[0]);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    if (p != NULL && nargs < 2) {
        PyErr_SetString(PyExc_TypeError,
                        "set_data_ptr_fn(address, tensor_type): the tensor type is needed");
        return NULL;
    }
    PyTypeObject *type = p == NULL ? NULL : (PyTypeObject *)args[1];
    Py_XINCREF(type);
    Py_XSETREF(tensor_type, type);
    tensor_data_ptr = (void *(*)(PyObject *))p;
    Py_RETURN_NONE;
}

static PyObject *
launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    char *bufs[MAX_BUFFERS];
    int64_t sizes[MAX_SIZES];
    Py_ssize_t nbufs = 0, nsizes = 0;
    if (nargs < 2) {
        PyErr_SetString(PyExc_TypeError,
                        "launch(address, nthreads, *tensors, *sizes): wrong number of arguments");
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
        PyObject *arg = args[i];
        if (PyLong_Check(arg)) {  /* a run-time size (a tensor is never an int) */
            if (nsizes == MAX_SIZES) {
                PyErr_SetString(PyExc_TypeError, "launch: too many sizes");
                return NULL;
            }
            int64_t value = PyLong_AsLongLong(arg);
            if (value == -1 && PyErr_Occurred())
                return NULL;
            sizes[nsizes++] = value;
            continue;
        }
        if (nbufs == MAX_BUFFERS) {
            PyErr_SetString(PyExc_TypeError, "launch: too many tensors");
            return NULL;
        }
        if (tensor_data_ptr != NULL) {
            if (!PyObject_TypeCheck(arg, tensor_type)) {
                PyErr_Format(PyExc_TypeError, "launch: argument %zd is a %.200s, not a tensor "
                             "or an int", i, Py_TYPE(arg)->tp_name);
                return NULL;
            }
            bufs[nbufs++] = (char *)tensor_data_ptr(arg);
            continue;
        }
        PyObject *ptr = PyObject_CallMethod(arg, "data_ptr", NULL);
        if (ptr == NULL)
            return NULL;
        bufs[nbufs++] = (char *)PyLong_AsVoidPtr(ptr);
        Py_DECREF(ptr);
        if (PyErr_Occurred())
            return NULL;
    }
    fn(bufs, nthreads, sizes);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(address, nthreads, *tensors, *sizes): call a generated C kernel."},
    {"set_data_ptr_fn", (PyCFunction)(void (*)(void))set_data_ptr_fn, METH_FASTCALL,
     "set_data_ptr_fn(address, tensor_type): the C function giving the data pointer of a "
     "tensor of type tensor_type (address 0: none, tensor.data_ptr() is called)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "framejit._claunch",
    "Calls generated C kernels (framejit.kernels.c_runtime).", -1, methods,
};

PyMODINIT_FUNC
PyInit__claunch(void)
{
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    /* The calling convention above; framejit.kernels.c_runtime.CLAUNCH_ABI must agree, and it
     * ignores a build with another one (a stale .so). */
    if (PyModule_AddIntConstant(module, "ABI_VERSION", 2) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
