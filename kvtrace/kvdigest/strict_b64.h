/* Base64 decoding exactly as strict as CPython's binascii.a2b_base64(text, strict_mode=True), which
 * is what kvtrace.kvdigest._pytags decodes an offer's tags with.  Included by _ctags.c only; tested
 * against binascii (tests/kvdigest/test_ctags.py). */
#ifndef KVTRACE_STRICT_B64_H
#define KVTRACE_STRICT_B64_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* binascii.a2b_base64(text, strict_mode=True), ported (CPython 3.11): 0 and the bytes in *out
 * (a new bytes object), or 1 when the text is not strict base64.  Tested against binascii. */
static int strict_b64(PyObject *text, PyObject **out) {
    static const int8_t table[128] = {
        -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
        -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 62, -1, -1, -1, 63, 52, 53, 54, 55,
        56, 57, 58, 59, 60, 61, -1, -1, -1, -1, -1, -1, -1, 0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12,
        13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, -1, -1, -1, -1, -1, -1, 26, 27, 28, 29, 30, 31, 32,
        33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, -1, -1, -1, -1, -1,
    };
    if (!PyUnicode_IS_ASCII(text))
        return 1;
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    const uint8_t *data = PyUnicode_1BYTE_DATA(text);
    if (len > 0 && data[0] == '=')
        return 1;
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, (len / 4) * 3 + 3);
    if (bytes == NULL)
        return -1;
    uint8_t *bin = (uint8_t *)PyBytes_AS_STRING(bytes), *start = bin;
    int quad = 0, pads = 0, padding = 0, bad = 0;
    unsigned left = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        uint8_t c = data[i];
        if (c == '=') {
            padding = 1;
            if (quad >= 2 && quad + ++pads >= 4) {
                bad = i + 1 < len; /* excess data after the padding */
                goto done;
            }
            continue;
        }
        int v = table[c];
        if (v < 0 || padding) { /* not base64, or discontinuous padding */
            bad = 1;
            goto done;
        }
        pads = 0;
        switch (quad) {
        case 0:
            quad = 1;
            left = (unsigned)v;
            break;
        case 1:
            quad = 2;
            *bin++ = (uint8_t)((left << 2) | ((unsigned)v >> 4));
            left = (unsigned)v & 0x0f;
            break;
        case 2:
            quad = 3;
            *bin++ = (uint8_t)((left << 4) | ((unsigned)v >> 2));
            left = (unsigned)v & 0x03;
            break;
        default:
            quad = 0;
            *bin++ = (uint8_t)((left << 6) | (unsigned)v);
            left = 0;
        }
    }
    bad = quad != 0; /* one data character too many, or incorrect padding */
done:
    if (bad) {
        Py_DECREF(bytes);
        return 1;
    }
    if (_PyBytes_Resize(&bytes, bin - start) < 0)
        return -1;
    *out = bytes;
    return 0;
}

#endif
