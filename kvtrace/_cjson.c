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

static unsigned char kind[256]; /* 1: a digit, 2: '[' or '{' */

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
    Py_ssize_t digits = 0, brackets = 0, n = view.len;
    int safe = run > 0 && limit > 0; /* an empty run is in any data; no count is below 0 */
    for (Py_ssize_t i = 0; safe && i < n; i++) {
        unsigned char k = kind[p[i]];
        if (k == 1) {
            if (++digits >= run) {
                safe = 0;
                break;
            }
        } else {
            digits = 0;
            if (k == 2 && ++brackets >= limit) {
                safe = 0;
                break;
            }
        }
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

PyMODINIT_FUNC PyInit__cjson(void) {
    for (int c = '0'; c <= '9'; c++) kind[c] = 1;
    kind['['] = kind['{'] = 2;
    return PyModule_Create(&module);
}
