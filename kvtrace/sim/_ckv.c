/* kvtrace.sim._ckv: the simulated worker's paged KV cache (kvtrace.sim.kvcache.PyKVCache, step for
 * step) and its chained block hashes, in C.
 *
 * Why C: every request walks its blocks several times (hashes, prefix lookup, allocation with
 * eviction, commit, free), a Python step per 16-token block; in a fleet replay that bookkeeping was
 * the model's largest cost after the tokenizer.  The rules are PyKVCache's, and so are the results:
 * the same block ids in the same order, the same evictions, the same errors (tests/sim/test_kvcache.py
 * runs every test on both, and random operation sequences compare them).
 *
 * KVCache(capacity, block_size): blocks 0..capacity-1, a reference count each, a content hash (a
 * 64-bit int, as block_hashes makes them; PyKVCache takes any hashable), the prefix cache (hash ->
 * block id), a free stack (pops 0, 1, 2, ... first), and the unreferenced cached blocks in
 * least-recently-freed order (a linked list).
 *
 * The prefix cache is an open-addressing table in C arrays (linear probing, at most half full,
 * backward-shift deletion), not a dict: a dict of Python ints cost a lookup two cache misses (the key
 * object compared, the block id object returned) on tables of a D's whole pool, and lookup, commit and
 * eviction together were 7 % of a fleet replay's CPU (docs/benchmarks.md).
 * block_hashes(tokens, block_size, parent=0) -> list: hash((parent, block)) chained over the full
 * blocks of ``tokens`` (any iterable), Python's own tuple hash of the same tuples.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *NoSpace; /* kvtrace.sim.kvcache.NoSpace, given by set_errors() */

typedef struct {
    PyObject_HEAD Py_ssize_t capacity, block_size, nfree, nlru, evictions;
    int32_t *ref, *free_stack, *prev, *next; /* prev/next: the LRU list; -1 ends it */
    char *in_lru;
    char *hashed; /* 1: the block has a hash, hkey[b] (then the table maps it to the block) */
    int64_t *hkey;
    struct slot {
        int64_t key;
        int32_t block; /* -1: an empty slot */
    } *slots; /* the table; a probe reads one slot's key and block from one cache line */
    Py_ssize_t ncached;
    uint64_t mask;
    int shift; /* a key's home slot: the top bits of key * a 64-bit odd constant */
    int32_t head, tail; /* oldest, newest of the LRU list */
} Pool;

static uint64_t home(const Pool *p, int64_t key) {
    return ((uint64_t)key * 0x9E3779B97F4A7C15ULL) >> p->shift;
}

/* The slot holding key, or the empty slot where it would go. */
static uint64_t probe(const Pool *p, int64_t key) {
    uint64_t i = home(p, key);
    while (p->slots[i].block >= 0 && p->slots[i].key != key) i = (i + 1) & p->mask;
    return i;
}

/* Empty slot i, moving back the entries after it that probed past it (no tombstones). */
static void table_delete(Pool *p, uint64_t i) {
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & p->mask;
        if (p->slots[j].block < 0) break;
        uint64_t k = home(p, p->slots[j].key);
        /* the entry at j may move to i unless its home lies cyclically in (i, j] */
        if (i <= j ? (k <= i || k > j) : (k <= i && k > j)) {
            p->slots[i] = p->slots[j];
            i = j;
        }
    }
    p->slots[i].block = -1;
}

/* A hash from an int object (-1 with an exception set, or a value with none). */
static int key_of(PyObject *o, int64_t *out) {
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = (int64_t)v;
    return 0;
}

/* A table of a D's whole pool outgrows the CPU's caches, and a request's hashes are known before
 * they are probed: the slot AHEAD hashes on is asked for while this one is probed. */
#define AHEAD 8

static void prefetch(const Pool *p, PyObject *o) {
#if defined(__GNUC__) || defined(__clang__)
    int64_t key;
    if (key_of(o, &key) < 0) {
        PyErr_Clear(); /* raised when its own turn comes */
        return;
    }
    __builtin_prefetch(&p->slots[home(p, key)]);
#else
    (void)p;
    (void)o;
#endif
}

