/*
 * capturer._fastrows: the per-table-map row decoder of capturer/regions/rowdecode.py,
 * in C. It decodes the body of a binlog rows event (after the column bitmaps)
 * with a plan made once per table map, and returns exactly what the Python
 * decoder returns: a list of (image, after-image-or-None) tuples of dicts.
 *
 * It is optional: setup.py builds it where a C compiler is present, and
 * rowdecode.py uses the Python decoder when it is missing. An integration test
 * compares both, and the library, on every column type.
 *
 * Every read is bounds-checked: a truncated event raises ValueError (the
 * Python decoder would raise IndexError or misread), never reads past the end.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <stdint.h>
#include <string.h>

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

static PyObject *Decimal = NULL;
static PyObject *Epoch = NULL;
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
    *out = (int)v;
    return 0;
}

static int plan_init(Plan *self, PyObject *args, PyObject *kw) {
    PyObject *names, *specs;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &names, &PyTuple_Type, &specs)) return -1;
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

static uint64_t le_unsigned(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
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
        sl += snprintf(s + sl, sizeof(s) - sl, "%lld", (long long)(be_signed(b + p, lead) ^ mask));
        p += lead;
    }
    for (int i = 0; i < intg0; i++) {
        sl += snprintf(s + sl, sizeof(s) - sl, "%09lld", (long long)((int32_t)be_signed(b + p, 4) ^ mask));
        p += 4;
    }
    s[sl++] = '.';
    for (int i = 0; i < frac0; i++) {
        sl += snprintf(s + sl, sizeof(s) - sl, "%09lld", (long long)((int32_t)be_signed(b + p, 4) ^ mask));
        p += 4;
    }
    if (tail) sl += snprintf(s + sl, sizeof(s) - sl, "%0*lld", frac0x, (long long)(be_signed(b + p, tail) ^ mask));
    if (sl >= (int)sizeof(s)) { PyErr_SetString(PyExc_ValueError, "decimal too long"); return NULL; }
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
        v = PyLong_FromLong(d[o] + 1900);
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
        int32_t secs = (int32_t)be_signed(d + o, 4);
        int64_t us = frac_us(d + o + 4, c->a);
        if (us > 999999) { PyErr_SetString(PyExc_ValueError, "microsecond must be in 0..999999"); return NULL; }
        PyObject *delta = PyDelta_FromDSU(0, secs, us > 0 ? (int)us : 0);
        if (!delta) return NULL;
        v = PyNumber_Add(Epoch, delta);
        Py_DECREF(delta);
        o += 4 + nf;
        break;
    }
    case K_TIME2: {
        int nf = (c->a + 1) / 2;
        NEED(3 + nf);
        int64_t x = be_signed(d + o, 3);
        int sign = ((x >> 23) & 1) ? 1 : -1;
        if (sign == -1) x = -x;
        int64_t total = ((((x >> 12) & 0x3FF) * 60 + ((x >> 6) & 63)) * 60 + (x & 63)) * 1000000LL
                        + frac_us(d + o + 3, c->a);
        total *= sign;
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
    PyObject *out = PyList_New(0);
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

static PyTypeObject PlanType = {
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


/* ------------------------------------------------------------------------ */
/* JSON text, as json.dumps(obj, ensure_ascii=False, default=json_value)      */
/* gives it for the values a row holds; see capturer/encode.py.              */

typedef struct {
    char *p;
    Py_ssize_t n, cap;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t more) {
    if (b->n + more <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more) cap *= 2;
    char *np = PyMem_Realloc(b->p, cap);
    if (!np) { PyErr_NoMemory(); return -1; }
    b->p = np;
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const char *s, Py_ssize_t n) {
    if (buf_grow(b, n) < 0) return -1;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

static int put_escaped(Buf *b, const char *s, Py_ssize_t n) {
    static const char hex[] = "0123456789abcdef";
    if (buf_grow(b, n + 2) < 0) return -1;
    b->p[b->n++] = '"';
    Py_ssize_t start = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\') continue;
        if (buf_put(b, s + start, i - start) < 0) return -1;
        char e[6];
        int en = 2;
        e[0] = '\\';
        switch (ch) {
        case '"': e[1] = '"'; break;
        case '\\': e[1] = '\\'; break;
        case '\n': e[1] = 'n'; break;
        case '\r': e[1] = 'r'; break;
        case '\t': e[1] = 't'; break;
        case '\b': e[1] = 'b'; break;
        case '\f': e[1] = 'f'; break;
        default:
            e[1] = 'u'; e[2] = '0'; e[3] = '0'; e[4] = hex[ch >> 4]; e[5] = hex[ch & 15];
            en = 6;
        }
        if (buf_put(b, e, en) < 0) return -1;
        start = i + 1;
    }
    if (buf_put(b, s + start, n - start) < 0) return -1;
    return buf_put(b, "\"", 1);
}

