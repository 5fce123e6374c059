/* The decode half of the column codec (see _columnar.c for the whole module): records
 * sections appended into growing Arrow-layout column buffers, and a decoded binary column
 * back to Python bytes. Network data: every length and count is checked against the
 * buffer. */
#include "_columnar.h"

enum {
    B_OFFSET, B_TIMESTAMP, B_TS_TYPE, B_KEY_VALID, B_KEY_OFFS, B_KEY_DATA, B_VAL_VALID,
    B_VAL_OFFS, B_VAL_DATA, B_HDR_VALID, B_HDR_OFFS, B_HK_OFFS, B_HK_DATA, B_HV_VALID,
    B_HV_OFFS, B_HV_DATA, N_BUFFERS
};
enum {
    C_ROWS, C_KEY_NULLS, C_KEY_DATA, C_VAL_NULLS, C_VAL_DATA, C_HDR_NULLS, C_HEADERS,
    C_HK_DATA, C_HV_NULLS, C_HV_DATA, N_COUNTERS
};

/* Grow bytearray ``ba`` to hold at least ``need`` bytes (geometrically: appending many
 * sections costs amortized linear time). Its pointer may change. */
static int reserve(PyObject *ba, Py_ssize_t need)
{
    Py_ssize_t size = PyByteArray_GET_SIZE(ba);
    if (need <= size)
        return 0;
    Py_ssize_t cap = size * 2 > need ? size * 2 : need;
    if (cap < 64)
        cap = 64;
    return PyByteArray_Resize(ba, cap);
}

static inline void set_bit(uint8_t *bitmap, int64_t i, int on)
{
    if (on)
        bitmap[i >> 3] |= (uint8_t)(1u << (i & 7));
    else
        bitmap[i >> 3] &= (uint8_t)~(1u << (i & 7));
}

static int utf8_valid(const uint8_t *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        uint32_t cp;
        if ((c & 0xe0) == 0xc0) {
            len = 2;
            cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3;
            cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (i + len > n)
            return 0;
        for (int j = 1; j < len; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)
            || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += len;
    }
    return 1;
}

#define DFAIL(...) do { PyErr_Format(PyExc_ValueError, __VA_ARGS__); goto fail; } while (0)
#define DVARINT(dst) do { \
        int rc_ = read_varint(d, n, &pos, &(dst)); \
        if (rc_ == TRUNCATED) DFAIL("record %zd overruns the batch", i); \
        if (rc_ == TOO_LONG) DFAIL("record %zd: varint too long", i); \
    } while (0)
#define BUF(k) ((uint8_t *)PyByteArray_AS_STRING(bufs[k]))

static inline void put_i32(PyObject *ba, int64_t i, int64_t v)
{
    int32_t x = (int32_t)v;
    memcpy(PyByteArray_AS_STRING(ba) + 4 * i, &x, 4);
}

/* Append a length-prefixed field (key, value, header value) at ``pos``: its bytes into
 * data buffer ``db`` at *dlen, its end offset into ``ob`` at ``slot``, its bit in ``vb``.
 * Any negative length is null, as Kafka's DefaultRecord.readFrom and records/batch.py read
 * it (only a producer's batch is refused for one below -1: _recordwalk.c). */
