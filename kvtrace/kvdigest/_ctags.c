/* kvtrace.kvdigest._ctags: the digest's tags (kvtrace.kvdigest._pytags, byte for byte) in one
 * call each.
 *
 * Why C: P checks an offer inside vLLM's scheduler hook and D makes its digest inside
 * request_finished.  In Python both are 40-60 small operations (binding, packing, a keyed hash per
 * tag), each well under a microsecond but together several; here they are one call.  The tags are
 * keyed BLAKE2b-128 (RFC 7693) truncated to 4 bytes, over exactly the bytes _pytags feeds hashlib:
 * tests/kvdigest compares both on random inputs, and both with hashlib.
 *
 * keyed(key) -> state: BLAKE2b-128 keyed with ``key`` (<= 64 bytes) after its key block, which is
 * compressed up front (every message here is non-empty: the binding has two NUL bytes at least).
 * tags_v1(state, engine_id, request_id, block_ids, tokens, n, chunk, last_only) -> bytes
 * tags_v2(state, engine_id, request_id, block_ids, block_hashes, tokens, n, hbs, chunk, last_only) -> bytes
 * check(state, offer, tokens, limit, engine_id, request_id, block_ids, block_hashes, blocks) -> (code, verified):
 *   P's whole check of an offer's digest object, parse included (kvtrace.kvdigest._pytags.check).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "blake2b.h"
#include "strict_b64.h"

#define STATE_BYTES (8 * 8 + 8)
#define MIN_CHUNK 16 /* kvtrace.kvdigest._pytags: an offer's chunk outside is unverifiable */
#define MAX_CHUNK 65536
#define MAX_TOKENS (1L << 24)

static int load_state(PyObject *state, b2b *s) {
    char *p;
    Py_ssize_t n;
    if (!PyBytes_Check(state) || PyBytes_AsStringAndSize(state, &p, &n) < 0 || n != STATE_BYTES) {
        PyErr_SetString(PyExc_TypeError, "state must come from keyed()");
        return -1;
    }
    memcpy(s->h, p, 64);
    memcpy(&s->t, p + 64, 8);
    s->c = 0;
    return 0;
}

static PyObject *keyed(PyObject *self, PyObject *arg) {
    Py_buffer key;
    if (PyObject_GetBuffer(arg, &key, PyBUF_SIMPLE) < 0)
        return NULL;
    if (key.len < 1 || key.len > 64) {
        PyBuffer_Release(&key);
        PyErr_SetString(PyExc_ValueError, "key must be 1 to 64 bytes");
        return NULL;
    }
    b2b s;
    memcpy(s.h, IV, sizeof IV);
    s.h[0] ^= 0x01010000ULL ^ ((uint64_t)key.len << 8) ^ DIGEST_BYTES;
    memset(s.b, 0, 128);
    memcpy(s.b, key.buf, (size_t)key.len);
    PyBuffer_Release(&key);
    s.t = 128;
    compress(&s, 0);
    char out[STATE_BYTES];
    memcpy(out, s.h, 64);
    memcpy(out + 64, &s.t, 8);
    return PyBytes_FromStringAndSize(out, STATE_BYTES);
}

/* f"{obj}".encode() */
static int absorb_text(b2b *s, PyObject *obj) {
    PyObject *text = PyObject_Format(obj, NULL);
    if (text == NULL)
        return -1;
    Py_ssize_t n;
    const char *p = PyUnicode_Check(text) ? PyUnicode_AsUTF8AndSize(text, &n) : NULL;
    if (p == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "__format__ must return str");
        Py_DECREF(text);
        return -1;
    }
    update(s, (const uint8_t *)p, (size_t)n);
    Py_DECREF(text);
    return 0;
}

/* items[lo:hi] as native uint32 (array("I")'s bytes) or int64 (array("q")'s), through a
 * buffer on the stack. */