static int put_str(Buf *b, PyObject *u) {
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(u, &n);
    if (!s) return -1;
    return put_escaped(b, s, n);
}

static int put_b64(Buf *b, const unsigned char *s, Py_ssize_t n) {
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (buf_grow(b, (n + 2) / 3 * 4 + 2) < 0) return -1;
    char *o = b->p + b->n;
    *o++ = '"';
    Py_ssize_t i = 0;
    for (; i + 2 < n; i += 3) {
        unsigned v = (s[i] << 16) | (s[i + 1] << 8) | s[i + 2];
        *o++ = tbl[v >> 18]; *o++ = tbl[(v >> 12) & 63]; *o++ = tbl[(v >> 6) & 63]; *o++ = tbl[v & 63];
    }
    if (i < n) {
        unsigned v = s[i] << 16;
        if (i + 1 < n) v |= s[i + 1] << 8;
        *o++ = tbl[v >> 18];
        *o++ = tbl[(v >> 12) & 63];
        *o++ = i + 1 < n ? tbl[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    *o++ = '"';
    b->n = o - b->p;
    return 0;
}

/* int.__repr__ of an int (or subclass) */
static int put_int(Buf *b, PyObject *o) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (!overflow) {
        char tmp[32];
        int n = snprintf(tmp, sizeof(tmp), "%lld", v);
        return buf_put(b, tmp, n);
    }
    PyObject *r = PyLong_Type.tp_repr(o);
    if (!r) return -1;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(r, &n);
    int rc = s ? buf_put(b, s, n) : -1;
    Py_DECREF(r);
    return rc;
}

/* DATETIME / DATE / TIME values between quotes q, as json_value and pymysql write them
   (naive fields; TIME as [-]H:MM:SS[.ffffff] from the signed total):
   1 = written, 0 = not one of these types, -1 = error */
static int put_temporal(Buf *b, PyObject *o, char q) {
    char tmp[96];
    int n;
    if (PyDateTime_CheckExact(o)) {
        int us = PyDateTime_DATE_GET_MICROSECOND(o);
        n = snprintf(tmp, sizeof(tmp), "%c%04d-%02d-%02d %02d:%02d:%02d", q, PyDateTime_GET_YEAR(o),
                     PyDateTime_GET_MONTH(o), PyDateTime_GET_DAY(o), PyDateTime_DATE_GET_HOUR(o),
                     PyDateTime_DATE_GET_MINUTE(o), PyDateTime_DATE_GET_SECOND(o));
        if (us) n += snprintf(tmp + n, sizeof(tmp) - n, ".%06d", us);
        tmp[n++] = q;
    } else if (PyDate_CheckExact(o)) {
        n = snprintf(tmp, sizeof(tmp), "%c%04d-%02d-%02d%c", q, PyDateTime_GET_YEAR(o), PyDateTime_GET_MONTH(o),
                     PyDateTime_GET_DAY(o), q);
    } else if (PyDelta_CheckExact(o)) {
        long long total = ((long long)PyDateTime_DELTA_GET_DAYS(o) * 86400 + PyDateTime_DELTA_GET_SECONDS(o)) * 1000000LL
                          + PyDateTime_DELTA_GET_MICROSECONDS(o);
        const char *sign = total < 0 ? "-" : "";
        if (total < 0) total = -total;
        long long secs = total / 1000000, us = total % 1000000;
        if (us)
            n = snprintf(tmp, sizeof(tmp), "%c%s%02lld:%02lld:%02lld.%06lld%c", q, sign, secs / 3600, (secs % 3600) / 60,
                         secs % 60, us, q);
        else
            n = snprintf(tmp, sizeof(tmp), "%c%s%02lld:%02lld:%02lld%c", q, sign, secs / 3600, (secs % 3600) / 60,
                         secs % 60, q);
    } else {
        return 0;
    }
    return buf_put(b, tmp, n) < 0 ? -1 : 1;
}

typedef struct {
    PyObject *fallback;  /* v -> a JSON-able value (capturer.encode.json_value(v)[0]) */
    PyObject *b64;       /* set: keys whose value was base64-encoded, or NULL */
    const char *isep, *ksep;
    int isep_n, ksep_n;
} Enc;

static int put_obj(Buf *b, PyObject *o, Enc *e, PyObject *key, int depth);

static int put_fallback(Buf *b, PyObject *o, Enc *e, PyObject *key, int depth) {
    PyObject *r = PyObject_CallOneArg(e->fallback, o);
    if (!r) return -1;
    if (r == o) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_TypeError, "value is not JSON serializable");
        return -1;
    }
    int rc = put_obj(b, r, e, key, depth + 1);
    Py_DECREF(r);
    return rc;
}