static int take_field(const uint8_t *d, Py_ssize_t n, Py_ssize_t *pos, Py_ssize_t i,
                      const char *what, PyObject *vb, PyObject *ob, PyObject *db, int64_t slot,
                      int64_t *dlen, int64_t *nulls, int lazy)
{
    int64_t len;
    int rc = read_varint(d, n, pos, &len);
    if (rc == TRUNCATED) {
        PyErr_Format(PyExc_ValueError, "record %zd overruns the batch", i);
        return -1;
    }
    if (rc == TOO_LONG) {
        PyErr_Format(PyExc_ValueError, "record %zd: varint too long", i);
        return -1;
    }
    if (len > n - *pos) {
        PyErr_Format(PyExc_ValueError, "record %zd: its %s overruns the batch", i, what);
        return -1;
    }
    if (lazy && (reserve(vb, slot / 8 + 1) < 0 || reserve(ob, 4 * (slot + 2)) < 0))
        return -1;
    if (len < 0) {
        set_bit((uint8_t *)PyByteArray_AS_STRING(vb), slot, 0);
        (*nulls)++;
        len = 0;
    } else {
        set_bit((uint8_t *)PyByteArray_AS_STRING(vb), slot, 1);
        if (*dlen + len > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "more than 2 GiB of one column's bytes: "
                            "start a new RecordColumns");
            return -1;
        }
        if (lazy && reserve(db, *dlen + len) < 0)
            return -1;
        memcpy(PyByteArray_AS_STRING(db) + *dlen, d + *pos, (size_t)len);
        *dlen += len;
        *pos += (Py_ssize_t)len;
    }
    put_i32(ob, slot + 1, *dlen);
    return 0;
}

