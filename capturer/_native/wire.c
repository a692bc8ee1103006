/*
 * wire.c (capturer._fastrows): the wire format's rows and values (capturer/model/wire.py) written as msgpack,
 * for the agents' streams, the sender processes' pipes and the backlog (wire_read.c reads them back).
 * Python-visible: wire_rows, wire_pack, wire_setup.
 */
#include "fastrows.h"
#include <datetime.h>

FR_DATETIME_IMPORT(fr_wire_datetime)

/* The wire format's rows (capturer/model/wire.py) as msgpack, in C: what    */
/* Encoder._rows + packb and Decoder.rows + unpackb's ext_hook do in Python, */
/* for the agents' streams, the sender processes' pipes and the backlog.     */
/* Extension types: 1 Decimal, 2 datetime, 3 date, 4 time, 5 timedelta,      */
/* 6 set, 7 integer beyond 64 bits (see wire.py). A value of another type,   */
/* or an aware datetime/time, goes to the caller's fallback (wire._default). */

static PyObject *WireExtType = NULL;  /* msgpack.ExtType, set by wire_setup */
PyObject *WireSlowHook = NULL;        /* wire._ext_hook, for what wire_read.c's ext_make leaves (wire_setup) */

static int mp_put_u8(Buf *b, unsigned char c) { return buf_put(b, (const char *)&c, 1); }

static int mp_put_be(Buf *b, unsigned char tag, uint64_t v, int nbytes) {
    unsigned char t[9];
    t[0] = tag;
    for (int i = 0; i < nbytes; i++) t[1 + i] = (unsigned char)(v >> (8 * (nbytes - 1 - i)));
    return buf_put(b, (const char *)t, 1 + nbytes);
}

static int mp_array(Buf *b, Py_ssize_t n) {
    if (n < 16) return mp_put_u8(b, (unsigned char)(0x90 | n));
    if (n < 65536) return mp_put_be(b, 0xdc, (uint64_t)n, 2);
    return mp_put_be(b, 0xdd, (uint64_t)n, 4);
}

static int mp_map(Buf *b, Py_ssize_t n) {
    if (n < 16) return mp_put_u8(b, (unsigned char)(0x80 | n));
    if (n < 65536) return mp_put_be(b, 0xde, (uint64_t)n, 2);
    return mp_put_be(b, 0xdf, (uint64_t)n, 4);
}

static int mp_str(Buf *b, const char *s, Py_ssize_t n) {
    int rc;
    if (n < 32) rc = mp_put_u8(b, (unsigned char)(0xa0 | n));
    else if (n < 256) rc = mp_put_be(b, 0xd9, (uint64_t)n, 1);
    else if (n < 65536) rc = mp_put_be(b, 0xda, (uint64_t)n, 2);
    else rc = mp_put_be(b, 0xdb, (uint64_t)n, 4);
    return rc < 0 ? -1 : buf_put(b, s, n);
}

static int mp_bin(Buf *b, const char *s, Py_ssize_t n) {
    int rc;
    if (n < 256) rc = mp_put_be(b, 0xc4, (uint64_t)n, 1);
    else if (n < 65536) rc = mp_put_be(b, 0xc5, (uint64_t)n, 2);
    else rc = mp_put_be(b, 0xc6, (uint64_t)n, 4);
    return rc < 0 ? -1 : buf_put(b, s, n);
}

static int mp_ext(Buf *b, int code, const char *s, Py_ssize_t n) {
    unsigned char t[6];
    int tn;
    if (n == 1) { t[0] = 0xd4; tn = 1; }
    else if (n == 2) { t[0] = 0xd5; tn = 1; }
    else if (n == 4) { t[0] = 0xd6; tn = 1; }
    else if (n == 8) { t[0] = 0xd7; tn = 1; }
    else if (n == 16) { t[0] = 0xd8; tn = 1; }
    else if (n < 256) { t[0] = 0xc7; t[1] = (unsigned char)n; tn = 2; }
    else if (n < 65536) { t[0] = 0xc8; t[1] = (unsigned char)(n >> 8); t[2] = (unsigned char)n; tn = 3; }
    else { t[0] = 0xc9; t[1] = (unsigned char)(n >> 24); t[2] = (unsigned char)(n >> 16);
           t[3] = (unsigned char)(n >> 8); t[4] = (unsigned char)n; tn = 5; }
    t[tn++] = (unsigned char)(signed char)code;
    if (buf_put(b, (const char *)t, tn) < 0) return -1;
    return buf_put(b, s, n);
}

