/* The v2 records section, column-wise, in C (issue 19): what records/batch.py's encode_record
 * and _decode_record_set do one Python object at a time, done for a whole column of keys and
 * values at once. records/columnar.py is the Python face of this module; read it first.
 *
 * encode(values, keys, headers, timestamps, default_ts, indices, start, stop, max_bytes)
 *     -> (chunks, largest)
 *   Encodes rows indices[start:stop] (or start..stop) as records sections of at most
 *   max_bytes each (a record larger than that gets a section of its own, as Kafka gives it a
 *   batch of its own). chunks: list of (bytes, count, base_timestamp, max_timestamp);
 *   largest: the largest single record's encoded size.
 *   A column (values, keys) is None (all null), a list of bytes/str/bytearray/None, or an
 *   Arrow binary layout tuple (validity|None, offsets, data|None, offset_width 4|8,
 *   array offset, length). headers: None, a list (per row None or a sequence of (str,
 *   bytes|None)), or Arrow's list<struct<key, value>> layout ("arrow", validity|None,
 *   offsets, offset_width, array offset, length, key column, value column), the key and
 *   value columns as above, indexed by the list's offsets.
 *
 * decode(data, count, base_offset, base_timestamp, log_append_time, timestamp_type,
 *        min_offset, buffers, counters) -> rows appended
 *   Appends the records at or above min_offset to the growing column buffers (bytearrays,
 *   grown geometrically: their size is a capacity, the logical lengths live in counters, an
 *   int64 bytearray). Nothing in counters changes unless the whole section decodes. Every
 *   length and count is checked against the data: a lying one raises ValueError.
 *
 * partition_keys(keys, num_partitions) -> int32 bytes: Kafka's default partitioner
 *   (toPositive(murmur2(key)) % n) per row, -1 for a null key.
 * group_rows(partitions, num_partitions, null_partition) -> (int32 indices, int64 starts):
 *   a stable counting sort of row numbers by partition (-1 goes to null_partition).
 */
#include "_columnar.h"

/* --- column sources ---------------------------------------------------------------------- */

enum { COL_NULL = 0, COL_LIST = 1, COL_ARROW = 2 };

typedef struct {
    int kind;
    PyObject *list; /* borrowed */
    Py_buffer validity, offsets, data;
    int has_validity, has_data, wide;
    Py_ssize_t offset, length;
} Col;

static void col_release(Col *c)
{
    if (c->kind != COL_ARROW)
        return;
    if (c->has_validity)
        PyBuffer_Release(&c->validity);
    PyBuffer_Release(&c->offsets);
    if (c->has_data)
        PyBuffer_Release(&c->data);
    c->kind = COL_NULL;
}