PyObject *columnar_decode(PyObject *self, PyObject *args)
{
    Py_buffer view, cview;
    Py_ssize_t count;
    long long base_offset, base_ts, lat, min_offset;
    int has_lat, ts_type;
    PyObject *buflist;
    if (!PyArg_ParseTuple(args, "y*nLLpLiLO!w*", &view, &count, &base_offset, &base_ts,
                          &has_lat, &lat, &ts_type, &min_offset, &PyList_Type, &buflist,
                          &cview))
        return NULL;
    /* (the Python wrapper passes has_lat and lat as two arguments) */
    PyObject *bufs[N_BUFFERS];
    const uint8_t *d = (const uint8_t *)view.buf;
    Py_ssize_t n = view.len, pos = 0, i = 0;
    int64_t c[N_COUNTERS];
    if (PyList_GET_SIZE(buflist) != N_BUFFERS || cview.len != (Py_ssize_t)sizeof(c)) {
        PyErr_SetString(PyExc_ValueError, "decode: wrong buffers or counters");
        goto fail;
    }
    for (int k = 0; k < N_BUFFERS; k++) {
        bufs[k] = PyList_GET_ITEM(buflist, k);
        if (!PyByteArray_Check(bufs[k])) {
            PyErr_SetString(PyExc_TypeError, "decode: buffers must be bytearrays");
            goto fail;
        }
    }
    memcpy(c, cview.buf, sizeof(c));
    /* A record takes at least 7 bytes (length, attributes, timestamp and offset deltas, key
     * and value lengths, header count): a count that cannot fit is a lie, refused before
     * anything is sized by it. */
    if (count < 0 || count > n / 7)
        DFAIL("%zd records cannot fit in %zd bytes", count, n);
    int64_t rows = c[C_ROWS];
    if (reserve(bufs[B_OFFSET], 8 * (rows + count)) < 0
        || reserve(bufs[B_TIMESTAMP], 8 * (rows + count)) < 0
        || reserve(bufs[B_TS_TYPE], 4 * (rows + count)) < 0
        || reserve(bufs[B_KEY_VALID], (rows + count) / 8 + 1) < 0
        || reserve(bufs[B_VAL_VALID], (rows + count) / 8 + 1) < 0
        || reserve(bufs[B_HDR_VALID], (rows + count) / 8 + 1) < 0
        || reserve(bufs[B_KEY_OFFS], 4 * (rows + count + 1)) < 0
        || reserve(bufs[B_VAL_OFFS], 4 * (rows + count + 1)) < 0
        || reserve(bufs[B_HDR_OFFS], 4 * (rows + count + 1)) < 0
        || reserve(bufs[B_KEY_DATA], c[C_KEY_DATA] + n) < 0
        || reserve(bufs[B_VAL_DATA], c[C_VAL_DATA] + n) < 0)
        goto fail;
    for (i = 0; i < count; i++) {
        int64_t length, ts, delta, nh;
        DVARINT(length);
        if (length < 6 || length > n - pos)
            DFAIL("record %zd: length %lld does not fit the batch's %zd bytes left", i,
                  (long long)length, n - pos);
        Py_ssize_t end = pos + (Py_ssize_t)length;
        pos += 1; /* attributes */
        DVARINT(ts);
        DVARINT(delta);
        int64_t offset = (int64_t)((uint64_t)base_offset + (uint64_t)delta);
        int keep = offset >= min_offset;
        if (!keep) { /* below the fetch position: walk it, keep nothing */
            for (int f = 0; f < 2; f++) {
                int64_t len;
                DVARINT(len);
                if (len > n - pos) /* negative: null, as Kafka's DefaultRecord.readFrom */
                    DFAIL("record %zd: field length %lld", i, (long long)len);
                if (len > 0)
                    pos += (Py_ssize_t)len;
            }
            DVARINT(nh);
            if (nh < 0)
                DFAIL("record %zd: %lld headers", i, (long long)nh);
            for (int64_t h = 0; h < nh; h++) {
                for (int f = 0; f < 2; f++) {
                    int64_t len;
                    DVARINT(len);
                    if ((!f && len < 0) || len > n - pos) /* a key is never null */
                        DFAIL("record %zd: header field length %lld", i, (long long)len);
                    if (len > 0)
                        pos += (Py_ssize_t)len;
                }
            }
            if (pos != end)
                DFAIL("record %zd: its length does not match its fields", i);
            continue;
        }
        int64_t t = has_lat ? lat : (int64_t)((uint64_t)base_ts + (uint64_t)ts);
        memcpy(BUF(B_OFFSET) + 8 * rows, &offset, 8);
        memcpy(BUF(B_TIMESTAMP) + 8 * rows, &t, 8);
        int32_t tt = ts_type;
        memcpy(BUF(B_TS_TYPE) + 4 * rows, &tt, 4);
        if (take_field(d, n, &pos, i, "key", bufs[B_KEY_VALID], bufs[B_KEY_OFFS],
                       bufs[B_KEY_DATA], rows, &c[C_KEY_DATA], &c[C_KEY_NULLS], 0) < 0
            || take_field(d, n, &pos, i, "value", bufs[B_VAL_VALID], bufs[B_VAL_OFFS],
                          bufs[B_VAL_DATA], rows, &c[C_VAL_DATA], &c[C_VAL_NULLS], 0) < 0)
            goto fail;
        DVARINT(nh);
        if (nh < 0)
            DFAIL("record %zd: %lld headers", i, (long long)nh);
        if (nh > (end - pos) / 2) /* a header takes at least two bytes */
            DFAIL("record %zd: %lld headers cannot fit", i, (long long)nh);
        set_bit(BUF(B_HDR_VALID), rows, nh > 0);
        if (nh == 0)
            c[C_HDR_NULLS]++; /* no headers: null, as Spark's Kafka source shows them */
        for (int64_t h = 0; h < nh; h++) {
            int64_t slot = c[C_HEADERS], klen;
            if (reserve(bufs[B_HK_OFFS], 4 * (slot + 2)) < 0)
                goto fail;
            DVARINT(klen);
            if (klen < 0)
                DFAIL("record %zd: a header key is null", i);
            if (klen > n - pos)
                DFAIL("record %zd overruns the batch", i);
            const uint8_t *kp = d + pos;
            Py_ssize_t kl = (Py_ssize_t)klen;
            PyObject *fixed = NULL;
            if (!utf8_valid(kp, kl)) { /* as batch.py: undecodable bytes become U+FFFD */
                PyObject *u = PyUnicode_DecodeUTF8((const char *)kp, kl, "replace");
                if (!u)
                    goto fail;
                fixed = PyUnicode_AsUTF8String(u);
                Py_DECREF(u);
                if (!fixed)
                    goto fail;
                kp = (const uint8_t *)PyBytes_AS_STRING(fixed);
                kl = PyBytes_GET_SIZE(fixed);
            }
            if (c[C_HK_DATA] + kl > INT32_MAX || reserve(bufs[B_HK_DATA], c[C_HK_DATA] + kl) < 0) {
                Py_XDECREF(fixed);
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_OverflowError, "more than 2 GiB of header keys");
                goto fail;
            }
            memcpy(BUF(B_HK_DATA) + c[C_HK_DATA], kp, (size_t)kl);
            Py_XDECREF(fixed);
            c[C_HK_DATA] += kl;
            pos += (Py_ssize_t)klen;
            put_i32(bufs[B_HK_OFFS], slot + 1, c[C_HK_DATA]);
            if (take_field(d, n, &pos, i, "header value", bufs[B_HV_VALID], bufs[B_HV_OFFS],
                           bufs[B_HV_DATA], slot, &c[C_HV_DATA], &c[C_HV_NULLS], 1) < 0)
                goto fail;
            c[C_HEADERS]++;
        }
        put_i32(bufs[B_HDR_OFFS], rows + 1, c[C_HEADERS]);
        if (pos != end)
            DFAIL("record %zd: its length does not match its fields", i);
        rows++;
    }
    if (pos != n)
        DFAIL("%zd bytes after the last of the header's %zd records", n - pos, count);
    Py_ssize_t appended = (Py_ssize_t)(rows - c[C_ROWS]);
    c[C_ROWS] = rows;
    memcpy(cview.buf, c, sizeof(c));
    PyBuffer_Release(&view);
    PyBuffer_Release(&cview);
    return PyLong_FromSsize_t(appended);