static int absorb_ints(b2b *s, PyObject *const *items, Py_ssize_t lo, Py_ssize_t hi, int wide) {
    uint8_t buf[2048];
    size_t used = 0, size = wide ? 8 : 4;
    for (Py_ssize_t i = lo; i < hi; i++) {
        PyObject *item = items[i];
        if (!PyLong_Check(item)) {
            PyErr_Format(PyExc_TypeError, "an integer is required, not %.100s", Py_TYPE(item)->tp_name);
            return -1;
        }
        if (wide) {
            long long v = PyLong_AsLongLong(item);
            if (v == -1 && PyErr_Occurred())
                return -1;
            int64_t w = (int64_t)v;
            memcpy(buf + used, &w, 8);
        } else {
            unsigned long v = PyLong_AsUnsignedLong(item);
            if (v == (unsigned long)-1 && PyErr_Occurred())
                return -1;
            if (v > 0xFFFFFFFFUL) {
                PyErr_SetString(PyExc_OverflowError, "token id does not fit in 32 bits");
                return -1;
            }
            uint32_t w = (uint32_t)v;
            memcpy(buf + used, &w, 4);
        }
        used += size;
        if (used == sizeof buf) {
            update(s, buf, used);
            used = 0;
        }
    }
    update(s, buf, used);
    return 0;
}

/* A list or tuple (borrowed, as is) or a new list of seq[lo:hi] (vLLM's ConstantList); the items
 * wanted are then fast[*lo:*hi]. */
static PyObject *as_fast(PyObject *seq, Py_ssize_t *lo, Py_ssize_t *hi) {
    if (PyList_Check(seq) || PyTuple_Check(seq)) {
        if (*hi > PySequence_Fast_GET_SIZE(seq)) {
            PyErr_SetString(PyExc_ValueError, "fewer tokens than asked for");
            return NULL;
        }
        Py_INCREF(seq);
        return seq;
    }
    PyObject *part = PySequence_GetSlice(seq, *lo, *hi);
    if (part == NULL)
        return NULL;
    PyObject *fast = PySequence_Fast(part, "tokens must be a sequence");
    Py_DECREF(part);
    if (fast == NULL)
        return NULL;
    if (PySequence_Fast_GET_SIZE(fast) != *hi - *lo) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "fewer tokens than asked for");
        return NULL;
    }
    *hi -= *lo;
    *lo = 0;
    return fast;
}

static int absorb_group(b2b *s, PyObject *group) {
    PyObject *fast = PySequence_Fast(group, "block ids must be a sequence");
    if (fast == NULL)
        return -1;
    int rc = absorb_ints(s, PySequence_Fast_ITEMS(fast), 0, PySequence_Fast_GET_SIZE(fast), 1);
    Py_DECREF(fast);
    if (rc == 0)
        update(s, (const uint8_t *)"\xff", 1);
    return rc;
}

/* The binding: f"{engine_id}\x00{request_id}\x00", then per KV-cache group its block ids as int64
 * and 0xff (a flat list is one group; empty or None: none). */
static int absorb_binding(b2b *s, PyObject *engine_id, PyObject *request_id, PyObject *block_ids) {
    if (absorb_text(s, engine_id) < 0)
        return -1;
    update(s, (const uint8_t *)"", 1);
    if (absorb_text(s, request_id) < 0)
        return -1;
    update(s, (const uint8_t *)"", 1);
    int truth = PyObject_IsTrue(block_ids);
    if (truth <= 0)
        return truth;
    PyObject *first = PySequence_GetItem(block_ids, 0);
    if (first == NULL)
        return -1;
    int nested = PyList_Check(first) || PyTuple_Check(first);
    Py_DECREF(first);
    if (!nested)
        return absorb_group(s, block_ids);
    PyObject *groups = PySequence_Fast(block_ids, "block ids must be a sequence");
    if (groups == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(groups); i++) {
        if (absorb_group(s, PySequence_Fast_GET_ITEM(groups, i)) < 0) {
            Py_DECREF(groups);
            return -1;
        }
    }
    Py_DECREF(groups);
    return 0;
}

