/* The peak of NumPy's array data in this process, counted by a NumPy memory handler
 * (PyDataMem_SetHandler, NumPy >= 1.22): every data buffer NumPy allocates while the handler is
 * installed passes through it, and the count costs a few atomic operations per allocation,
 * where tracemalloc traces every Python object too and slows Python-heavy loops severalfold.
 *
 * Each buffer carries its size in a 16-byte header in front of it (realloc is not told the
 * old size), so the data stays 16-byte aligned as malloc's.  Buffers allocated before start()
 * keep the handler they were made with (NumPy stores it on the array) and are not counted.
 *
 *   start()       install the handler (this context) and zero the counts
 *   reset_peak()  peak := current
 *   peak(), current()   bytes of counted buffers
 *   stop()        restore the handler that was installed before start()
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define NPY_TARGET_VERSION NPY_1_22_API_VERSION  /* PyDataMem_SetHandler */
#include <numpy/arrayobject.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define HEADER 16

static int64_t current_bytes, peak_bytes;

static void count(int64_t delta) {
    int64_t now = __atomic_add_fetch(&current_bytes, delta, __ATOMIC_RELAXED);
    int64_t peak = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
    while (now > peak &&
           !__atomic_compare_exchange_n(&peak_bytes, &peak, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

static void *wrap(char *raw, size_t size) {
    if (raw == NULL) return NULL;
    memcpy(raw, &size, sizeof size);
    count((int64_t)size);
    return raw + HEADER;
}

static void *hc_malloc(void *ctx, size_t size) {
    (void)ctx;
    if (size > SIZE_MAX - HEADER) return NULL;
    return wrap(malloc(size + HEADER), size);
}

static void *hc_calloc(void *ctx, size_t nelem, size_t elsize) {
    (void)ctx;
    if (elsize != 0 && nelem > (SIZE_MAX - HEADER) / elsize) return NULL;
    size_t size = nelem * elsize;
    return wrap(calloc(1, size + HEADER), size);
}

static void hc_free(void *ctx, void *ptr, size_t size_hint) {
    (void)ctx;
    (void)size_hint;
    if (ptr == NULL) return;
    char *raw = (char *)ptr - HEADER;
    size_t size;
    memcpy(&size, raw, sizeof size);
    count(-(int64_t)size);
    free(raw);
}

static void *hc_realloc(void *ctx, void *ptr, size_t new_size) {
    if (ptr == NULL) return hc_malloc(ctx, new_size);
    if (new_size > SIZE_MAX - HEADER) return NULL;
    char *raw = (char *)ptr - HEADER;
    size_t old;
    memcpy(&old, raw, sizeof old);
    char *moved = realloc(raw, new_size + HEADER);
    if (moved == NULL) return NULL;  /* the old buffer stays valid and counted */
    memcpy(moved, &new_size, sizeof new_size);
    count((int64_t)new_size - (int64_t)old);
    return moved + HEADER;
}

static PyDataMem_Handler handler = {
    "hpccoll_eigensolver_counting", 1,
    {NULL, hc_malloc, hc_calloc, hc_realloc, hc_free},
};

static PyObject *previous = NULL;  /* the handler start() replaced */

static PyObject *npmem_start(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    if (previous != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_npmem.start: already started: call stop() first");
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(&handler, "mem_handler", NULL);
    if (capsule == NULL) return NULL;
    __atomic_store_n(&current_bytes, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&peak_bytes, 0, __ATOMIC_RELAXED);
    previous = PyDataMem_SetHandler(capsule);
    Py_DECREF(capsule);
    if (previous == NULL) return NULL;
    Py_RETURN_NONE;
}

static PyObject *npmem_stop(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    if (previous == NULL) Py_RETURN_NONE;
    PyObject *ours = PyDataMem_SetHandler(previous);
    Py_CLEAR(previous);
    if (ours == NULL) return NULL;
    Py_DECREF(ours);
    Py_RETURN_NONE;
}

static PyObject *npmem_reset_peak(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    __atomic_store_n(&peak_bytes, __atomic_load_n(&current_bytes, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
    Py_RETURN_NONE;
}

static PyObject *npmem_peak(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLongLong(__atomic_load_n(&peak_bytes, __ATOMIC_RELAXED));
}

static PyObject *npmem_current(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLongLong(__atomic_load_n(&current_bytes, __ATOMIC_RELAXED));
}

static PyMethodDef methods[] = {
    {"start", npmem_start, METH_NOARGS, "Count NumPy's data buffers from now on (this context)."},
    {"stop", npmem_stop, METH_NOARGS, "Restore the handler installed before start()."},
    {"reset_peak", npmem_reset_peak, METH_NOARGS, "Set the peak to the current count."},
    {"peak", npmem_peak, METH_NOARGS, "Peak bytes of counted buffers since start() or reset_peak()."},
    {"current", npmem_current, METH_NOARGS, "Bytes of counted buffers alive now."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_npmem", NULL, -1, methods};

PyMODINIT_FUNC PyInit__npmem(void) {
    import_array();
    return PyModule_Create(&module);
}