fail:
    PyBuffer_Release(&view);
    PyBuffer_Release(&cview);
    return NULL;
}

/* binary_list(validity, offsets, data, start, stop) -> [bytes | None]: rows start..stop of a
 * decoded binary column (int32 offsets) as Python objects, for the consumers that want one
 * object per record (Consumer.poll). validity None: no nulls. */
PyObject *columnar_binary_list(PyObject *self, PyObject *args)
{
    PyObject *valid_obj;
    Py_buffer offs, data, valid = {0};
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "Oy*y*nn", &valid_obj, &offs, &data, &start, &stop))
        return NULL;
    PyObject *out = NULL;
    int has_valid = valid_obj != Py_None;
    if (has_valid && PyObject_GetBuffer(valid_obj, &valid, PyBUF_SIMPLE) < 0)
        goto done;
    if (start < 0 || stop < start || 4 * (stop + 1) > offs.len
        || (has_valid && (stop + 7) / 8 > valid.len)) {
        PyErr_SetString(PyExc_ValueError, "binary_list: rows outside the buffers");
        goto done;
    }
    out = PyList_New(stop - start);
    if (!out)
        goto done;
    const int32_t *o = (const int32_t *)offs.buf;
    for (Py_ssize_t i = start; i < stop; i++) {
        PyObject *item;
        if (has_valid && !((((const uint8_t *)valid.buf)[i >> 3] >> (i & 7)) & 1)) {
            item = Py_None;
            Py_INCREF(item);
        } else {
            int32_t a = o[i], b = o[i + 1];
            if (a < 0 || b < a || b > data.len) {
                PyErr_SetString(PyExc_ValueError, "binary_list: offsets outside the data");
                Py_CLEAR(out);
                goto done;
            }
            item = PyBytes_FromStringAndSize((const char *)data.buf + a, b - a);
            if (!item) {
                Py_CLEAR(out);
                goto done;
            }
        }
        PyList_SET_ITEM(out, i - start, item);
    }
done:
    PyBuffer_Release(&offs);
    PyBuffer_Release(&data);
    if (has_valid)
        PyBuffer_Release(&valid);
    return out;
}
