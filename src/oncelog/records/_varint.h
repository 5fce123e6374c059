/* Kafka's zig-zag varints (at most 10 bytes, 64 bits), shared by the compiled record code:
 * _recordwalk.c (the produce path's record walk) and the column codec (_columnar.h). Every
 * read is checked against the end of the buffer. */
#ifndef ONCELOG_VARINT_H
#define ONCELOG_VARINT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static inline int varint_size(int64_t v)
{
    uint64_t u = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    int n = 1;
    while (u >= 0x80) {
        u >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *put_varint(uint8_t *out, int64_t v)
{
    uint64_t u = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    while (u >= 0x80) {
        *out++ = (uint8_t)(u | 0x80);
        u >>= 7;
    }
    *out++ = (uint8_t)u;
    return out;
}

enum { OK = 0, TRUNCATED = -1, TOO_LONG = -2 };

static inline int read_varint(const uint8_t *d, Py_ssize_t n, Py_ssize_t *pos, int64_t *out)
{
    if (*pos < n && d[*pos] < 0x80) { /* the common one-byte case */
        uint8_t b = d[(*pos)++];
        *out = (int64_t)((b >> 1) ^ (0 - (uint64_t)(b & 1)));
        return OK;
    }
    uint64_t result = 0;
    int shift = 0;
    for (;;) {
        if (*pos >= n)
            return TRUNCATED;
        uint8_t b = d[(*pos)++];
        if (shift == 63 && (b & 0x7e))
            return TOO_LONG;
        result |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            break;
        shift += 7;
        if (shift > 63)
            return TOO_LONG;
    }
    *out = (int64_t)((result >> 1) ^ (0 - (result & 1)));
    return OK;
}

#endif