/* Parse a column argument; ``n`` is the rows it must have (-1: take its own, stored in *n). */
static int col_init(Col *c, PyObject *obj, const char *what, Py_ssize_t *n)
{
    memset(c, 0, sizeof(*c));
    if (obj == Py_None) {
        c->kind = COL_NULL;
        return 0;
    }
    if (PyList_Check(obj)) {
        c->kind = COL_LIST;
        c->list = obj;
        c->length = PyList_GET_SIZE(obj);
    } else if (PyTuple_Check(obj) && PyTuple_GET_SIZE(obj) == 6) {
        PyObject *v = PyTuple_GET_ITEM(obj, 0), *o = PyTuple_GET_ITEM(obj, 1),
                 *d = PyTuple_GET_ITEM(obj, 2);
        c->wide = (int)PyLong_AsLong(PyTuple_GET_ITEM(obj, 3));
        c->offset = PyLong_AsSsize_t(PyTuple_GET_ITEM(obj, 4));
        c->length = PyLong_AsSsize_t(PyTuple_GET_ITEM(obj, 5));
        if (PyErr_Occurred())
            return -1;
        if ((c->wide != 4 && c->wide != 8) || c->offset < 0 || c->length < 0) {
            PyErr_Format(PyExc_ValueError, "%s: bad Arrow layout", what);
            return -1;
        }
        if (PyObject_GetBuffer(o, &c->offsets, PyBUF_SIMPLE) < 0)
            return -1;
        c->kind = COL_ARROW;
        if (v != Py_None) {
            if (PyObject_GetBuffer(v, &c->validity, PyBUF_SIMPLE) < 0)
                goto fail;
            c->has_validity = 1;
        }
        if (d != Py_None) {
            if (PyObject_GetBuffer(d, &c->data, PyBUF_SIMPLE) < 0)
                goto fail;
            c->has_data = 1;
        }
        /* Every offset read below is inside the offsets buffer, every bit inside the bitmap */
        if ((c->offset + c->length + 1) * c->wide > c->offsets.len
            || (c->has_validity && (c->offset + c->length + 7) / 8 > c->validity.len)) {
            PyErr_Format(PyExc_ValueError, "%s: Arrow buffers shorter than the array", what);
            goto fail;
        }
    } else {
        PyErr_Format(PyExc_TypeError, "%s: a list or an Arrow layout tuple, not %s", what,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (*n < 0) {
        *n = c->length;
    } else if (c->length != *n) {
        PyErr_Format(PyExc_ValueError, "%s has %zd rows, not %zd", what, c->length, *n);
        goto fail;
    }
    return 0;
fail:
    col_release(c);
    return -1;
}

/* Row ``row``'s bytes: 1 null, 0 a value in (*p, *len), -1 an error. */
static int col_get(Col *c, Py_ssize_t row, const char **p, Py_ssize_t *len)
{
    if (c->kind == COL_NULL)
        return 1;
    if (c->kind == COL_LIST) {
        PyObject *item = PyList_GET_ITEM(c->list, row);
        if (item == Py_None)
            return 1;
        if (PyBytes_Check(item)) {
            *p = PyBytes_AS_STRING(item);
            *len = PyBytes_GET_SIZE(item);
            return 0;
        }
        if (PyUnicode_Check(item)) {
            *p = PyUnicode_AsUTF8AndSize(item, len);
            return *p ? 0 : -1;
        }
        if (PyByteArray_Check(item)) {
            *p = PyByteArray_AS_STRING(item);
            *len = PyByteArray_GET_SIZE(item);
            return 0;
        }
        PyErr_Format(PyExc_TypeError, "row %zd: bytes, str or None, not %s", row,
                     Py_TYPE(item)->tp_name);
        return -1;
    }
    Py_ssize_t i = c->offset + row;
    if (c->has_validity && !((((const uint8_t *)c->validity.buf)[i >> 3] >> (i & 7)) & 1))
        return 1;
    int64_t o0, o1;
    if (c->wide == 4) {
        int32_t a, b;
        memcpy(&a, (const char *)c->offsets.buf + 4 * i, 4);
        memcpy(&b, (const char *)c->offsets.buf + 4 * (i + 1), 4);
        o0 = a;
        o1 = b;
    } else {
        memcpy(&o0, (const char *)c->offsets.buf + 8 * i, 8);
        memcpy(&o1, (const char *)c->offsets.buf + 8 * (i + 1), 8);
    }
    Py_ssize_t dlen = c->has_data ? c->data.len : 0;
    if (o0 < 0 || o1 < o0 || o1 > dlen) {
        PyErr_Format(PyExc_ValueError, "row %zd: Arrow offsets %lld..%lld outside the data",
                     row, (long long)o0, (long long)o1);
        return -1;
    }
    *p = c->has_data ? (const char *)c->data.buf + o0 : "";
    *len = (Py_ssize_t)(o1 - o0);
    return 0;
}

/* --- encode ------------------------------------------------------------------------------ */

typedef struct {
    uint8_t *buf;
    Py_ssize_t len, cap;
} Out;

static int out_reserve(Out *o, Py_ssize_t more)
{
    if (o->len + more <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + more)
        cap *= 2;
    uint8_t *b = PyMem_Realloc(o->buf, (size_t)cap);
    if (!b) {
        PyErr_NoMemory();
        return -1;
    }
    o->buf = b;
    o->cap = cap;
    return 0;
}

/* A header value or key: bytes, str (UTF-8) or None (-> 1). */
static int header_bytes(PyObject *obj, const char **p, Py_ssize_t *len, Py_ssize_t row)
{
    if (obj == Py_None)
        return 1;
    if (PyBytes_Check(obj)) {
        *p = PyBytes_AS_STRING(obj);
        *len = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (PyUnicode_Check(obj)) {
        *p = PyUnicode_AsUTF8AndSize(obj, len);
        return *p ? 0 : -1;
    }
    PyErr_Format(PyExc_TypeError, "row %zd: a header's key must be str and its value bytes "
                 "or None, not %s", row, Py_TYPE(obj)->tp_name);
    return -1;
}

/* The headers of one row: their encoded size (with the count varint) into *size, and when
 * ``out`` is not NULL, written there. -1 on a bad shape. */
static int row_headers(PyObject *hrow, Py_ssize_t row, Py_ssize_t *size, uint8_t **out)
{
    if (hrow == Py_None) {
        *size = 1;
        if (out)
            *(*out)++ = 0;
        return 0;
    }
    PyObject *seq = PySequence_Fast(hrow, "headers of a row must be a sequence of pairs");
    if (!seq)
        return -1;
    Py_ssize_t nh = PySequence_Fast_GET_SIZE(seq), total = varint_size(nh);
    if (out)
        *out = put_varint(*out, nh);
    for (Py_ssize_t h = 0; h < nh; h++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, h);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_Format(PyExc_TypeError, "row %zd: a header is a (str, bytes|None) tuple", row);
            goto fail;
        }
        PyObject *k = PyTuple_GET_ITEM(pair, 0), *v = PyTuple_GET_ITEM(pair, 1);
        const char *kp, *vp = NULL;
        Py_ssize_t kl, vl = 0;
        if (!PyUnicode_Check(k)) {
            PyErr_Format(PyExc_TypeError, "row %zd: header keys must be str", row);
            goto fail;
        }
        if (header_bytes(k, &kp, &kl, row) < 0)
            goto fail;
        int vnull = header_bytes(v, &vp, &vl, row);
        if (vnull < 0)
            goto fail;
        total += varint_size(kl) + kl + (vnull ? 1 : varint_size(vl) + vl);
        if (out) {
            *out = put_varint(*out, kl);
            memcpy(*out, kp, (size_t)kl);
            *out += kl;
            if (vnull) {
                *out = put_varint(*out, -1);
            } else {
                *out = put_varint(*out, vl);
                if (vl)
                    memcpy(*out, vp, (size_t)vl);
                *out += vl;
            }
        }
    }
    Py_DECREF(seq);
    *size = total;
    return 0;
fail:
    Py_DECREF(seq);
    return -1;
}

/* Headers given in Arrow's list<struct<key: string, value: binary>> layout: the list's
 * validity and offsets (into the struct's entries), and the entries' key and value columns. */
typedef struct {
    int on;
    Py_buffer validity, offsets;
    int has_validity, wide;
    Py_ssize_t offset, length;
    Col keys, values;
} ArrowHeaders;

static void ah_release(ArrowHeaders *h)
{
    if (!h->on)
        return;
    if (h->has_validity)
        PyBuffer_Release(&h->validity);
    PyBuffer_Release(&h->offsets);
    col_release(&h->keys);
    col_release(&h->values);
    h->on = 0;
}

/* ("arrow", validity|None, offsets, offset width, array offset, length, keys, values) */
static int ah_init(ArrowHeaders *h, PyObject *obj, Py_ssize_t rows)
{
    memset(h, 0, sizeof(*h));
    PyObject *v = PyTuple_GET_ITEM(obj, 1), *o = PyTuple_GET_ITEM(obj, 2);
    h->wide = (int)PyLong_AsLong(PyTuple_GET_ITEM(obj, 3));
    h->offset = PyLong_AsSsize_t(PyTuple_GET_ITEM(obj, 4));
    h->length = PyLong_AsSsize_t(PyTuple_GET_ITEM(obj, 5));
    if (PyErr_Occurred())
        return -1;
    if ((h->wide != 4 && h->wide != 8) || h->offset < 0 || h->length != rows) {
        PyErr_Format(PyExc_ValueError, "headers: an Arrow list array of %zd rows", rows);
        return -1;
    }
    if (PyObject_GetBuffer(o, &h->offsets, PyBUF_SIMPLE) < 0)
        return -1;
    h->on = 1;
    if (v != Py_None) {
        if (PyObject_GetBuffer(v, &h->validity, PyBUF_SIMPLE) < 0)
            goto fail;
        h->has_validity = 1;
    }
    if ((h->offset + h->length + 1) * h->wide > h->offsets.len
        || (h->has_validity && (h->offset + h->length + 7) / 8 > h->validity.len)) {
        PyErr_SetString(PyExc_ValueError, "headers: Arrow buffers shorter than the array");
        goto fail;
    }
    Py_ssize_t entries = -1;
    if (col_init(&h->keys, PyTuple_GET_ITEM(obj, 6), "header keys", &entries) < 0)
        goto fail;
    if (col_init(&h->values, PyTuple_GET_ITEM(obj, 7), "header values", &entries) < 0)
        goto fail;
    return 0;
fail:
    ah_release(h);
    return -1;
}

/* Row ``row``'s entries: [*first, *end) of the key and value columns. */
static int ah_row(ArrowHeaders *h, Py_ssize_t row, Py_ssize_t *first, Py_ssize_t *end)
{
    Py_ssize_t i = h->offset + row;
    *first = *end = 0;
    if (h->has_validity && !((((const uint8_t *)h->validity.buf)[i >> 3] >> (i & 7)) & 1))
        return 0;
    int64_t a, b;
    if (h->wide == 4) {
        int32_t x, y;
        memcpy(&x, (const char *)h->offsets.buf + 4 * i, 4);
        memcpy(&y, (const char *)h->offsets.buf + 4 * (i + 1), 4);
        a = x;
        b = y;
    } else {
        memcpy(&a, (const char *)h->offsets.buf + 8 * i, 8);
        memcpy(&b, (const char *)h->offsets.buf + 8 * (i + 1), 8);
    }
    if (a < 0 || b < a || b > h->keys.length) {
        PyErr_Format(PyExc_ValueError, "row %zd: header offsets %lld..%lld outside the "
                     "entries", row, (long long)a, (long long)b);
        return -1;
    }
    *first = (Py_ssize_t)a;
    *end = (Py_ssize_t)b;
    return 0;
}

/* As row_headers, for Arrow headers. */
static int arrow_row_headers(ArrowHeaders *h, Py_ssize_t row, Py_ssize_t *size, uint8_t **out)
{
    Py_ssize_t first, end;
    if (ah_row(h, row, &first, &end) < 0)
        return -1;
    Py_ssize_t total = varint_size(end - first);
    if (out)
        *out = put_varint(*out, end - first);
    for (Py_ssize_t j = first; j < end; j++) {
        const char *kp = NULL, *vp = NULL;
        Py_ssize_t kl = 0, vl = 0;
        int knull = col_get(&h->keys, j, &kp, &kl);
        if (knull < 0)
            return -1;
        if (knull) {
            PyErr_Format(PyExc_ValueError, "row %zd: a header key is null", row);
            return -1;
        }
        int vnull = col_get(&h->values, j, &vp, &vl);
        if (vnull < 0)
            return -1;
        total += varint_size(kl) + kl + (vnull ? 1 : varint_size(vl) + vl);
        if (out) {
            *out = put_varint(*out, kl);
            if (kl)
                memcpy(*out, kp, (size_t)kl);
            *out += kl;
            if (vnull) {
                *out = put_varint(*out, -1);
            } else {
                *out = put_varint(*out, vl);
                if (vl)
                    memcpy(*out, vp, (size_t)vl);
                *out += vl;
            }
        }
    }
    *size = total;
    return 0;
}

static PyObject *finish_chunk(Out *o, Py_ssize_t count, int64_t base_ts, int64_t max_ts,
                              PyObject *chunks)
{
    PyObject *b = PyBytes_FromStringAndSize((const char *)o->buf, o->len);
    if (!b)
        return NULL;
    PyObject *t = Py_BuildValue("(NnLL)", b, count, (long long)base_ts, (long long)max_ts);
    if (!t || PyList_Append(chunks, t) < 0) {
        Py_XDECREF(t);
        return NULL;
    }
    Py_DECREF(t);
    o->len = 0;
    return chunks;
}

static PyObject *encode(PyObject *self, PyObject *args)
{
    PyObject *values_obj, *keys_obj, *headers, *ts_obj, *idx_obj;
    long long default_ts;
    Py_ssize_t start, stop, max_bytes;
    if (!PyArg_ParseTuple(args, "OOOOLOnnn", &values_obj, &keys_obj, &headers, &ts_obj,
                          &default_ts, &idx_obj, &start, &stop, &max_bytes))
        return NULL;
    Col values, keys;
    Py_buffer ts = {0}, idx = {0};
    int has_ts = 0, has_idx = 0;
    Py_ssize_t n = -1;
    Out o = {NULL, 0, 0};
    PyObject *chunks = NULL;
    Py_ssize_t largest = 0;
    ArrowHeaders arrow_headers;
    memset(&keys, 0, sizeof(keys));
    memset(&arrow_headers, 0, sizeof(arrow_headers));
    if (col_init(&values, values_obj, "values", &n) < 0)
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_TypeError, "values: a list or an Arrow layout tuple");
        goto done;
    }
    if (col_init(&keys, keys_obj, "keys", &n) < 0)
        goto done;
    if (PyTuple_Check(headers) && PyTuple_GET_SIZE(headers) == 8) {
        if (ah_init(&arrow_headers, headers, n) < 0)
            goto done;
    } else if (headers != Py_None
               && (!PyList_Check(headers) || PyList_GET_SIZE(headers) != n)) {
        PyErr_Format(PyExc_ValueError, "headers: a list of %zd rows' headers", n);
        goto done;
    }
    if (ts_obj != Py_None) {
        if (PyObject_GetBuffer(ts_obj, &ts, PyBUF_SIMPLE) < 0)
            goto done;
        has_ts = 1;
        if (ts.len != 8 * n) {
            PyErr_Format(PyExc_ValueError, "timestamps: %zd bytes for %zd rows", ts.len, n);
            goto done;
        }
    }
    Py_ssize_t limit = n;
    if (idx_obj != Py_None) {
        if (PyObject_GetBuffer(idx_obj, &idx, PyBUF_SIMPLE) < 0)
            goto done;
        has_idx = 1;
        limit = idx.len / 4;
    }
    if (start < 0 || stop < start || stop > limit) {
        PyErr_Format(PyExc_ValueError, "rows %zd..%zd outside 0..%zd", start, stop, limit);
        goto done;
    }
    chunks = PyList_New(0);
    if (!chunks)
        goto done;
    Py_ssize_t in_chunk = 0;
    int64_t base_ts = 0, max_ts = 0;
    for (Py_ssize_t k = start; k < stop; k++) {
        Py_ssize_t row = k;
        if (has_idx) {
            int32_t r;
            memcpy(&r, (const char *)idx.buf + 4 * k, 4);
            if (r < 0 || r >= n) {
                PyErr_Format(PyExc_ValueError, "index %zd: row %d outside 0..%zd", k, (int)r, n);
                goto fail;
            }
            row = r;
        }
        const char *kp = NULL, *vp = NULL;
        Py_ssize_t kl = 0, vl = 0, hsize;
        int knull = col_get(&keys, row, &kp, &kl);
        if (knull < 0)
            goto fail;
        int vnull = col_get(&values, row, &vp, &vl);
        if (vnull < 0)
            goto fail;
        PyObject *hrow = arrow_headers.on || headers == Py_None ? Py_None
                                                                : PyList_GET_ITEM(headers, row);
        if ((arrow_headers.on ? arrow_row_headers(&arrow_headers, row, &hsize, NULL)
                              : row_headers(hrow, row, &hsize, NULL)) < 0)
            goto fail;
        int64_t t = default_ts;
        if (has_ts)
            memcpy(&t, (const char *)ts.buf + 8 * row, 8);
        /* A record joins the current section if it fits, else starts the next one. The
         * timestamp delta (from the section's first record) is known only then; its size is
         * part of the decision, so size the record against each candidate base. */
        for (int attempt = 0; attempt < 2; attempt++) {
            if (in_chunk == 0)
                base_ts = max_ts = t;
            Py_ssize_t body = 1 + varint_size((int64_t)((uint64_t)t - (uint64_t)base_ts)) + varint_size(in_chunk)
                + (knull ? 1 : varint_size(kl) + kl) + (vnull ? 1 : varint_size(vl) + vl)
                + hsize;
            Py_ssize_t rec = varint_size(body) + body;
            if (in_chunk > 0 && o.len + rec > max_bytes) {
                if (!finish_chunk(&o, in_chunk, base_ts, max_ts, chunks))
                    goto fail;
                in_chunk = 0;
                continue;
            }
            if (rec > largest)
                largest = rec;
            if (out_reserve(&o, rec) < 0)
                goto fail;
            uint8_t *w = o.buf + o.len;
            w = put_varint(w, body);
            *w++ = 0; /* attributes */
            w = put_varint(w, (int64_t)((uint64_t)t - (uint64_t)base_ts));
            w = put_varint(w, in_chunk);
            if (knull) {
                w = put_varint(w, -1);
            } else {
                w = put_varint(w, kl);
                if (kl)
                    memcpy(w, kp, (size_t)kl);
                w += kl;
            }
            if (vnull) {
                w = put_varint(w, -1);
            } else {
                w = put_varint(w, vl);
                if (vl)
                    memcpy(w, vp, (size_t)vl);
                w += vl;
            }
            if ((arrow_headers.on ? arrow_row_headers(&arrow_headers, row, &hsize, &w)
                                  : row_headers(hrow, row, &hsize, &w)) < 0)
                goto fail;
            o.len += rec;
            if (t > max_ts)
                max_ts = t;
            in_chunk++;
            break;
        }
    }
    if (in_chunk > 0 && !finish_chunk(&o, in_chunk, base_ts, max_ts, chunks))
        goto fail;
    goto done;