static int mp_int(Buf *b, PyObject *o) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(o);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) return -2; /* beyond 64 bits */
        return mp_put_be(b, 0xcf, u, 8);
    }
    if (overflow < 0) return -2;
    if (v >= 0) {
        if (v < 128) return mp_put_u8(b, (unsigned char)v);
        if (v < 256) return mp_put_be(b, 0xcc, (uint64_t)v, 1);
        if (v < 65536) return mp_put_be(b, 0xcd, (uint64_t)v, 2);
        if (v < 4294967296LL) return mp_put_be(b, 0xce, (uint64_t)v, 4);
        return mp_put_be(b, 0xcf, (uint64_t)v, 8);
    }
    if (v >= -32) return mp_put_u8(b, (unsigned char)(signed char)v);
    if (v >= -128) return mp_put_be(b, 0xd0, (uint64_t)(uint8_t)(int8_t)v, 1);
    if (v >= -32768) return mp_put_be(b, 0xd1, (uint64_t)(uint16_t)(int16_t)v, 2);
    if (v >= -2147483648LL) return mp_put_be(b, 0xd2, (uint64_t)(uint32_t)(int32_t)v, 4);
    return mp_put_be(b, 0xd3, (uint64_t)v, 8);
}

/* "YYYY-MM-DD[THH:MM:SS[.ffffff]]" as datetime.isoformat() writes a naive value */
static char *iso_date(char *p, PyObject *o) {
    p = fmt_uint(p, (unsigned)PyDateTime_GET_YEAR(o), 4);
    *p++ = '-';
    p = fmt_uint(p, (unsigned)PyDateTime_GET_MONTH(o), 2);
    *p++ = '-';
    return fmt_uint(p, (unsigned)PyDateTime_GET_DAY(o), 2);
}

static char *iso_time(char *p, int h, int m, int sec, int us) {
    p = fmt_uint(p, (unsigned)h, 2);
    *p++ = ':';
    p = fmt_uint(p, (unsigned)m, 2);
    *p++ = ':';
    p = fmt_uint(p, (unsigned)sec, 2);
    if (us) {
        *p++ = '.';
        p = fmt_uint(p, (unsigned)us, 6);
    }
    return p;
}

static int mp_value(Buf *b, PyObject *o, PyObject *fallback, int depth);

static int mp_fallback(Buf *b, PyObject *o, PyObject *fallback, int depth) {
    /* wire._default(o): an ExtType, bytes, or raises TypeError */
    PyObject *r = PyObject_CallOneArg(fallback, o);
    if (!r) return -1;
    int rc;
    if (WireExtType && PyObject_TypeCheck(r, (PyTypeObject *)WireExtType) && PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2) {
        long code = PyLong_AsLong(PyTuple_GET_ITEM(r, 0));
        PyObject *data = PyTuple_GET_ITEM(r, 1);
        if ((code == -1 && PyErr_Occurred()) || !PyBytes_Check(data)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "fallback gave a bad ExtType");
            rc = -1;
        } else {
            rc = mp_ext(b, (int)code, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data));
        }
    } else if (r == o) {
        PyErr_SetString(PyExc_TypeError, "fallback returned its argument");
        rc = -1;
    } else {
        rc = mp_value(b, r, fallback, depth + 1);
    }
    Py_DECREF(r);
    return rc;
}