static int put_obj(Buf *b, PyObject *o, Enc *e, PyObject *key, int depth) {
    if (depth > 64) {
        PyErr_SetString(PyExc_ValueError, "nesting too deep");
        return -1;
    }
    if (o == Py_None) return buf_put(b, "null", 4);
    if (o == Py_True) return buf_put(b, "true", 4);
    if (o == Py_False) return buf_put(b, "false", 5);
    if (PyUnicode_Check(o)) return put_str(b, o);
    if (PyLong_Check(o)) {
        return put_int(b, o);
    }
    if (PyFloat_Check(o)) {
        double x = PyFloat_AS_DOUBLE(o);
        if (x != x) return buf_put(b, "NaN", 3);
        if (x == Py_HUGE_VAL) return buf_put(b, "Infinity", 8);
        if (x == -Py_HUGE_VAL) return buf_put(b, "-Infinity", 9);
        char *s = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (!s) return -1;
        int rc = buf_put(b, s, (Py_ssize_t)strlen(s));
        PyMem_Free(s);
        return rc;
    }
    if (PyDict_Check(o)) {
        if (buf_put(b, "{", 1) < 0) return -1;
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        int first = 1;
        while (PyDict_Next(o, &pos, &k, &v)) {
            if (!PyUnicode_Check(k)) {
                PyErr_SetString(PyExc_TypeError, "keys must be str");
                return -1;
            }
            if (!first && buf_put(b, e->isep, e->isep_n) < 0) return -1;
            first = 0;
            if (put_str(b, k) < 0 || buf_put(b, e->ksep, e->ksep_n) < 0) return -1;
            Py_INCREF(k);
            Py_INCREF(v);
            int rc = put_obj(b, v, e, k, depth + 1);
            Py_DECREF(k);
            Py_DECREF(v);
            if (rc < 0) return -1;
        }
        return buf_put(b, "}", 1);
    }
    if (PyList_Check(o) || PyTuple_Check(o)) {
        PyObject *seq = PySequence_Fast(o, "");
        if (!seq) return -1;
        int rc = buf_put(b, "[", 1);
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        for (Py_ssize_t i = 0; rc == 0 && i < n; i++) {
            if (i && buf_put(b, e->isep, e->isep_n) < 0) { rc = -1; break; }
            PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
            Py_INCREF(item);
            rc = put_obj(b, item, e, NULL, depth + 1);
            Py_DECREF(item);
        }
        Py_DECREF(seq);
        return rc < 0 ? -1 : buf_put(b, "]", 1);
    }
    if (!(PyDateTime_CheckExact(o) && ((PyDateTime_DateTime *)o)->hastzinfo)) { /* aware: json_value decides */
        int rc = put_temporal(b, o, '"');
        if (rc) return rc < 0 ? -1 : 0;
    }
    if (Decimal && Py_IS_TYPE(o, (PyTypeObject *)Decimal)) {
        PyObject *r = PyObject_Str(o);
        if (!r) return -1;
        int rc = put_str(b, r);
        Py_DECREF(r);
        return rc;
    }
    if (PyBytes_Check(o) || PyByteArray_Check(o)) {
        if (key && e->b64 && PySet_Add(e->b64, key) < 0) return -1;
        if (PyBytes_Check(o)) return put_b64(b, (const unsigned char *)PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o));
        return put_b64(b, (const unsigned char *)PyByteArray_AS_STRING(o), PyByteArray_GET_SIZE(o));
    }
    return put_fallback(b, o, e, key, depth);
}