fail:
    Py_CLEAR(chunks);
done:
    col_release(&values);
    col_release(&keys);
    ah_release(&arrow_headers);
    if (has_ts)
        PyBuffer_Release(&ts);
    if (has_idx)
        PyBuffer_Release(&idx);
    PyMem_Free(o.buf);
    if (!chunks)
        return NULL;
    return Py_BuildValue("(Nn)", chunks, largest);
}

/* --- partitioning ------------------------------------------------------------------------ */

/* Kafka's Utils.murmur2, as client/partitioner.py has it. */
static int32_t murmur2(const uint8_t *data, Py_ssize_t length)
{
    const uint32_t m = 0x5bd1e995;
    const int r = 24;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    Py_ssize_t nblocks = length / 4;
    for (Py_ssize_t i = 0; i < nblocks; i++) {
        const uint8_t *p = data + 4 * i;
        uint32_t k = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16)
            | ((uint32_t)p[3] << 24);
        k *= m;
        k ^= k >> r;
        k *= m;
        h *= m;
        h ^= k;
    }
    const uint8_t *tail = data + 4 * nblocks;
    switch (length & 3) {
    case 3:
        h ^= (uint32_t)tail[2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)tail[1] << 8;
        /* fall through */
    case 1:
        h ^= tail[0];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return (int32_t)h;
}