static int mp_value(Buf *b, PyObject *o, PyObject *fallback, int depth) {
    if (depth > 64) {
        PyErr_SetString(PyExc_ValueError, "nesting too deep");
        return -1;
    }
    if (o == Py_None) return mp_put_u8(b, 0xc0);
    if (o == Py_True) return mp_put_u8(b, 0xc3);
    if (o == Py_False) return mp_put_u8(b, 0xc2);
    if (PyUnicode_Check(o)) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(o, &n);
        if (s) return mp_str(b, s, n);
        PyErr_Clear();  /* a lone surrogate: kept as the Python encoder keeps it (surrogatepass) */
        PyObject *enc = PyUnicode_AsEncodedString(o, "utf-8", "surrogatepass");
        if (!enc) return -1;
        int rc = mp_str(b, PyBytes_AS_STRING(enc), PyBytes_GET_SIZE(enc));
        Py_DECREF(enc);
        return rc;
    }
    if (PyLong_Check(o)) {
        int rc = mp_int(b, o);
        if (rc == -2) {
            PyErr_Clear();
            return mp_fallback(b, o, fallback, depth);
        }
        return rc;
    }
    if (PyFloat_Check(o)) {
        union { double d; uint64_t u; } x;
        x.d = PyFloat_AS_DOUBLE(o);
        return mp_put_be(b, 0xcb, x.u, 8);
    }
    if (PyBytes_Check(o)) return mp_bin(b, PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o));
    if (Decimal && Py_TYPE(o) == (PyTypeObject *)Decimal) {
        char dt[DEC_TEXT_CAP];
        Py_ssize_t dn = dec_chars(o, DEC_STR, dt, sizeof(dt)); /* str(o)'s text without the str (decimal.c) */
        if (dn > 0) return mp_ext(b, 1, dt, dn);
        PyObject *t = PyObject_Str(o);
        if (!t) return -1;
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(t, &n);
        int rc = s ? mp_ext(b, 1, s, n) : -1;
        Py_DECREF(t);
        return rc;
    }
    if (PyDateTime_CheckExact(o) && ((PyDateTime_DateTime *)o)->hastzinfo == 0) {
        char tmp[40];
        char *p = iso_date(tmp, o);
        *p++ = 'T';
        p = iso_time(p, PyDateTime_DATE_GET_HOUR(o), PyDateTime_DATE_GET_MINUTE(o), PyDateTime_DATE_GET_SECOND(o),
                     PyDateTime_DATE_GET_MICROSECOND(o));
        if (PyDateTime_DATE_GET_FOLD(o)) return mp_fallback(b, o, fallback, depth);
        return mp_ext(b, 2, tmp, p - tmp);
    }
    if (PyDate_CheckExact(o)) {
        char tmp[16];
        char *p = iso_date(tmp, o);
        return mp_ext(b, 3, tmp, p - tmp);
    }
    if (PyTime_CheckExact(o) && ((PyDateTime_Time *)o)->hastzinfo == 0 && !PyDateTime_TIME_GET_FOLD(o)) {
        char tmp[24];
        char *p = iso_time(tmp, PyDateTime_TIME_GET_HOUR(o), PyDateTime_TIME_GET_MINUTE(o),
                           PyDateTime_TIME_GET_SECOND(o), PyDateTime_TIME_GET_MICROSECOND(o));
        return mp_ext(b, 4, tmp, p - tmp);
    }
    if (PyList_Check(o) || PyTuple_Check(o)) {
        PyObject *seq = o;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (mp_array(b, n) < 0) return -1;
        for (Py_ssize_t i = 0; i < n; i++)
            if (mp_value(b, PySequence_Fast_GET_ITEM(seq, i), fallback, depth + 1) < 0) return -1;
        return 0;
    }
    if (PyDict_Check(o)) {
        if (mp_map(b, PyDict_GET_SIZE(o)) < 0) return -1;
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(o, &pos, &k, &v)) {
            if (mp_value(b, k, fallback, depth + 1) < 0 || mp_value(b, v, fallback, depth + 1) < 0) return -1;
        }
        return 0;
    }
    return mp_fallback(b, o, fallback, depth);
}

/* the image as its values in the schema's column order if its keys are those columns in that order */
static int mp_image(Buf *b, PyObject *img, PyObject *cols, PyObject *fallback) {
    if (img == Py_None) return mp_put_u8(b, 0xc0);
    if (!PyDict_CheckExact(img)) return mp_value(b, img, fallback, 1);
    Py_ssize_t n = PyTuple_GET_SIZE(cols);
    int same = PyDict_GET_SIZE(img) == n;
    if (same) {
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *v;
        while (PyDict_Next(img, &pos, &k, &v)) {
            PyObject *c = PyTuple_GET_ITEM(cols, i++);
            if (k != c) {
                int eq = PyObject_RichCompareBool(k, c, Py_EQ);
                if (eq < 0) return -1;
                if (!eq) { same = 0; break; }
            }
        }
    }
    if (!same) return mp_value(b, img, fallback, 1);
    if (mp_array(b, n) < 0) return -1;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(img, &pos, &k, &v))
        if (mp_value(b, v, fallback, 2) < 0) return -1;
    return 0;
}

PyObject *S_schema, *S_op, *S_before, *S_after;

/* wire_rows(changes, sid_of, op_codes, fallback) -> bytes: the msgpack array of the
   changes' [sid, op, before, after]; sid_of(schema) -> int (called once per run of one
   schema), op_codes a dict op -> int */