static int absorb_buffer(b2b *s, PyObject *obj) {
    if (PyBytes_Check(obj)) {
        update(s, (const uint8_t *)PyBytes_AS_STRING(obj), (size_t)PyBytes_GET_SIZE(obj));
        return 0;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0)
        return -1;
    update(s, (const uint8_t *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return 0;
}

static Py_ssize_t tag_count(Py_ssize_t n, Py_ssize_t chunk, int last_only) {
    return n == 0 ? 0 : last_only ? 1 : n / chunk + (n % chunk ? 1 : 0);
}

/* v1: the tags of tokens[0:n] (``fast``: their list or tuple) after the binding ``s`` (consumed). */
static int v1_tags(b2b *s, PyObject *tokens, Py_ssize_t n, Py_ssize_t chunk, int last_only, uint8_t *out) {
    Py_ssize_t lo = 0, hi = n, pos = 0;
    PyObject *fast = as_fast(tokens, &lo, &hi);
    if (fast == NULL)
        return -1;
    PyObject *const *items = PySequence_Fast_ITEMS(fast);
    int rc = 0;
    if (!last_only) {
        for (Py_ssize_t b = chunk; b < n && rc == 0; b += chunk, out += TAG_BYTES) {
            rc = absorb_ints(s, items, lo + pos, lo + b, 0);
            pos = b;
            final_tag(s, out);
        }
    }
    if (n && rc == 0 && (rc = absorb_ints(s, items, lo + pos, lo + n, 0)) == 0)
        final_tag(s, out);
    Py_DECREF(fast);
    return rc;
}

static int absorb_block_hash(b2b *s, PyObject *hashes, Py_ssize_t index) {
    if (index >= PySequence_Fast_GET_SIZE(hashes)) {
        PyErr_SetString(PyExc_IndexError, "block hashes do not cover the tokens");
        return -1;
    }
    return absorb_buffer(s, PySequence_Fast_GET_ITEM(hashes, index));
}

/* v2: the tags of n tokens over their block hashes (a list or tuple, ``hashes``) after the binding
 * ``s`` (consumed): at a chunk boundary the block hash before it, at n also the tokens after it. */
static int v2_tags(b2b *s, PyObject *hashes, PyObject *tokens, Py_ssize_t n, Py_ssize_t hbs, Py_ssize_t chunk,
                   int last_only, uint8_t *out) {
    if (!last_only) {
        for (Py_ssize_t b = chunk; b < n; b += chunk, out += TAG_BYTES) {
            b2b t = *s;
            if (absorb_block_hash(&t, hashes, b / hbs - 1) < 0)
                return -1;
            final_tag(&t, out);
        }
    }
    if (n == 0)
        return 0;
    Py_ssize_t full = n / hbs;
    if (full && absorb_block_hash(s, hashes, full - 1) < 0)
        return -1;
    if (n > full * hbs) {
        Py_ssize_t lo = full * hbs, hi = n;
        PyObject *fast = as_fast(tokens, &lo, &hi);
        if (fast == NULL)
            return -1;
        int rc = absorb_ints(s, PySequence_Fast_ITEMS(fast), lo, hi, 0);
        Py_DECREF(fast);
        if (rc < 0)
            return -1;
    }
    final_tag(s, out);
    return 0;
}

static int check_sizes(Py_ssize_t n, Py_ssize_t hbs, Py_ssize_t chunk) {
    if (PyErr_Occurred())
        return -1;
    if (n < 0 || hbs <= 0 || chunk < hbs || chunk % hbs) {
        PyErr_SetString(PyExc_ValueError, "n must be >= 0 and chunk a positive multiple of hbs");
        return -1;
    }
    return 0;
}

static PyObject *tags_v1(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "tags_v1 takes 8 arguments");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[5]), chunk = PyLong_AsSsize_t(args[6]);
    int last_only = PyObject_IsTrue(args[7]);
    b2b s;
    if (last_only < 0 || check_sizes(n, 1, chunk) < 0 || load_state(args[0], &s) < 0 ||
        absorb_binding(&s, args[1], args[2], args[3]) < 0)
        return NULL;
    PyObject *tags = PyBytes_FromStringAndSize(NULL, tag_count(n, chunk, last_only) * TAG_BYTES);
    if (tags != NULL && v1_tags(&s, args[4], n, chunk, last_only, (uint8_t *)PyBytes_AS_STRING(tags)) < 0)
        Py_CLEAR(tags);
    return tags;
}