static PyObject *partition_keys(PyObject *self, PyObject *args)
{
    PyObject *keys_obj;
    long num;
    if (!PyArg_ParseTuple(args, "Ol", &keys_obj, &num))
        return NULL;
    if (num <= 0) {
        PyErr_SetString(PyExc_ValueError, "num_partitions must be positive");
        return NULL;
    }
    Col keys;
    Py_ssize_t n = -1;
    if (col_init(&keys, keys_obj, "keys", &n) < 0)
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_TypeError, "keys: a list or an Arrow layout tuple");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, 4 * n);
    if (!out)
        goto done;
    int32_t *w = (int32_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t row = 0; row < n; row++) {
        const char *p;
        Py_ssize_t len;
        int isnull = col_get(&keys, row, &p, &len);
        if (isnull < 0) {
            Py_CLEAR(out);
            goto done;
        }
        w[row] = isnull ? -1
                        : (int32_t)((murmur2((const uint8_t *)p, len) & 0x7fffffff) % num);
    }
done:
    col_release(&keys);
    return out;
}

static PyObject *group_rows(PyObject *self, PyObject *args)
{
    Py_buffer parts;
    long num, null_partition;
    if (!PyArg_ParseTuple(args, "y*ll", &parts, &num, &null_partition))
        return NULL;
    PyObject *indices = NULL, *starts = NULL;
    Py_ssize_t n = parts.len / 4;
    const int32_t *p = (const int32_t *)parts.buf;
    int64_t *s;
    if (num <= 0 || null_partition < -1 || null_partition >= num) {
        PyErr_SetString(PyExc_ValueError, "group_rows: bad partition count");
        goto done;
    }
    starts = PyBytes_FromStringAndSize(NULL, 8 * (num + 1));
    indices = PyBytes_FromStringAndSize(NULL, 4 * n);
    if (!starts || !indices)
        goto fail;
    s = (int64_t *)PyBytes_AS_STRING(starts);
    memset(s, 0, 8 * (size_t)(num + 1));
    for (Py_ssize_t row = 0; row < n; row++) {
        int32_t q;
        memcpy(&q, p + row, 4);
        if (q == -1 && null_partition >= 0)
            q = (int32_t)null_partition;
        if (q < 0 || q >= num) {
            PyErr_Format(PyExc_ValueError, "row %zd: partition %d outside 0..%ld", row, (int)q,
                         num - 1);
            goto fail;
        }
        s[q + 1]++;
    }
    for (long k = 0; k < num; k++)
        s[k + 1] += s[k];
    int32_t *w = (int32_t *)PyBytes_AS_STRING(indices);
    int64_t *next = PyMem_Malloc(8 * (size_t)num);
    if (!next) {
        PyErr_NoMemory();
        goto fail;
    }
    memcpy(next, s, 8 * (size_t)num);
    for (Py_ssize_t row = 0; row < n; row++) {
        int32_t q;
        memcpy(&q, p + row, 4);
        if (q == -1)
            q = (int32_t)null_partition;
        w[next[q]++] = (int32_t)row;
    }
    PyMem_Free(next);
    goto done;
fail:
    Py_CLEAR(indices);
    Py_CLEAR(starts);
done:
    PyBuffer_Release(&parts);
    if (!indices)
        return NULL;
    return Py_BuildValue("(NN)", indices, starts);
}

static PyMethodDef methods[] = {
    {"encode", encode, METH_VARARGS,
     "encode(values, keys, headers, timestamps, default_ts, indices, start, stop, max_bytes)"
     " -> ([(section, count, base_timestamp, max_timestamp)], largest record)"},
    {"decode", columnar_decode, METH_VARARGS,
     "decode(data, count, base_offset, base_timestamp, has_lat, lat, timestamp_type, "
     "min_offset, buffers, counters) -> rows appended; ValueError on a malformed section"},
    {"binary_list", columnar_binary_list, METH_VARARGS,
     "binary_list(validity, offsets, data, start, stop) -> rows as bytes or None"},
    {"partition_keys", partition_keys, METH_VARARGS,
     "partition_keys(keys, num_partitions) -> int32 partition per row (-1: null key)"},
    {"group_rows", group_rows, METH_VARARGS,
     "group_rows(partitions, num_partitions, null_partition) -> (int32 row indices by "
     "partition, int64 start of each partition's rows)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_columnar", "Records sections to and from columns, in C.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__columnar(void) { return PyModule_Create(&module); }