/* The slot of block b's hash, asked for (an eviction AHEAD blocks on in the LRU list). */
static void prefetch_block(const Pool *p, int32_t b) {
#if defined(__GNUC__) || defined(__clang__)
    if (p->hashed[b]) __builtin_prefetch(&p->slots[home(p, p->hkey[b])]);
#else
    (void)p;
    (void)b;
#endif
}

static void lru_remove(Pool *p, int32_t b) {
    int32_t a = p->prev[b], c = p->next[b];
    if (a >= 0) p->next[a] = c; else p->head = c;
    if (c >= 0) p->prev[c] = a; else p->tail = a;
    p->in_lru[b] = 0;
    p->nlru--;
}

static void lru_append(Pool *p, int32_t b) {
    p->prev[b] = p->tail;
    p->next[b] = -1;
    if (p->tail >= 0) p->next[p->tail] = b; else p->head = b;
    p->tail = b;
    p->in_lru[b] = 1;
    p->nlru++;
}

/* 1 if block b's hash maps to b in the prefix cache, 0 if not.  A block has a hash only while the
 * prefix cache maps that hash to it: commit() gives one only with the mapping, and only uncache()
 * removes a mapping, with its block's hash.  So no table lookup (PyKVCache's is_cached asks its dict:
 * tests/sim/test_kvcache.py compares both on random operations). */
static int cached_here(Pool *p, int32_t b) { return p->hashed[b]; }

static void uncache(Pool *p, int32_t b) {
    if (!cached_here(p, b)) return;
    table_delete(p, probe(p, p->hkey[b]));
    p->hashed[b] = 0;
    p->ncached--;
}

/* A block id from an int object, checked against the pool. */
static int block_of(Pool *p, PyObject *o, int32_t *out) {
    Py_ssize_t v = PyLong_AsSsize_t(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0) v += p->capacity; /* a list index, as PyKVCache's lists take it */
    if (v < 0 || v >= p->capacity) {
        PyErr_SetString(PyExc_IndexError, "list index out of range");
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

static int Pool_init(Pool *p, PyObject *args, PyObject *kw) {
    static char *names[] = {"capacity", "block_size", NULL};
    Py_ssize_t cap, bs;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "nn", names, &cap, &bs)) return -1;
    if (cap <= 0 || bs <= 0) {
        PyErr_SetString(PyExc_ValueError, "capacity and block_size must be positive");
        return -1;
    }
    if (cap > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "capacity too large");
        return -1;
    }
    if (p->ref != NULL) {
        PyErr_SetString(PyExc_TypeError, "KVCache is initialised once");
        return -1;
    }
    p->capacity = cap;
    p->block_size = bs;
    p->ref = PyMem_Calloc(cap, sizeof(int32_t));
    p->free_stack = PyMem_Calloc(cap, sizeof(int32_t));
    p->prev = PyMem_Calloc(cap, sizeof(int32_t));
    p->next = PyMem_Calloc(cap, sizeof(int32_t));
    p->in_lru = PyMem_Calloc(cap, 1);
    p->hashed = PyMem_Calloc(cap, 1);
    p->hkey = PyMem_Calloc(cap, sizeof(int64_t));
    int bits = 1;
    while (((Py_ssize_t)1 << bits) < 2 * cap) bits++; /* at most half full: every block hashed */
    p->mask = ((uint64_t)1 << bits) - 1;
    p->shift = 64 - bits;
    p->slots = PyMem_Malloc((p->mask + 1) * sizeof(struct slot));
    if (!p->ref || !p->free_stack || !p->prev || !p->next || !p->in_lru || !p->hashed || !p->hkey || !p->slots) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t i = 0; i <= p->mask; i++) p->slots[i].block = -1;
    for (Py_ssize_t i = 0; i < cap; i++) p->free_stack[i] = (int32_t)(cap - 1 - i);
    p->nfree = cap;
    p->head = p->tail = -1;
    return 0;
}