static PyObject *tags_v2(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "tags_v2 takes 10 arguments");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[6]), hbs = PyLong_AsSsize_t(args[7]), chunk = PyLong_AsSsize_t(args[8]);
    int last_only = PyObject_IsTrue(args[9]);
    b2b s;
    if (last_only < 0 || check_sizes(n, hbs, chunk) < 0 || load_state(args[0], &s) < 0 ||
        absorb_binding(&s, args[1], args[2], args[3]) < 0)
        return NULL;
    PyObject *hashes = PySequence_Fast(args[4], "block hashes must be a sequence");
    if (hashes == NULL)
        return NULL;
    PyObject *tags = PyBytes_FromStringAndSize(NULL, tag_count(n, chunk, last_only) * TAG_BYTES);
    if (tags != NULL && v2_tags(&s, hashes, args[5], n, hbs, chunk, last_only, (uint8_t *)PyBytes_AS_STRING(tags)) < 0)
        Py_CLEAR(tags);
    Py_DECREF(hashes);
    return tags;
}

/* ------------------------------------------------------------------ P's check of an offer */

/* The digest object's keys, from kvtrace.semconv (set_keys): version, chunk, n, tags, fp. */
enum { K_VERSION, K_CHUNK, K_TOKENS, K_TAGS, K_FP, N_KEYS };
static PyObject *KEYS[N_KEYS];

static PyObject *set_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != N_KEYS) {
        PyErr_SetString(PyExc_TypeError, "set_keys takes the 5 keys of a digest object");
        return NULL;
    }
    for (int i = 0; i < N_KEYS; i++) {
        if (!PyUnicode_CheckExact(args[i])) {
            PyErr_SetString(PyExc_TypeError, "digest keys are str");
            return NULL;
        }
    }
    for (int i = 0; i < N_KEYS; i++) {
        Py_INCREF(args[i]);
        Py_XSETREF(KEYS[i], args[i]);
    }
    Py_RETURN_NONE;
}

/* obj[key] when it is exactly an int in [lo, hi] (0), else 1 (the offer is malformed). */
static int exact_int(PyObject *obj, PyObject *key, long lo, long hi, long *value) {
    PyObject *item = PyDict_GetItemWithError(obj, key);
    if (item == NULL && PyErr_Occurred())
        return -1;
    if (item == NULL || !PyLong_CheckExact(item))
        return 1;
    int overflow;
    *value = PyLong_AsLongAndOverflow(item, &overflow);
    if (*value == -1 && PyErr_Occurred())
        return -1;
    return overflow || *value < lo || *value > hi;
}

/* The offer's version, chunk, n, decoded tags (a new reference) and fp (borrowed, may be NULL):
 * 0, or 1 when it is malformed (kvtrace.kvdigest._pytags.parse), -1 on an error. */
static int parse_offer(PyObject *obj, long *version, long *chunk, long *n, PyObject **raw, PyObject **fp) {
    int rc;
    if (KEYS[K_FP] == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "set_keys() was not called");
        return -1;
    }
    if (!PyDict_Check(obj))
        return 1;
    if ((rc = exact_int(obj, KEYS[K_VERSION], 1, 2, version)) != 0 ||
        (rc = exact_int(obj, KEYS[K_CHUNK], MIN_CHUNK, MAX_CHUNK, chunk)) != 0 ||
        (rc = exact_int(obj, KEYS[K_TOKENS], 0, MAX_TOKENS, n)) != 0)
        return rc;
    PyObject *text = PyDict_GetItemWithError(obj, KEYS[K_TAGS]);
    if (text == NULL || !PyUnicode_Check(text))
        return PyErr_Occurred() ? -1 : 1;
    if ((rc = strict_b64(text, raw)) != 0)
        return rc;
    if (PyBytes_GET_SIZE(*raw) != TAG_BYTES * tag_count(*n, *chunk, 0)) {
        Py_CLEAR(*raw);
        return 1;
    }
    *fp = PyDict_GetItemWithError(obj, KEYS[K_FP]);
    if (*fp == NULL && PyErr_Occurred()) {
        Py_CLEAR(*raw);
        return -1;
    }
    return 0;
}