static PyObject *json_dumps(PyObject *self, PyObject *args) {
    PyObject *obj, *fallback, *b64 = Py_None;
    int compact = 0, as_bytes = 0;
    if (!PyArg_ParseTuple(args, "OO|Opp", &obj, &fallback, &b64, &compact, &as_bytes)) return NULL;
    if (b64 != Py_None && !PySet_Check(b64)) {
        PyErr_SetString(PyExc_TypeError, "b64 must be a set or None");
        return NULL;
    }
    Enc e = {fallback, b64 == Py_None ? NULL : b64, compact ? "," : ", ", compact ? ":" : ": ", compact ? 1 : 2,
             compact ? 1 : 2};
    Buf b = {NULL, 0, 0};
    PyObject *out = NULL;
    if (put_obj(&b, obj, &e, NULL, 0) == 0)
        out = as_bytes ? PyBytes_FromStringAndSize(b.p ? b.p : "", b.n) : PyUnicode_DecodeUTF8(b.p ? b.p : "", b.n, NULL);
    PyMem_Free(b.p);
    return out;
}

/* ------------------------------------------------------------------------ */
/* SQL literals, exactly as pymysql's Connection.escape writes them (1.2.x)   */

static int lit_escaped_str(Buf *b, PyObject *u, int no_backslash) {
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(u, &n);
    if (!s) return -1;
    if (buf_grow(b, n + 2) < 0) return -1;
    b->p[b->n++] = '\'';
    Py_ssize_t start = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const char *e = NULL;
        if (no_backslash) {
            if (ch == '\'') e = "''";
        } else {
            switch (ch) {
            case 0: e = "\\0"; break;
            case '\\': e = "\\\\"; break;
            case '\n': e = "\\n"; break;
            case '\r': e = "\\r"; break;
            case 032: e = "\\Z"; break;
            case '"': e = "\\\""; break;
            case '\'': e = "\\'"; break;
            }
        }
        if (!e) continue;
        if (buf_put(b, s + start, i - start) < 0 || buf_put(b, e, 2) < 0) return -1;
        start = i + 1;
    }
    if (buf_put(b, s + start, n - start) < 0) return -1;
    return buf_put(b, "'", 1);
}

/* 1 = written, 0 = not a type handled here (the caller uses the fallback), -1 = error */
static int lit_one(Buf *b, PyObject *o, int no_backslash) {
    if (o == Py_None) return buf_put(b, "NULL", 4) < 0 ? -1 : 1;
    if (o == Py_True) return buf_put(b, "1", 1) < 0 ? -1 : 1;
    if (o == Py_False) return buf_put(b, "0", 1) < 0 ? -1 : 1;
    if (PyUnicode_Check(o)) return lit_escaped_str(b, o, no_backslash) < 0 ? -1 : 1;
    if (PyLong_CheckExact(o)) return put_int(b, o) < 0 ? -1 : 1;
    if (PyFloat_CheckExact(o)) {
        double x = PyFloat_AS_DOUBLE(o);
        if (x != x || x == Py_HUGE_VAL || x == -Py_HUGE_VAL) return 0; /* pymysql raises: let it */
        char *s = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (!s) return -1;
        int rc = buf_put(b, s, (Py_ssize_t)strlen(s));
        if (rc == 0 && !strchr(s, 'e')) rc = buf_put(b, "e0", 2);
        PyMem_Free(s);
        return rc < 0 ? -1 : 1;
    }
    if (PyBytes_Check(o) || PyByteArray_Check(o)) {
        static const char hex[] = "0123456789abcdef";
        const unsigned char *s = (const unsigned char *)(PyBytes_Check(o) ? PyBytes_AS_STRING(o) : PyByteArray_AS_STRING(o));
        Py_ssize_t n = PyBytes_Check(o) ? PyBytes_GET_SIZE(o) : PyByteArray_GET_SIZE(o);
        if (buf_grow(b, 2 * n + 3) < 0) return -1;
        b->p[b->n++] = 'X';
        b->p[b->n++] = '\'';
        for (Py_ssize_t i = 0; i < n; i++) {
            b->p[b->n++] = hex[s[i] >> 4];
            b->p[b->n++] = hex[s[i] & 15];
        }
        b->p[b->n++] = '\'';
        return 1;
    }
    int rc = put_temporal(b, o, '\'');  /* pymysql ignores tzinfo too */
    if (rc) return rc;
    if (Decimal && Py_IS_TYPE(o, (PyTypeObject *)Decimal)) {
        /* str() is format(o, "f") unless it uses an exponent (then format, which is slower) */
        PyObject *r = PyObject_Str(o);
        if (!r) return -1;
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(r, &n);
        if (!s) { Py_DECREF(r); return -1; }
        if (strpbrk(s, "Ee")) {
            static PyObject *f = NULL;
            Py_DECREF(r);
            if (!f && !(f = PyUnicode_FromString("f"))) return -1;
            r = PyObject_Format(o, f);
            if (!r) return -1;
            s = PyUnicode_AsUTF8AndSize(r, &n);
            if (!s) { Py_DECREF(r); return -1; }
        }
        if (strpbrk(s, "NnIi")) { Py_DECREF(r); return 0; } /* NaN / Infinity: pymysql raises */
        int rc = buf_put(b, s, n);
        Py_DECREF(r);
        return rc < 0 ? -1 : 1;
    }
    return 0;
}