static void Pool_dealloc(Pool *p) {
    PyMem_Free(p->ref);
    PyMem_Free(p->free_stack);
    PyMem_Free(p->prev);
    PyMem_Free(p->next);
    PyMem_Free(p->in_lru);
    PyMem_Free(p->hashed);
    PyMem_Free(p->hkey);
    PyMem_Free(p->slots);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyObject *Pool_lookup(Pool *p, PyObject *args) {
    PyObject *hashes;
    Py_ssize_t ntok;
    if (!PyArg_ParseTuple(args, "On", &hashes, &ntok)) return NULL;
    PyObject *seq = PySequence_Fast(hashes, "hashes must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), cap = ntok - 1 < 0 ? 0 : (ntok - 1) / p->block_size;
    /* Python's floor division: (ntok - 1) // bs for ntok == 0 is -1, capped at 0 by max() */
    Py_ssize_t limit = n < cap ? n : cap;
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; i < AHEAD && i < limit; i++) prefetch(p, PySequence_Fast_GET_ITEM(seq, i));
    for (Py_ssize_t i = 0; out != NULL && i < limit; i++) {
        int64_t key;
        if (i + AHEAD < limit) prefetch(p, PySequence_Fast_GET_ITEM(seq, i + AHEAD));
        if (key_of(PySequence_Fast_GET_ITEM(seq, i), &key) < 0) {
            Py_CLEAR(out);
            break;
        }
        int32_t b = p->slots[probe(p, key)].block;
        if (b < 0) break;
        PyObject *bid = PyLong_FromLong(b);
        if (bid == NULL || PyList_Append(out, bid) < 0) Py_CLEAR(out);
        Py_XDECREF(bid);
    }
    Py_DECREF(seq);
    return out;
}

/* step(p, b) for each block id of ids, in order: 0, or -1 with an exception set (then it stops). */
typedef int (*block_step)(Pool *p, int32_t b);

static PyObject *each_block(Pool *p, PyObject *ids, block_step step) {
    PyObject *seq = PySequence_Fast(ids, "block ids must be a sequence");
    if (seq == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        int32_t b;
        if (block_of(p, PySequence_Fast_GET_ITEM(seq, i), &b) < 0 || step(p, b) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

static int touch_one(Pool *p, int32_t b) {
    if (p->ref[b] == 0 && p->in_lru[b]) lru_remove(p, b);
    p->ref[b]++;
    return 0;
}

static PyObject *Pool_touch(Pool *p, PyObject *ids) { return each_block(p, ids, touch_one); }

static PyObject *Pool_allocate(Pool *p, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t avail = p->nfree + p->nlru;
    if (n > avail) {
        PyErr_Format(NoSpace, "need %zd blocks, %zd free or evictable of %zd", n, avail, p->capacity);
        return NULL;
    }
    PyObject *out = PyList_New(n < 0 ? 0 : n);
    if (out == NULL) return NULL;
    int32_t ahead = -2; /* the LRU block AHEAD evictions on (-2: no eviction yet, -1: the list's end) */
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t b;
        if (p->nfree > 0) {
            b = p->free_stack[--p->nfree];
        } else {
            if (ahead == -2) {
                ahead = p->head;
                for (int k = 0; k < AHEAD && ahead >= 0; k++, ahead = p->next[ahead]) prefetch_block(p, ahead);
            } else if (ahead >= 0) {
                prefetch_block(p, ahead);
                ahead = p->next[ahead];
            }
            b = p->head;
            lru_remove(p, b);
            uncache(p, b);
            p->evictions++;
        }
        p->ref[b] = 1;
        PyObject *o = PyLong_FromLong(b);
        if (o == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, o);
    }
    return out;
}

static PyObject *Pool_commit(Pool *p, PyObject *args) {
    PyObject *ids, *hashes;
    if (!PyArg_ParseTuple(args, "OO", &ids, &hashes)) return NULL;
    PyObject *a = PySequence_Fast(ids, "block ids must be a sequence");
    if (a == NULL) return NULL;
    PyObject *h = PySequence_Fast(hashes, "hashes must be a sequence");
    if (h == NULL) {
        Py_DECREF(a);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(a), m = PySequence_Fast_GET_SIZE(h), i;
    for (i = 0; i < AHEAD && i < m; i++) prefetch(p, PySequence_Fast_GET_ITEM(h, i));
    for (i = 0; i < n && i < m; i++) {
        int32_t b;
        if (i + AHEAD < m) prefetch(p, PySequence_Fast_GET_ITEM(h, i + AHEAD));
        if (block_of(p, PySequence_Fast_GET_ITEM(a, i), &b) < 0) goto fail;
        if (cached_here(p, b)) continue;
        int64_t key;
        if (key_of(PySequence_Fast_GET_ITEM(h, i), &key) < 0) goto fail;
        uint64_t slot = probe(p, key);
        if (p->slots[slot].block >= 0) continue; /* the hash has its block already: b stays unpublished */
        p->slots[slot].key = key;
        p->slots[slot].block = b;
        p->hkey[b] = key;
        p->hashed[b] = 1;
        p->ncached++;
    }
    if (n != m) { /* zip(strict=True) raises after the pairs it could make */
        PyErr_Format(PyExc_ValueError, "zip() argument 2 is %s than argument 1", m < n ? "shorter" : "longer");
        goto fail;
    }
    Py_DECREF(a);
    Py_DECREF(h);
    Py_RETURN_NONE;
fail:
    Py_DECREF(a);
    Py_DECREF(h);
    return NULL;
}

static int free_one(Pool *p, int32_t b) {
    if (p->ref[b] - 1 < 0) {
        PyErr_Format(PyExc_ValueError, "block %d freed more often than referenced", (int)b);
        return -1;
    }
    if (--p->ref[b] > 0) return 0;
    if (cached_here(p, b)) {
        if (!p->in_lru[b]) lru_append(p, b); /* PyKVCache: setting an OrderedDict key keeps its place */
        return 0;
    }
    if (p->nfree >= p->capacity) { /* only a touch() of a free block leads here */
        PyErr_SetString(PyExc_RuntimeError, "block pool corrupted: more free blocks than blocks");
        return -1;
    }
    p->free_stack[p->nfree++] = b;
    return 0;
}

static PyObject *Pool_free(Pool *p, PyObject *ids) { return each_block(p, ids, free_one); }

static PyObject *Pool_is_cached(Pool *p, PyObject *arg) {
    int32_t b;
    if (block_of(p, arg, &b) < 0) return NULL;
    return PyBool_FromLong(cached_here(p, b));
}

static PyObject *Pool_refcount(Pool *p, PyObject *arg) {
    int32_t b;
    if (block_of(p, arg, &b) < 0) return NULL;
    return PyLong_FromLong(p->ref[b]);
}

static PyObject *Pool_refcounts(Pool *p, PyObject *ids) {
    PyObject *it = PyObject_GetIter(ids), *o;
    if (it == NULL) return NULL;
    PyObject *out = PyList_New(0);
    while (out != NULL && (o = PyIter_Next(it)) != NULL) {
        int32_t b;
        PyObject *r = block_of(p, o, &b) < 0 ? NULL : PyLong_FromLong(p->ref[b]);
        Py_DECREF(o);
        if (r == NULL || PyList_Append(out, r) < 0) Py_CLEAR(out);
        Py_XDECREF(r);
    }
    Py_DECREF(it);
    if (out != NULL && PyErr_Occurred()) Py_CLEAR(out);
    return out;
}

/* held_only(lists): how many distinct blocks are referenced exactly as often as they appear in lists
 * (each a hold's block ids): the blocks that ending every hold would free.  Scratch counts per block
 * live in a zeroed array only during the call. */
static PyObject *Pool_held_only(Pool *p, PyObject *lists) {
    PyObject *outer = PySequence_Fast(lists, "held_only takes a sequence of block id lists");
    if (outer == NULL) return NULL;
    Py_ssize_t nl = PySequence_Fast_GET_SIZE(outer), total = 0, k = 0, count = 0;
    PyObject **inner = PyMem_Calloc(nl ? nl : 1, sizeof(PyObject *));
    int32_t *ids = NULL, *seen = NULL;
    if (inner == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < nl; i++) {
        inner[i] = PySequence_Fast(PySequence_Fast_GET_ITEM(outer, i), "block ids must be a sequence");
        if (inner[i] == NULL) goto done;
        total += PySequence_Fast_GET_SIZE(inner[i]);
    }
    ids = PyMem_Malloc((total ? total : 1) * sizeof(int32_t));
    seen = PyMem_Calloc(p->capacity, sizeof(int32_t));
    if (ids == NULL || seen == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < nl; i++)
        for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(inner[i]); j++, k++)
            if (block_of(p, PySequence_Fast_GET_ITEM(inner[i], j), &ids[k]) < 0) goto done;
    for (k = 0; k < total; k++) seen[ids[k]]++;
    for (k = 0; k < total; k++) {
        int32_t b = ids[k];
        if (seen[b] == 0) continue; /* counted at its first appearance */
        count += seen[b] == p->ref[b];
        seen[b] = 0;
    }
done:
    for (Py_ssize_t i = 0; inner != NULL && i < nl; i++) Py_XDECREF(inner[i]);
    PyMem_Free(inner);
    PyMem_Free(ids);
    PyMem_Free(seen);
    Py_DECREF(outer);
    return PyErr_Occurred() ? NULL : PyLong_FromSsize_t(count);
}

static PyObject *Pool_num_free(Pool *p, void *c) { return PyLong_FromSsize_t(p->nfree + p->nlru); }
static PyObject *Pool_num_used(Pool *p, void *c) { return PyLong_FromSsize_t(p->capacity - p->nfree - p->nlru); }
static PyObject *Pool_num_cached(Pool *p, void *c) { return PyLong_FromSsize_t(p->ncached); }
static PyObject *Pool_capacity(Pool *p, void *c) { return PyLong_FromSsize_t(p->capacity); }
static PyObject *Pool_block_size(Pool *p, void *c) { return PyLong_FromSsize_t(p->block_size); }
static PyObject *Pool_get_evictions(Pool *p, void *c) { return PyLong_FromSsize_t(p->evictions); }

static int Pool_set_evictions(Pool *p, PyObject *v, void *c) {
    Py_ssize_t n = v == NULL ? -1 : PyLong_AsSsize_t(v);
    if (n == -1 && (v == NULL || PyErr_Occurred())) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "evictions is an int");
        return -1;
    }
    p->evictions = n;
    return 0;
}

static PyMethodDef Pool_methods[] = {
    {"lookup", (PyCFunction)Pool_lookup, METH_VARARGS, "lookup(hashes, num_tokens) -> block ids of the cached prefix"},
    {"touch", (PyCFunction)Pool_touch, METH_O, "touch(block_ids): one more reference each"},
    {"allocate", (PyCFunction)Pool_allocate, METH_O, "allocate(n) -> n new blocks, one reference each"},
    {"commit", (PyCFunction)Pool_commit, METH_VARARGS, "commit(block_ids, hashes): publish full blocks"},
    {"free", (PyCFunction)Pool_free, METH_O, "free(block_ids): one reference fewer each"},
    {"is_cached", (PyCFunction)Pool_is_cached, METH_O, "is_cached(block_id) -> bool"},
    {"refcount", (PyCFunction)Pool_refcount, METH_O, "refcount(block_id) -> int"},
    {"refcounts", (PyCFunction)Pool_refcounts, METH_O, "refcounts(block_ids) -> list of int"},
    {"held_only", (PyCFunction)Pool_held_only, METH_O,
     "held_only(lists) -> int: distinct blocks referenced exactly as often as they appear in lists"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Pool_getset[] = {
    {"num_free", (getter)Pool_num_free, NULL, "blocks free or evictable", NULL},
    {"num_used", (getter)Pool_num_used, NULL, "blocks with a reference", NULL},
    {"num_cached", (getter)Pool_num_cached, NULL, "blocks in the prefix cache", NULL},
    {"capacity", (getter)Pool_capacity, NULL, "blocks in all", NULL},
    {"block_size", (getter)Pool_block_size, NULL, "tokens per block", NULL},
    {"evictions", (getter)Pool_get_evictions, (setter)Pool_set_evictions, "cached blocks evicted so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvtrace.sim._ckv.KVCache",
    .tp_basicsize = sizeof(Pool),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "KVCache(capacity, block_size): kvtrace.sim.kvcache.PyKVCache in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Pool_init,
    .tp_dealloc = (destructor)Pool_dealloc,
    .tp_methods = Pool_methods,
    .tp_getset = Pool_getset,
};

/* CPython's tuple hash (Objects/tupleobject.c, 3.8 on: xxHash's mixing of the items' hashes), so a
 * block's hash needs no tuple; PyInit__ckv checks it against hash() of real tuples and, should an
 * interpreter hash tuples otherwise, block_hashes builds the tuples instead. */
#if SIZEOF_VOID_P > 4
#define XXPRIME_1 ((Py_uhash_t)11400714785074694791ULL)
#define XXPRIME_2 ((Py_uhash_t)14029467366897019727ULL)
#define XXPRIME_5 ((Py_uhash_t)2870177450012600261ULL)
#define XXROTATE(x) ((x << 31) | (x >> 33))
#else
#define XXPRIME_1 ((Py_uhash_t)2654435761UL)
#define XXPRIME_2 ((Py_uhash_t)2246822519UL)
#define XXPRIME_5 ((Py_uhash_t)374761393UL)
#define XXROTATE(x) ((x << 13) | (x >> 19))
#endif

static int own_tuple_hash; /* 1 once PyInit__ckv has seen it agree with hash() */
static int check_tuple_hash(void);

static inline Py_uhash_t mix(Py_uhash_t acc, Py_uhash_t lane) {
    acc += lane * XXPRIME_2;
    acc = XXROTATE(acc);
    return acc * XXPRIME_1;
}

static inline Py_hash_t done(Py_uhash_t acc, Py_ssize_t len) {
    acc += len ^ (XXPRIME_5 ^ 3527539UL);
    return acc == (Py_uhash_t)-1 ? 1546275796 : (Py_hash_t)acc;
}

/* hash((parent, tuple(items[0:n]))) without the tuples; -1 with an exception set on error. */
static Py_hash_t pair_hash(PyObject *parent, PyObject **items, Py_ssize_t n) {
    Py_uhash_t acc = XXPRIME_5;
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_hash_t lane = PyObject_Hash(items[j]);
        if (lane == -1) return -1;
        acc = mix(acc, (Py_uhash_t)lane);
    }
    Py_hash_t inner = done(acc, n), outer = PyObject_Hash(parent);
    if (outer == -1) return -1;
    return done(mix(mix(XXPRIME_5, (Py_uhash_t)outer), (Py_uhash_t)inner), 2);
}

/* A fresh tuple this function owns alone: its items are replaced in place, hashed, replaced again. */
static void put(PyObject *t, Py_ssize_t i, PyObject *o) {
    PyObject *old = PyTuple_GET_ITEM(t, i);
    Py_INCREF(o);
    PyTuple_SET_ITEM(t, i, o);
    Py_XDECREF(old);
}

static PyObject *block_hashes(PyObject *self, PyObject *args) {
    PyObject *tokens, *parent = NULL;
    Py_ssize_t bs;
    if (!PyArg_ParseTuple(args, "On|O", &tokens, &bs, &parent)) return NULL;
    if (bs <= 0) {
        PyErr_SetString(PyExc_ValueError, "block_size must be positive");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(tokens, "tokens must be iterable");
    if (seq == NULL) return NULL;
    Py_ssize_t nblocks = PySequence_Fast_GET_SIZE(seq) / bs;
    PyObject *out = PyList_New(nblocks), *block = PyTuple_New(bs), *pair = PyTuple_New(2);
    PyObject *h = parent != NULL ? (Py_INCREF(parent), parent) : PyLong_FromLong(0);
    if (out == NULL || block == NULL || pair == NULL || h == NULL) goto fail;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t k = 0; k < nblocks; k++) {
        Py_hash_t v;
        if (own_tuple_hash) {
            v = pair_hash(h, items + k * bs, bs);
        } else {
            for (Py_ssize_t j = 0; j < bs; j++) put(block, j, items[k * bs + j]);
            put(pair, 0, h);
            put(pair, 1, block);
            v = PyObject_Hash(pair);
        }
        if (v == -1 && PyErr_Occurred()) goto fail;
        Py_DECREF(h);
        h = PyLong_FromSsize_t(v);
        if (h == NULL) goto fail;
        Py_INCREF(h);
        PyList_SET_ITEM(out, k, h);
        /* the pair holds the block: free it so the block's items can be replaced (refcount 1) */
        put(pair, 1, Py_None);
    }
    Py_DECREF(h);
    Py_DECREF(block);
    Py_DECREF(pair);
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(h);
    Py_XDECREF(out);
    Py_XDECREF(block);
    Py_XDECREF(pair);
    Py_DECREF(seq);
    return NULL;
}

static PyObject *set_errors(PyObject *self, PyObject *exc) {
    Py_INCREF(exc);
    Py_XSETREF(NoSpace, exc);
    Py_RETURN_NONE;
}

static PyObject *tuple_hash_is_own(PyObject *self, PyObject *unused) { return PyBool_FromLong(own_tuple_hash); }

static PyObject *set_tuple_hash(PyObject *self, PyObject *on) {
    int v = PyObject_IsTrue(on);
    if (v < 0) return NULL;
    own_tuple_hash = v && check_tuple_hash();
    return PyBool_FromLong(own_tuple_hash);
}

static PyMethodDef methods[] = {
    {"tuple_hash_is_own", tuple_hash_is_own, METH_NOARGS,
     "tuple_hash_is_own() -> bool: block_hashes mixes the items' hashes itself (else it builds tuples)"},
    {"set_tuple_hash", set_tuple_hash, METH_O, "set_tuple_hash(on) -> bool: for tests, either way of hashing"},
    {"block_hashes", block_hashes, METH_VARARGS,
     "block_hashes(tokens, block_size, parent=0) -> list: kvtrace.sim.kvcache.py_block_hashes's hashes"},
    {"set_errors", set_errors, METH_O, "set_errors(NoSpace): the exception allocate() raises"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvtrace.sim._ckv",
    "kvtrace.sim.kvcache's block pool and block hashes in C (the same results as its Python).", -1, methods,
};

/* own_tuple_hash: pair_hash agrees with hash() on tuples of small, large, negative ints and a str. */
static int check_tuple_hash(void) {
    PyObject *items[4] = {PyLong_FromLong(7), PyLong_FromLongLong(-1), PyLong_FromLongLong(-(1LL << 62) - 5),
                          PyUnicode_FromString("x")};
    PyObject *parent = PyLong_FromLongLong((1LL << 62) + 3), *block = NULL, *pair = NULL;
    int agree = 0;
    if (items[0] && items[1] && items[2] && items[3] && parent) {
        block = PyTuple_Pack(4, items[0], items[1], items[2], items[3]);
        pair = block ? PyTuple_Pack(2, parent, block) : NULL;
        if (pair != NULL) {
            Py_hash_t want = PyObject_Hash(pair), got = pair_hash(parent, items, 4);
            agree = want != -1 && got == want;
        }
    }
    PyErr_Clear();
    for (int i = 0; i < 4; i++) Py_XDECREF(items[i]);
    Py_XDECREF(parent);
    Py_XDECREF(block);
    Py_XDECREF(pair);
    return agree;
}

PyMODINIT_FUNC PyInit__ckv(void) {
    if (PyType_Ready(&PoolType) < 0) return NULL;
    own_tuple_hash = check_tuple_hash();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    NoSpace = PyExc_MemoryError; /* until set_errors() */
    Py_INCREF(NoSpace);
    Py_INCREF(&PoolType);
    if (PyModule_AddObject(m, "KVCache", (PyObject *)&PoolType) < 0) {
        Py_DECREF(&PoolType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
