/* kvtrace._cjson: kvtrace.jsoncodec's pre-check of a body before orjson reads it, in one pass.
 *
 * Why C: orjson reads a body several times faster than json, but the check that it reads it as json
 * does (no integer literal orjson would turn into a float, no nesting deeper than json can follow)
 * was three passes in Python (bytes.translate, a search, two bytes.count), several times the parse
 * itself (docs/benchmarks.md).  Here it is one pass over the bytes.
 *
 * orjson_safe(data, run, limit) -> bool: data holds no run of ``run`` ASCII digits and fewer than
 * ``limit`` '[' and '{' in all (kvtrace.jsoncodec._py_orjson_safe's answer; tests/test_jsoncodec.py
 * compares both).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static int is_digit(unsigned char c) { return (unsigned)(c - '0') < 10; }

/* 1 if p[0:n] holds a run of at least `run` (> 0) digits.  Any such run covers one of the bytes
 * run - 1, 2 run - 1, ...: only those are looked at, and the run around one that is a digit measured
 * (a chat body is mostly text: about one byte in `run` is read). */
static int has_digit_run(const unsigned char *p, Py_ssize_t n, Py_ssize_t run) {
    if (run > n) return 0; /* (and i += run cannot overflow) */
    for (Py_ssize_t i = run - 1; i < n; i += run) {
        if (!is_digit(p[i])) continue;
        Py_ssize_t a = i, b = i + 1;
        while (a > 0 && b - a < run && is_digit(p[a - 1])) a--;
        while (b < n && b - a < run && is_digit(p[b])) b++;
        if (b - a >= run) return 1;
    }
    return 0;
}

/* How many bytes c p[0:n] holds, counting no further than cap (memchr: the C library's vector search). */
static Py_ssize_t count_upto(const unsigned char *p, Py_ssize_t n, unsigned char c, Py_ssize_t cap) {
    const unsigned char *end = p + n;
    Py_ssize_t k = 0;
    while (k < cap && p < end && (p = memchr(p, c, (size_t)(end - p))) != NULL) {
        k++;
        p++;
    }
    return k;
}

static PyObject *orjson_safe(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "orjson_safe(data, run, limit)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t run = PyLong_AsSsize_t(args[1]), limit = PyLong_AsSsize_t(args[2]);
    if ((run == -1 || limit == -1) && PyErr_Occurred()) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const unsigned char *p = view.buf;
    Py_ssize_t n = view.len;
    int safe = run > 0 && limit > 0; /* an empty run is in any data; no count is below 0 */
    if (safe) {
        Py_ssize_t brackets = count_upto(p, n, '[', limit);
        brackets += count_upto(p, n, '{', limit - brackets);
        safe = brackets < limit && !has_digit_run(p, n, run);
    }
    PyBuffer_Release(&view);
    return PyBool_FromLong(safe);
}

static PyMethodDef methods[] = {
    {"orjson_safe", (PyCFunction)(void (*)(void))orjson_safe, METH_FASTCALL,
     "orjson_safe(data, run, limit) -> bool: no run of `run` digits, fewer than `limit` brackets"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvtrace._cjson", "kvtrace.jsoncodec's pre-check of a body, in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__cjson(void) { return PyModule_Create(&module); }