static int long_attr(PyObject *obj, const char *name, long *value) {
    PyObject *attr = PyObject_GetAttrString(obj, name);
    if (attr == NULL)
        return -1;
    *value = PyLong_AsLong(attr);
    Py_DECREF(attr);
    return *value == -1 && PyErr_Occurred() ? -1 : 0;
}

/* v2: P's block-hash configuration ``blocks`` (a kvtrace.kvdigest.BlockConfig) is the offer's
 * (fingerprint and chunk): 0 and its hash_block_size in *hbs, 1 when not (unverifiable), -1. */
static int own_config(PyObject *blocks, PyObject *fp, long chunk, long *hbs) {
    PyObject *mine = PyObject_GetAttrString(blocks, "fingerprint");
    if (mine == NULL)
        return -1;
    int same = PyObject_RichCompareBool(fp != NULL ? fp : Py_None, mine, Py_EQ);
    Py_DECREF(mine);
    long own_chunk;
    if (same <= 0)
        return same < 0 ? -1 : 1;
    if (long_attr(blocks, "chunk", &own_chunk) < 0 || long_attr(blocks, "hash_block_size", hbs) < 0)
        return -1;
    return own_chunk != chunk || *hbs <= 0 || chunk % *hbs;
}

/* P's tags up to ``last`` after the binding (one at ``last`` with last_only), into ``out``. */
static int own_tags(const b2b *bound, long version, PyObject *hashes, PyObject *tokens, Py_ssize_t last, long hbs,
                    long chunk, int last_only, uint8_t *out) {
    b2b s = *bound;
    return version == 2 ? v2_tags(&s, hashes, tokens, last, hbs, chunk, last_only, out)
                        : v1_tags(&s, tokens, last, chunk, last_only, out);
}

/* The prompt's tokens proven equal: the boundary before P's first tag up to ``last`` that differs
 * from the offer's ``theirs`` (only on a mismatch: the tag at ``last`` already differs).  -1 on an error. */
