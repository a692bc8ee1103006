/*
 * mysql_rows.c (capturer._fastrows): the per-table-map row decoder of capturer/regions/mysql/rowdecode.py,
 * in C. It decodes the body of a binlog rows event (after the column bitmaps)
 * with a plan made once per table map, and returns exactly what the Python
 * decoder returns: a list of (image, after-image-or-None) tuples of dicts.
 * Python-visible: the type Plan (Plan(names, specs).rows(data, update)).
 *
 * It is optional: setup.py builds it where a C compiler is present, and
 * rowdecode.py uses the Python decoder when it is missing. An integration test
 * compares both, and the library, on every column type.
 *
 * Every read is bounds-checked: a truncated event raises ValueError (the
 * Python decoder would raise IndexError or misread), never reads past the end.
 */
#include "fastrows.h"
#include <datetime.h>

FR_DATETIME_IMPORT(fr_mysql_rows_datetime)

enum {
    K_INT = 1, K_FLOAT, K_DOUBLE, K_YEAR, K_STR, K_DECIMAL, K_DATETIME2, K_TIMESTAMP2,
    K_TIME2, K_DATE, K_ENUM, K_SET, K_BIT
};

typedef struct {
    int kind;
    int a;           /* INT: size; STR: length prefix; DECIMAL: precision; *2: fsp; ENUM/SET: size; BIT: nbits */
    int b;           /* INT: unsigned; DECIMAL: scale; BIT: nbytes */
    int utf8;        /* STR: the encoding is utf-8 (fast path) */
    const char *enc; /* STR: codec name, NULL = keep bytes */
    const char *errors; /* STR: codec error handler name */
    PyObject *values;/* ENUM/SET: tuple of names or NULL */
} Col;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    PyObject *names;  /* tuple of str */
    PyObject *keep;   /* list of objects the Col fields point into */
    Col *cols;
} Plan;

static const int DIG2BYTES[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};

static void plan_dealloc(Plan *self) {
    PyMem_Free(self->cols);
    Py_XDECREF(self->names);
    Py_XDECREF(self->keep);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int get_int(PyObject *spec, Py_ssize_t i, int *out) {
    if (PyTuple_GET_SIZE(spec) <= i) {
        PyErr_SetString(PyExc_ValueError, "column spec too short");
        return -1;
    }
    long v = PyLong_AsLong(PyTuple_GET_ITEM(spec, i));
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < INT_MIN || v > INT_MAX) {  /* not truncated into a plausible value */
        PyErr_SetString(PyExc_OverflowError, "column spec value out of range");
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int plan_init(Plan *self, PyObject *args, PyObject *kw) {
    PyObject *names, *specs;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &names, &PyTuple_Type, &specs)) return -1;
    if (self->cols || self->names) { /* (a second __init__ would leave a half-checked plan in place) */
        PyErr_SetString(PyExc_TypeError, "a Plan is initialized once");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (PyTuple_GET_SIZE(specs) != n) {
        PyErr_SetString(PyExc_ValueError, "names and specs differ in length");
        return -1;
    }
    self->cols = PyMem_Calloc(n ? n : 1, sizeof(Col));
    if (!self->cols) { PyErr_NoMemory(); return -1; }
    self->keep = PyList_New(0);
    if (!self->keep) return -1;
    Py_INCREF(names);
    self->names = names;
    self->n = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *spec = PyTuple_GET_ITEM(specs, i);
        Col *c = &self->cols[i];
        if (!PyTuple_Check(spec) || !PyUnicode_Check(PyTuple_GET_ITEM(names, i))) {
            PyErr_SetString(PyExc_TypeError, "a spec is a tuple, a name a str");
            return -1;
        }
        if (get_int(spec, 0, &c->kind) < 0) return -1;
        switch (c->kind) {
        case K_INT:
        case K_DECIMAL:
        case K_BIT:
            if (get_int(spec, 1, &c->a) < 0 || get_int(spec, 2, &c->b) < 0) return -1;
            /* the ranges a table map describes; others would make the decoder read outside the event */
            if ((c->kind == K_INT && (c->a < 1 || c->a > 8))
                || (c->kind == K_DECIMAL && (c->a < 1 || c->a > 65 || c->b < 0 || c->b > c->a))
                || (c->kind == K_BIT && (c->a < 1 || c->a > 64 || c->b < 1 || c->b > 8))) {
                PyErr_Format(PyExc_ValueError, "bad column spec (kind %d: %d, %d)", c->kind, c->a, c->b);
                return -1;
            }
            break;
        case K_STR: {
            if (get_int(spec, 1, &c->a) < 0) return -1;
            if (c->a < 1 || c->a > 4) { PyErr_SetString(PyExc_ValueError, "bad length prefix"); return -1; }
            PyObject *enc = PyTuple_Size(spec) > 2 ? PyTuple_GET_ITEM(spec, 2) : Py_None;
            if (enc != Py_None) {
                if (PyList_Append(self->keep, enc) < 0) return -1;
                c->enc = PyUnicode_AsUTF8(enc);
                if (!c->enc) return -1;
                c->utf8 = strcmp(c->enc, "utf-8") == 0 || strcmp(c->enc, "utf8") == 0;
            }
            PyObject *errors = PyTuple_Size(spec) > 3 ? PyTuple_GET_ITEM(spec, 3) : Py_None;
            if (errors != Py_None) {
                if (PyList_Append(self->keep, errors) < 0) return -1;
                c->errors = PyUnicode_AsUTF8(errors);
                if (!c->errors) return -1;
            }
            break;
        }
        case K_DATETIME2:
        case K_TIMESTAMP2:
        case K_TIME2:
            if (get_int(spec, 1, &c->a) < 0) return -1;
            if (c->a < 0 || c->a > 6) { PyErr_SetString(PyExc_ValueError, "bad fsp"); return -1; }
            break;
        case K_ENUM:
        case K_SET: {
            if (get_int(spec, 1, &c->a) < 0) return -1;
            if (c->a < 1 || c->a > 8) { PyErr_SetString(PyExc_ValueError, "bad enum/set size"); return -1; }
            PyObject *vals = PyTuple_Size(spec) > 2 ? PyTuple_GET_ITEM(spec, 2) : Py_None;
            if (vals != Py_None) {
                if (!PyTuple_Check(vals)) { PyErr_SetString(PyExc_TypeError, "values must be a tuple"); return -1; }
                if (PyList_Append(self->keep, vals) < 0) return -1;
                c->values = vals;
            }
            break;
        }
        case K_FLOAT: case K_DOUBLE: case K_YEAR: case K_DATE:
            break;
        default:
            PyErr_Format(PyExc_ValueError, "unknown column kind %d", c->kind);
            return -1;
        }
    }
    return 0;
}