PyObject *wire_rows(PyObject *self, PyObject *args) {
    PyObject *changes, *sid_of, *op_codes, *fallback;
    if (!PyArg_ParseTuple(args, "OOO!O", &changes, &sid_of, &PyDict_Type, &op_codes, &fallback)) return NULL;
    PyObject *seq = PySequence_Fast(changes, "changes must be a sequence");
    if (!seq) return NULL;
    Buf b = {NULL, 0, 0};
    PyObject *last_schema = NULL, *cols = NULL, *out = NULL;
    long sid = 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (mp_array(&b, n) < 0) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ch = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *schema = PyObject_GetAttr(ch, S_schema);
        if (!schema) goto fail;
        if (schema != last_schema) {
            PyObject *r = PyObject_CallOneArg(sid_of, schema);
            PyObject *c = r ? PyObject_GetAttrString(schema, "columns") : NULL;
            if (!r || !c || !PyTuple_Check(c)) {
                if (c && !PyTuple_Check(c)) PyErr_SetString(PyExc_TypeError, "schema.columns must be a tuple");
                Py_XDECREF(r);
                Py_XDECREF(c);
                Py_DECREF(schema);
                goto fail;
            }
            sid = PyLong_AsLong(r);
            Py_DECREF(r);
            if (sid == -1 && PyErr_Occurred()) { Py_DECREF(c); Py_DECREF(schema); goto fail; }
            Py_XDECREF(last_schema);
            Py_XDECREF(cols);
            last_schema = schema;  /* (keeps the reference) */
            cols = c;
        } else {
            Py_DECREF(schema);
        }
        PyObject *op = PyObject_GetAttr(ch, S_op);
        if (!op) goto fail;
        PyObject *code = PyDict_GetItemWithError(op_codes, op);
        Py_DECREF(op);
        if (!code) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "unknown op");
            goto fail;
        }
        PyObject *before = PyObject_GetAttr(ch, S_before);
        if (!before) goto fail;
        PyObject *after = PyObject_GetAttr(ch, S_after);
        if (!after) { Py_DECREF(before); goto fail; }
        int rc = mp_array(&b, 4);
        if (rc == 0) rc = sid < 128 && sid >= 0 ? mp_put_u8(&b, (unsigned char)sid)
                                              : mp_put_be(&b, sid < 256 ? 0xcc : sid < 65536 ? 0xcd : 0xce,
                                                          (uint64_t)(uint32_t)sid, sid < 256 ? 1 : sid < 65536 ? 2 : 4);
        if (rc == 0) rc = mp_int(&b, code);
        if (rc == 0) rc = mp_image(&b, before, cols, fallback);
        if (rc == 0) rc = mp_image(&b, after, cols, fallback);
        Py_DECREF(before);
        Py_DECREF(after);
        if (rc < 0) goto fail;
    }
    out = PyBytes_FromStringAndSize(b.p ? b.p : "", b.n);
fail:
    PyMem_Free(b.p);
    Py_XDECREF(last_schema);
    Py_XDECREF(cols);
    Py_DECREF(seq);
    return out;
}

/* wire_setup(ext_type, slow_hook): msgpack.ExtType, and the Python ext hook for what wire_ext leaves */
PyObject *wire_setup(PyObject *self, PyObject *args) {
    PyObject *ext, *hook;
    if (!PyArg_ParseTuple(args, "OO", &ext, &hook)) return NULL;
    Py_XSETREF(WireExtType, Py_NewRef(ext));
    Py_XSETREF(WireSlowHook, Py_NewRef(hook));
    Py_RETURN_NONE;
}

/* wire_pack(value, fallback) -> bytes: msgpack.packb(value, default=fallback, use_bin_type=True,
   unicode_errors="surrogatepass") for the values the wire format holds (wire.packb; the same bytes), without
   msgpack's Packer and its 256 KiB buffer made and freed at each call (above the capturer's malloc mmap
   threshold: an mmap and an munmap per value). ValueError past 64 levels of nesting (the caller's msgpack
   path takes those). */
PyObject *wire_pack(PyObject *self, PyObject *args) {
    PyObject *v, *fallback;
    if (!PyArg_ParseTuple(args, "OO", &v, &fallback)) return NULL;
    Buf b = {NULL, 0, 0};
    PyObject *out = NULL;
    if (mp_value(&b, v, fallback, 0) == 0) out = PyBytes_FromStringAndSize(b.p ? b.p : "", b.n);
    PyMem_Free(b.p);
    return out;
}
