/* kvtrace.sim._ctok: the simulator's stand-in tokenizer (kvtrace.sim.tokenizer.encode, id for id)
 * in one call.
 *
 * Why C: the simulated workers tokenise every new chat message, and in a fleet replay that was the
 * largest single cost of the model (a regex split and a dict lookup per token in Python; the numbers
 * are in docs/benchmarks.md).  Here it is one pass over the text's UTF-8.
 *
 * encode(text) -> list[int]: the pieces of kvtrace.sim.tokenizer._PIECE (re.findall of
 *   <\|[a-z_]+\|>|[^\s<]+\s*|<\s*|\s+ , which covers the whole text), each piece's id
 *   zlib.crc32(piece.encode()) % 100000.  \s is what Python's re matches in a str pattern:
 *   Py_UNICODE_ISSPACE.  A text that is not valid UTF-8 (a lone surrogate) raises
 *   UnicodeEncodeError, as piece.encode() does.  tests/sim/test_ctok.py compares both on random texts.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define VOCAB_SIZE 100000u /* kvtrace.sim.tokenizer.VOCAB_SIZE */

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

static inline uint32_t crc32_of(const unsigned char *p, Py_ssize_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (Py_ssize_t i = 0; i < n; i++)
        c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* The code point at s[*i] (valid UTF-8: Python made it), *i moved past it. */
static inline Py_UCS4 next_cp(const unsigned char *s, Py_ssize_t *i) {
    unsigned char b = s[*i];
    if (b < 0x80) {
        *i += 1;
        return b;
    }
    if (b < 0xE0) {
        Py_UCS4 c = ((Py_UCS4)(b & 0x1F) << 6) | (s[*i + 1] & 0x3F);
        *i += 2;
        return c;
    }
    if (b < 0xF0) {
        Py_UCS4 c = ((Py_UCS4)(b & 0x0F) << 12) | ((Py_UCS4)(s[*i + 1] & 0x3F) << 6) | (s[*i + 2] & 0x3F);
        *i += 3;
        return c;
    }
    Py_UCS4 c = ((Py_UCS4)(b & 0x07) << 18) | ((Py_UCS4)(s[*i + 1] & 0x3F) << 12) |
                ((Py_UCS4)(s[*i + 2] & 0x3F) << 6) | (s[*i + 3] & 0x3F);
    *i += 4;
    return c;
}

/* Py_UNICODE_ISSPACE evaluates its argument twice: never give it a call. */
static inline int is_space(Py_UCS4 c) { return Py_UNICODE_ISSPACE(c); }

/* Past the whitespace run starting at byte i. */
static inline Py_ssize_t skip_space(const unsigned char *s, Py_ssize_t n, Py_ssize_t i) {
    while (i < n) {
        Py_ssize_t j = i;
        if (!is_space(next_cp(s, &j)))
            break;
        i = j;
    }
    return i;
}

/* End of a special token <|[a-z_]+|> at byte i (s[i] == '<'), or -1. */
static inline Py_ssize_t special_end(const unsigned char *s, Py_ssize_t n, Py_ssize_t i) {
    if (i + 1 >= n || s[i + 1] != '|')
        return -1;
    Py_ssize_t j = i + 2;
    while (j < n && ((s[j] >= 'a' && s[j] <= 'z') || s[j] == '_'))
        j++;
    if (j == i + 2 || j + 1 >= n || s[j] != '|' || s[j + 1] != '>')
        return -1;
    return j + 2;
}

/* One int object per id, made on first use and kept: a prompt's ids are references to these rather
 * than an allocation each (the tokenizer's memo holds millions of ids, freed as it evicts). */
static PyObject *id_objects[VOCAB_SIZE];

static PyObject *id_object(unsigned long id) {
    PyObject *o = id_objects[id];
    if (o == NULL) {
        o = PyLong_FromUnsignedLong(id);
        if (o == NULL)
            return NULL;
        id_objects[id] = o; /* the table's reference, for the process's life */
    }
    Py_INCREF(o);
    return o;
}

static PyObject *encode(PyObject *self, PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "encode() needs a str");
        return NULL;
    }
    Py_ssize_t n;
    const unsigned char *s = (const unsigned char *)PyUnicode_AsUTF8AndSize(text, &n);
    if (s == NULL)
        return NULL; /* a lone surrogate: UnicodeEncodeError, as str.encode() */
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    Py_ssize_t i = 0;
    while (i < n) {
        Py_ssize_t start = i, end;
        if (s[i] == '<') {
            end = special_end(s, n, i);
            if (end < 0)
                end = skip_space(s, n, i + 1);
        } else {
            Py_ssize_t j = i;
            Py_UCS4 c = next_cp(s, &j);
            if (is_space(c)) {
                end = skip_space(s, n, j);
            } else {
                while (j < n && s[j] != '<') {
                    Py_ssize_t k = j;
                    if (is_space(next_cp(s, &k)))
                        break;
                    j = k;
                }
                end = skip_space(s, n, j);
            }
        }
        PyObject *id = id_object(crc32_of(s + start, end - start) % VOCAB_SIZE);
        if (id == NULL || PyList_Append(out, id) < 0) {
            Py_XDECREF(id);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(id);
        i = end;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"encode", encode, METH_O, "encode(text) -> list[int]: kvtrace.sim.tokenizer.encode's ids."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvtrace.sim._ctok",
    "kvtrace.sim.tokenizer's encode in C (the same ids as its regex and zlib.crc32).", -1, methods,
};

PyMODINIT_FUNC PyInit__ctok(void) {
    crc_init();
    return PyModule_Create(&module);
}