#define NEED(k) do { if (o + (Py_ssize_t)(k) > end) goto truncated; } while (0)

static int64_t be_signed(const unsigned char *p, int n) {
    /* big-endian, two's complement over n bytes (1..8) */
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    if (n < 8 && (v & ((uint64_t)1 << (8 * n - 1)))) v |= ~(uint64_t)0 << (8 * n);
    return (int64_t)v;
}

/* fractional seconds as the library reads them: signed big-endian, odd fsp / 10 */
static int64_t frac_us(const unsigned char *p, int fsp) {
    int nb = (fsp + 1) / 2;
    if (nb == 0) return 0;
    int64_t v = be_signed(p, nb);
    if (fsp % 2) v = v / 10; /* int(v / 10): truncation toward zero, as C does */
    int64_t scale = 1;
    for (int i = fsp; i < 6; i++) scale *= 10;
    return v * scale;
}

/* v in decimal, zero-padded to width, at s + sl (fmt_uint; snprintf for a negative v: a corrupt body's, whose
   text Decimal() then refuses as the Python decoder's does); the new length */
static int put_group(char *s, int sl, int cap, long long v, int width) {
    if (v >= 0 && sl + 20 < cap) return (int)(fmt_uint(s + sl, (unsigned long long)v, width) - s);
    return sl + snprintf(s + sl, cap - sl, "%0*lld", width, v);
}