static Py_ssize_t walk(const b2b *bound, long version, PyObject *hashes, PyObject *tokens, Py_ssize_t last, long hbs,
                       long chunk, const uint8_t *theirs) {
    Py_ssize_t count = tag_count(last, chunk, 0), verified = 0;
    uint8_t *mine = PyMem_Malloc((size_t)count * TAG_BYTES);
    if (mine == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (own_tags(bound, version, hashes, tokens, last, hbs, chunk, 0, mine) < 0) {
        PyMem_Free(mine);
        return -1;
    }
    for (Py_ssize_t j = 0; j < count && memcmp(mine + j * TAG_BYTES, theirs + j * TAG_BYTES, TAG_BYTES) == 0; j++)
        verified = (j + 1) * chunk < last ? (j + 1) * chunk : last;
    PyMem_Free(mine);
    return verified;
}

/* min(int(limit), n, len(tokens)), then the last boundary P can check: the limit when it is D's
 * length, else the chunk boundary at or below it.  -1 with an exception set on an error. */
static int last_boundary(PyObject *limit_obj, PyObject *tokens, long n, long chunk, Py_ssize_t *last) {
    PyObject *as_int = PyNumber_Long(limit_obj);
    if (as_int == NULL)
        return -1;
    Py_ssize_t limit = PyLong_AsSsize_t(as_int), have = PyObject_Length(tokens);
    Py_DECREF(as_int);
    if ((limit == -1 || have == -1) && PyErr_Occurred())
        return -1;
    limit = limit < n ? limit : n;
    limit = limit < have ? limit : have;
    *last = limit == n ? limit : limit - ((limit % chunk) + chunk) % chunk;
    return 0;
}

/* check(state, offer, tokens, limit, engine_id, request_id, block_ids, block_hashes, blocks)
 * -> (code, verified): code 0 unverifiable, 1 match, 2 mismatch (kvtrace.kvdigest._pytags.check) */
static PyObject *check(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "check takes 9 arguments");
        return NULL;
    }
    PyObject *tokens = args[2], *hashes_obj = args[7], *blocks = args[8], *raw = NULL, *fp, *hashes = NULL;
    long version, chunk, n, hbs = 1;
    int code = 0, rc = parse_offer(args[1], &version, &chunk, &n, &raw, &fp);
    Py_ssize_t last, verified = 0;
    if (rc != 0)
        return rc < 0 ? NULL : Py_BuildValue("(in)", 0, (Py_ssize_t)0);
    if (version == 2 && (blocks == Py_None || hashes_obj == Py_None || (rc = own_config(blocks, fp, chunk, &hbs)) != 0))
        goto done; /* unverifiable, unless rc < 0 */
    if ((rc = last_boundary(args[3], tokens, n, chunk, &last)) < 0)
        goto done;
    if (last <= 0) {
        code = 1;
        goto done;
    }
    if (version == 2) {
        if ((hashes = PySequence_Fast(hashes_obj, "block hashes must be a sequence")) == NULL) {
            rc = -1;
            goto done;
        }
        if (PySequence_Fast_GET_SIZE(hashes) < last / hbs)
            goto done;
    }
    b2b bound;
    uint8_t tag[TAG_BYTES];
    const uint8_t *theirs = (const uint8_t *)PyBytes_AS_STRING(raw);
    if ((rc = load_state(args[0], &bound)) < 0 || (rc = absorb_binding(&bound, args[4], args[5], args[6])) < 0 ||
        (rc = own_tags(&bound, version, hashes, tokens, last, hbs, chunk, 1, tag)) < 0)
        goto done;
    if (memcmp(tag, theirs + (last - 1) / chunk * TAG_BYTES, TAG_BYTES) == 0) {
        code = 1; /* the tag at the limit proves every earlier boundary */
        verified = last;
    } else if ((verified = walk(&bound, version, hashes, tokens, last, hbs, chunk, theirs)) < 0) {
        rc = -1;
    } else {
        code = 2;
    }
done:
    Py_XDECREF(raw);
    Py_XDECREF(hashes);
    return rc < 0 ? NULL : Py_BuildValue("(in)", code, verified);
}

static PyMethodDef methods[] = {
    {"keyed", keyed, METH_O, "keyed(key) -> state: BLAKE2b-128 keyed with key, its key block compressed."},
    {"tags_v1", (PyCFunction)(void (*)(void))tags_v1, METH_FASTCALL,
     "tags_v1(state, engine_id, request_id, block_ids, tokens, n, chunk, last_only) -> bytes"},
    {"tags_v2", (PyCFunction)(void (*)(void))tags_v2, METH_FASTCALL,
     "tags_v2(state, engine_id, request_id, block_ids, block_hashes, tokens, n, hbs, chunk, last_only) -> bytes"},
    {"set_keys", (PyCFunction)(void (*)(void))set_keys, METH_FASTCALL,
     "set_keys(version, chunk, n, tags, fp): the digest object's keys (kvtrace.semconv)."},
    {"check", (PyCFunction)(void (*)(void))check, METH_FASTCALL,
     "check(state, offer, tokens, limit, engine_id, request_id, block_ids, block_hashes, blocks) -> (code, verified)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvtrace.kvdigest._ctags",
    "kvtrace.kvdigest's tags in C (the same bytes as kvtrace.kvdigest._pytags).", -1, methods,
};

PyMODINIT_FUNC PyInit__ctags(void) { return PyModule_Create(&module); }