static PyObject *sql_literals(PyObject *self, PyObject *args) {
    PyObject *values, *fallback;
    int no_backslash;
    if (!PyArg_ParseTuple(args, "OpO", &values, &no_backslash, &fallback)) return NULL;
    PyObject *seq = PySequence_Fast(values, "values must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyTuple_New(n);
    Buf b = {NULL, 0, 0};
    if (!out) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PySequence_Fast_GET_ITEM(seq, i), *lit;
        b.n = 0;
        int rc = lit_one(&b, v, no_backslash);
        if (rc < 0) goto fail;
        if (rc == 1) lit = PyUnicode_DecodeUTF8(b.p, b.n, NULL);
        else lit = PyObject_CallOneArg(fallback, v);
        if (!lit) goto fail;
        PyTuple_SET_ITEM(out, i, lit);
    }
    PyMem_Free(b.p);
    Py_DECREF(seq);
    return out;
fail:
    PyMem_Free(b.p);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* Kafka's murmur2 (the Java client's default partitioner), as senders/kafka.py's Python murmur2 */
static PyObject *murmur2(PyObject *self, PyObject *arg) {
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *d = v.buf;
    Py_ssize_t len = v.len;
    const uint32_t m = 0x5BD1E995;
    uint32_t h = 0x9747B28C ^ (uint32_t)len;
    Py_ssize_t n4 = len / 4;
    for (Py_ssize_t i = 0; i < n4; i++) {
        uint32_t k = (uint32_t)d[4 * i] | ((uint32_t)d[4 * i + 1] << 8) | ((uint32_t)d[4 * i + 2] << 16)
                     | ((uint32_t)d[4 * i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    Py_ssize_t tail = n4 * 4;
    switch (len & 3) {
    case 3: h ^= (uint32_t)d[tail + 2] << 16; /* fall through */
    case 2: h ^= (uint32_t)d[tail + 1] << 8; /* fall through */
    case 1: h ^= d[tail]; h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLong(h);
}

static PyMethodDef module_methods[] = {
    {"sql_literals", (PyCFunction)sql_literals, METH_VARARGS,
     "sql_literals(values, no_backslash_escapes, fallback) -> tuple of SQL literals as pymysql writes them;\n"
     "fallback(value) (pymysql's Connection.escape) for any other type"},
    {"murmur2", (PyCFunction)murmur2, METH_O, "murmur2(data: bytes) -> int (Kafka's partitioner hash)"},
    {"json_dumps", (PyCFunction)json_dumps, METH_VARARGS,
     "json_dumps(obj, fallback, b64_keys=None, compact=False, as_bytes=False) -> str (or its UTF-8 bytes):\n"
     "json.dumps(obj, ensure_ascii=False,\n"
     "default=fallback) for row values; keys of base64-encoded bytes values are added to b64_keys"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_fastrows", "Binlog rows-event decoder and row JSON encoder (C)", -1, module_methods,
};

PyMODINIT_FUNC PyInit__fastrows(void) {
    PyDateTime_IMPORT;
    if (!PyDateTimeAPI) return NULL;
    PyObject *decmod = PyImport_ImportModule("decimal");
    if (!decmod) return NULL;
    Decimal = PyObject_GetAttrString(decmod, "Decimal");
    Py_DECREF(decmod);
    if (!Decimal) return NULL;
    Epoch = PyDateTime_FromDateAndTime(1970, 1, 1, 0, 0, 0, 0);
    if (!Epoch) return NULL;
    if (PyType_Ready(&PlanType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "VERSION", 1);
    return m;
}