static PyObject *decode_decimal(const unsigned char *src, int precision, int scale_) {
    int intg = precision - scale_;
    int intg0 = intg / 9, intg0x = intg % 9, frac0 = scale_ / 9, frac0x = scale_ % 9;
    int lead = DIG2BYTES[intg0x], tail = DIG2BYTES[frac0x];
    int size = lead + intg0 * 4 + frac0 * 4 + tail;
    unsigned char b[64];
    char s[160];
    int sl = 0, p = 0;
    if (size > (int)sizeof(b)) { PyErr_SetString(PyExc_ValueError, "decimal too wide"); return NULL; }
    memcpy(b, src, size);
    int negative = !(b[0] & 0x80);
    b[0] ^= 0x80;
    int64_t mask = negative ? -1 : 0;
    if (negative) s[sl++] = '-';
    if (lead) {
        sl = put_group(s, sl, (int)sizeof(s), (long long)(be_signed(b + p, lead) ^ mask), 0);
        p += lead;
    }
    for (int i = 0; i < intg0; i++) {
        sl = put_group(s, sl, (int)sizeof(s), (long long)((int32_t)be_signed(b + p, 4) ^ mask), 9);
        p += 4;
    }
    s[sl++] = '.';
    for (int i = 0; i < frac0; i++) {
        sl = put_group(s, sl, (int)sizeof(s), (long long)((int32_t)be_signed(b + p, 4) ^ mask), 9);
        p += 4;
    }
    if (tail) sl = put_group(s, sl, (int)sizeof(s), (long long)(be_signed(b + p, tail) ^ mask), frac0x);
    if (sl >= (int)sizeof(s)) { PyErr_SetString(PyExc_ValueError, "decimal too long"); return NULL; }
    PyObject *d = dec_from_text(s, sl); /* (decimal.c: Decimal(s) without a str parsed) */
    if (d || PyErr_Occurred()) return d;
    return PyObject_CallFunction(Decimal, "s#", s, (Py_ssize_t)sl);
}

static int decimal_size(int precision, int scale_) {
    int intg = precision - scale_;
    return DIG2BYTES[intg % 9] + (intg / 9) * 4 + (scale_ / 9) * 4 + DIG2BYTES[scale_ % 9];
}

static PyObject *value_error_to_none(void) {
    if (PyErr_ExceptionMatches(PyExc_ValueError)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return NULL;
}

/* one column value at d[*po]; NULL with an exception set on error */
static PyObject *decode_col(const Col *c, const unsigned char *d, Py_ssize_t *po, Py_ssize_t end) {
    Py_ssize_t o = *po;
    PyObject *v = NULL;
    switch (c->kind) {
    case K_INT: {
        int sz = c->a;
        NEED(sz);
        uint64_t u = le_unsigned(d + o, sz);
        if (c->b) v = PyLong_FromUnsignedLongLong(u);
        else {
            int64_t s = (int64_t)u;
            if (sz < 8 && (u & ((uint64_t)1 << (8 * sz - 1)))) s = (int64_t)(u | (~(uint64_t)0 << (8 * sz)));
            v = PyLong_FromLongLong(s);
        }
        o += sz;
        break;
    }
    case K_FLOAT:
        NEED(4);
        v = PyFloat_FromDouble(PyFloat_Unpack4((const char *)d + o, 1));
        o += 4;
        break;
    case K_DOUBLE:
        NEED(8);
        v = PyFloat_FromDouble(PyFloat_Unpack8((const char *)d + o, 1));
        o += 8;
        break;
    case K_YEAR:
        NEED(1);
        v = PyLong_FromLong(d[o] ? d[o] + 1900 : 0); /* 0 is the zero year '0000' */
        o += 1;
        break;
    case K_STR: {
        int pre = c->a;
        NEED(pre);
        Py_ssize_t n = (Py_ssize_t)le_unsigned(d + o, pre);
        o += pre;
        NEED(n);
        const char *raw = (const char *)d + o;
        if (!c->enc) v = PyBytes_FromStringAndSize(raw, n);
        else if (c->utf8) v = PyUnicode_DecodeUTF8(raw, n, NULL);
        else v = PyUnicode_Decode(raw, n, c->enc, c->errors);
        o += n;
        break;
    }
    case K_DECIMAL: {
        int sz = decimal_size(c->a, c->b);
        NEED(sz);
        v = decode_decimal(d + o, c->a, c->b);
        o += sz;
        break;
    }
    case K_DATETIME2: {
        int nf = (c->a + 1) / 2;
        NEED(5 + nf);
        uint64_t x = 0;
        for (int i = 0; i < 5; i++) x = (x << 8) | d[o + i];
        int64_t ym = (x >> 22) & 0x1FFFF;
        int64_t us = frac_us(d + o + 5, c->a);
        /* as the Python decoder: an impossible date is None, then a bad fraction raises */
        v = PyDateTime_FromDateAndTime((int)(ym / 13), (int)(ym % 13), (int)((x >> 17) & 31), (int)((x >> 12) & 31),
                                       (int)((x >> 6) & 63), (int)(x & 63), (us > 0 && us <= 999999) ? (int)us : 0);
        if (!v) v = value_error_to_none();
        else if (us > 999999 && v != Py_None) {
            Py_DECREF(v);
            PyErr_SetString(PyExc_ValueError, "microsecond must be in 0..999999");
            return NULL;
        }
        o += 5 + nf;
        break;
    }
    case K_TIMESTAMP2: {
        int nf = (c->a + 1) / 2;
        NEED(4 + nf);
        /* unsigned seconds, as the server reads them (my_timestamp_from_binary: mi_uint4korr): MariaDB 11.5+
           keeps TIMESTAMP up to 2106-02-07 06:28:15 UTC, past 2^31 s (read signed: 1901-1969) */
        uint32_t secs = (uint32_t)be_signed(d + o, 4);
        int64_t us = frac_us(d + o + 4, c->a);
        if (us > 999999) { PyErr_SetString(PyExc_ValueError, "microsecond must be in 0..999999"); return NULL; }
        if (secs == 0) {
            /* the zero TIMESTAMP ('0000-00-00 00:00:00', stored as 0 s: 1970-01-01 00:00:00 UTC is below the
               type's range), a date no calendar has: None, as a zero DATETIME (rowdecode.py's _timestamp2) */
            v = Py_None;
            Py_INCREF(v);
            o += 4 + nf;
            break;
        }
        PyObject *delta = PyDelta_FromDSU((int)(secs / 86400), (int)(secs % 86400), us > 0 ? (int)us : 0);
        if (!delta) return NULL;
        v = PyNumber_Add(Epoch, delta);
        Py_DECREF(delta);
        o += 4 + nf;
        break;
    }
    case K_TIME2: {
        /* MySQL's packed TIME (my_time_packed_from_binary); see time2_packed() in rowdecode.py */
        int fsp = c->a;
        int nf = (fsp + 1) / 2;
        NEED(3 + nf);
        int64_t packed;
        if (fsp >= 5) {
            uint64_t u = 0;
            for (int k = 0; k < 6; k++) u = (u << 8) | d[o + k];
            packed = (int64_t)u - 0x800000000000LL;
        } else {
            int64_t ip = (int64_t)(((uint32_t)d[o] << 16) | ((uint32_t)d[o + 1] << 8) | d[o + 2]) - 0x800000;
            if (fsp == 0) {
                packed = ip * (1LL << 24);
            } else {
                int64_t frac, unit, span;
                if (fsp <= 2) { frac = d[o + 3]; unit = 10000; span = 0x100; }
                else { frac = ((int64_t)d[o + 3] << 8) | d[o + 4]; unit = 100; span = 0x10000; }
                if (ip < 0 && frac) { ip += 1; frac -= span; }
                packed = ip * (1LL << 24) + frac * unit;
            }
        }
        int64_t a = packed < 0 ? -packed : packed;
        int64_t ipart = a >> 24;
        int64_t total = ((((ipart >> 12) & 0x3FF) * 60 + ((ipart >> 6) & 63)) * 60 + (ipart & 63)) * 1000000LL
                        + (a & 0xFFFFFF);
        if (packed < 0) total = -total;
        const int64_t day = 86400LL * 1000000LL;
        int64_t days = total / day, rem = total % day;
        if (rem < 0) { rem += day; days -= 1; }
        v = PyDelta_FromDSU((int)days, (int)(rem / 1000000), (int)(rem % 1000000));
        o += 3 + nf;
        break;
    }
    case K_DATE: {
        NEED(3);
        unsigned x = d[o] | (d[o + 1] << 8) | (d[o + 2] << 16);
        unsigned y = (x >> 9) & 0x7FFF, m = (x >> 5) & 15, dd = x & 31;
        o += 3;
        if (x == 0 || y == 0 || m == 0 || dd == 0) { Py_INCREF(Py_None); v = Py_None; }
        else {
            v = PyDate_FromDate((int)y, (int)m, (int)dd);
            if (!v) v = value_error_to_none();
        }
        break;
    }
    case K_ENUM: {
        NEED(c->a);
        uint64_t idx = le_unsigned(d + o, c->a);
        o += c->a;
        if (!c->values || PyTuple_GET_SIZE(c->values) == 0) { Py_INCREF(Py_None); v = Py_None; }
        else if (idx >= (uint64_t)PyTuple_GET_SIZE(c->values)) {
            PyErr_SetString(PyExc_IndexError, "enum index out of range");
            return NULL;
        } else {
            v = PyTuple_GET_ITEM(c->values, (Py_ssize_t)idx);
            Py_INCREF(v);
        }
        break;
    }
    case K_SET: {
        NEED(c->a);
        uint64_t mask = le_unsigned(d + o, c->a);
        o += c->a;
        if (!c->values || PyTuple_GET_SIZE(c->values) == 0) { Py_INCREF(Py_None); v = Py_None; break; }
        v = PySet_New(NULL);
        if (!v) return NULL;
        Py_ssize_t nv = PyTuple_GET_SIZE(c->values);
        for (Py_ssize_t i = 0; i < nv && i < 64; i++) {
            if (mask & ((uint64_t)1 << i)) {
                if (PySet_Add(v, PyTuple_GET_ITEM(c->values, i)) < 0) { Py_DECREF(v); return NULL; }
            }
        }
        break;
    }
    case K_BIT: {
        int nbits = c->a, nbytes = c->b;
        NEED(nbytes);
        if (nbits < 1 || nbits > 64 || nbytes > 8) { PyErr_SetString(PyExc_ValueError, "bad BIT width"); return NULL; }
        uint64_t x = 0;
        for (int i = 0; i < nbytes; i++) x = (x << 8) | d[o + i];
        char s[65];
        for (int i = 0; i < nbits; i++) s[i] = (x >> (nbits - 1 - i)) & 1 ? '1' : '0';
        v = PyUnicode_FromStringAndSize(s, nbits);
        o += nbytes;
        break;
    }
    default:
        PyErr_SetString(PyExc_ValueError, "unknown column kind");
        return NULL;
    }
    *po = o;
    return v;
truncated:
    PyErr_Format(PyExc_ValueError, "rows event truncated at byte %zd", o);
    return NULL;
}

static PyObject *decode_row(Plan *p, const unsigned char *d, Py_ssize_t *po, Py_ssize_t end) {
    Py_ssize_t o = *po;
    Py_ssize_t nullb = (p->n + 7) / 8;
    if (o + nullb > end) {
        PyErr_Format(PyExc_ValueError, "rows event truncated at byte %zd", o);
        return NULL;
    }
    const unsigned char *nb = d + o;
    o += nullb;
    PyObject *row = _PyDict_NewPresized(p->n);
    if (!row) return NULL;
    for (Py_ssize_t i = 0; i < p->n; i++) {
        PyObject *v;
        if (nb[i >> 3] & (1 << (i & 7))) {
            Py_INCREF(Py_None);
            v = Py_None;
        } else {
            v = decode_col(&p->cols[i], d, &o, end);
            if (!v) { Py_DECREF(row); return NULL; }
        }
        int r = PyDict_SetItem(row, PyTuple_GET_ITEM(p->names, i), v);
        Py_DECREF(v);
        if (r < 0) { Py_DECREF(row); return NULL; }
    }
    *po = o;
    return row;
}

static PyObject *plan_rows(Plan *self, PyObject *args) {
    Py_buffer buf;
    int update;
    if (!PyArg_ParseTuple(args, "y*p", &buf, &update)) return NULL;
    const unsigned char *d = buf.buf;
    Py_ssize_t o = 0, end = buf.len;
    PyObject *out = NULL;
    if (self->n == 0 && end > 0) {  /* a row of no columns takes no bytes: it would never end */
        PyErr_SetString(PyExc_ValueError, "row bytes for a plan without columns");
        goto fail;
    }
    out = PyList_New(0);
    if (!out) goto fail;
    while (o < end) {
        PyObject *a = decode_row(self, d, &o, end);
        if (!a) goto fail;
        PyObject *b;
        if (update) {
            b = decode_row(self, d, &o, end);
            if (!b) { Py_DECREF(a); goto fail; }
        } else {
            Py_INCREF(Py_None);
            b = Py_None;
        }
        PyObject *t = PyTuple_Pack(2, a, b);
        Py_DECREF(a);
        Py_DECREF(b);
        if (!t) goto fail;
        /* (the pair of untracked images need not be walked by the collector: the tuple is short-lived) */
        if (!PyObject_GC_IsTracked(a) && !PyObject_GC_IsTracked(b)) PyObject_GC_UnTrack(t);
        int r = PyList_Append(out, t);
        Py_DECREF(t);
        if (r < 0) goto fail;
    }
    PyBuffer_Release(&buf);
    return out;
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&buf);
    return NULL;
}

static PyMethodDef plan_methods[] = {
    {"rows", (PyCFunction)plan_rows, METH_VARARGS,
     "rows(data, update) -> [(image, after_or_None), ...] for the rows of one event"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "capturer._fastrows.Plan",
    .tp_basicsize = sizeof(Plan),
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(names, specs): a decoder for one table map",
    .tp_methods = plan_methods,
    .tp_init = (initproc)plan_init,
    .tp_new = PyType_GenericNew,
};

