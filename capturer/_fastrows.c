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
/* BaikalDB rows: protobuf messages whose field numbers are field ids          */
/* (capturer/regions/baikaldb/rows.py RowPlan.decode_py is the specification) */

enum {
    BK_SINT32 = 1, BK_SINT64, BK_UINT, BK_BOOL, BK_FLOAT, BK_DOUBLE,
    BK_TEXT, BK_BYTES, BK_DATETIME, BK_DATE, BK_TIME, BK_TIMESTAMP
};
static const int BK_WIRE[13] = {-1, 0, 0, 0, 0, 5, 1, 2, 2, 1, 5, 5, 5};

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    PyObject *names;     /* tuple of str, live columns in order */
    int maxid;           /* largest field id in slot/known */
    int *slot;           /* field id -> index into names, -1 = not live */
    int *kinds;          /* per index */
    unsigned char *known;/* field id -> known to this version (dropped ones too) */
    int utf8;
    PyObject *enc;       /* bytes: codec name */
} BPlan;

static void bplan_dealloc(BPlan *self) {
    PyMem_Free(self->slot);
    PyMem_Free(self->kinds);
    PyMem_Free(self->known);
    Py_XDECREF(self->names);
    Py_XDECREF(self->enc);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* baikal_plan(((field_id, name, kind), ...), (known ids...), encoding) */
static PyObject *baikal_plan(PyObject *mod, PyObject *args) {
    PyObject *spec, *known;
    const char *enc;
    if (!PyArg_ParseTuple(args, "O!O!s", &PyTuple_Type, &spec, &PyTuple_Type, &known, &enc)) return NULL;
    extern PyTypeObject BPlanType;
    BPlan *p = PyObject_New(BPlan, &BPlanType);
    if (!p) return NULL;
    p->slot = NULL; p->kinds = NULL; p->known = NULL; p->names = NULL; p->enc = NULL;
    p->n = PyTuple_GET_SIZE(spec);
    int maxid = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(known); i++) {
        long v = PyLong_AsLong(PyTuple_GET_ITEM(known, i));
        if (v == -1 && PyErr_Occurred()) goto fail;
        if (v < 1 || v > (1 << 22)) { PyErr_SetString(PyExc_ValueError, "field id out of range"); goto fail; }
        if (v > maxid) maxid = (int)v;
    }
    for (Py_ssize_t i = 0; i < p->n; i++) {
        PyObject *t = PyTuple_GET_ITEM(spec, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3) { PyErr_SetString(PyExc_ValueError, "bad spec"); goto fail; }
        long v = PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
        if (v == -1 && PyErr_Occurred()) goto fail;
        if (v < 1 || v > (1 << 22)) { PyErr_SetString(PyExc_ValueError, "field id out of range"); goto fail; }
        if (v > maxid) maxid = (int)v;
    }
    p->maxid = maxid;
    p->slot = PyMem_Malloc(sizeof(int) * (maxid + 1));
    p->known = PyMem_Calloc(maxid + 1, 1);
    p->kinds = PyMem_Malloc(sizeof(int) * (p->n ? p->n : 1));
    p->names = PyTuple_New(p->n);
    if (!p->slot || !p->known || !p->kinds || !p->names) { PyErr_NoMemory(); goto fail; }
    for (int i = 0; i <= maxid; i++) p->slot[i] = -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(known); i++)
        p->known[PyLong_AsLong(PyTuple_GET_ITEM(known, i))] = 1;
    for (Py_ssize_t i = 0; i < p->n; i++) {
        PyObject *t = PyTuple_GET_ITEM(spec, i);
        long fid = PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
        PyObject *name = PyTuple_GET_ITEM(t, 1);
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(t, 2));
        if (kind < BK_SINT32 || kind > BK_TIMESTAMP || !PyUnicode_Check(name)) {
            PyErr_SetString(PyExc_ValueError, "bad field spec");
            goto fail;
        }
        p->slot[fid] = (int)i;
        p->known[fid] = 1;
        p->kinds[i] = (int)kind;
        Py_INCREF(name);
        PyTuple_SET_ITEM(p->names, i, name);
    }
    p->utf8 = strcmp(enc, "utf-8") == 0 || strcmp(enc, "utf8") == 0;
    p->enc = PyBytes_FromString(enc);
    if (!p->enc) goto fail;
    return (PyObject *)p;
fail:
    Py_DECREF(p);
    return NULL;
}

static int bk_varint(const unsigned char *d, Py_ssize_t *po, Py_ssize_t end, uint64_t *out) {
    uint64_t r = 0;
    int shift = 0;
    Py_ssize_t o = *po;
    for (;;) {
        if (o >= end) { PyErr_SetString(PyExc_ValueError, "truncated varint"); return -1; }
        unsigned char b = d[o++];
        if (shift < 64) r |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) break;
        shift += 7;
        if (shift > 63) { PyErr_SetString(PyExc_ValueError, "varint longer than 10 bytes"); return -1; }
    }
    *po = o;
    *out = r;
    return 0;
}

static PyObject *bk_text(BPlan *p, const unsigned char *s, Py_ssize_t n) {
    PyObject *v = p->utf8 ? PyUnicode_DecodeUTF8((const char *)s, n, "strict")
                          : PyUnicode_Decode((const char *)s, n, PyBytes_AS_STRING(p->enc), "strict");
    if (!v && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        v = PyBytes_FromStringAndSize((const char *)s, n);
    }
    return v;
}

static PyObject *bk_none_on_value_error(void) {
    if (PyErr_ExceptionMatches(PyExc_ValueError)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return NULL;
}

static PyObject *bk_value(BPlan *p, int kind, int wt, uint64_t u, const unsigned char *s, Py_ssize_t n) {
    switch (kind) {
    case BK_SINT32: case BK_SINT64:
        return PyLong_FromLongLong((int64_t)(u >> 1) ^ -(int64_t)(u & 1));
    case BK_UINT:
        return PyLong_FromUnsignedLongLong(u);
    case BK_BOOL:
        return PyLong_FromLong(u ? 1 : 0);
    case BK_TEXT:
        return bk_text(p, s, n);
    case BK_BYTES:
        return PyBytes_FromStringAndSize((const char *)s, n);
    case BK_DOUBLE: {
        double x;
        memcpy(&x, &u, 8);
        return PyFloat_FromDouble(x);
    }
    case BK_FLOAT: {
        uint32_t w = (uint32_t)u;
        float x;
        memcpy(&x, &w, 4);
        return PyFloat_FromDouble((double)x);
    }
    case BK_DATETIME: {
        int ym = (int)((u >> 46) & 0x1FFFF);
        PyObject *v = PyDateTime_FromDateAndTime(ym / 13, ym % 13, (int)((u >> 41) & 0x1F), (int)((u >> 36) & 0x1F),
                                                 (int)((u >> 30) & 0x3F), (int)((u >> 24) & 0x3F), (int)(u & 0xFFFFFF));
        return v ? v : bk_none_on_value_error();
    }
    case BK_DATE: {
        int ym = (int)((u >> 5) & 0x1FFFF);
        PyObject *v = PyDate_FromDate(ym / 13, ym % 13, (int)(u & 0x1F));
        return v ? v : bk_none_on_value_error();
    }
    case BK_TIME: {
        int32_t v = (int32_t)(uint32_t)u;
        int neg = v < 0;
        int64_t a = neg ? -(int64_t)v : (int64_t)v;
        int64_t secs = ((a >> 12) & 0x3FF) * 3600 + ((a >> 6) & 0x3F) * 60 + (a & 0x3F);
        return PyDelta_FromDSU(0, (int)(neg ? -secs : secs), 0);
    }
    case BK_TIMESTAMP: {
        uint32_t v = (uint32_t)u;
        if (v == 0) Py_RETURN_NONE;
        PyObject *delta = PyDelta_FromDSU((int)(v / 86400), (int)(v % 86400), 0);
        if (!delta) return NULL;
        PyObject *r = PyNumber_Add(Epoch, delta);
        Py_DECREF(delta);
        return r;
    }
    }
    (void)wt;
    PyErr_SetString(PyExc_SystemError, "bad kind");
    return NULL;
}

/* a value whose wire type does not match its column's type: as the wire gives it */
static PyObject *bk_by_wire(BPlan *p, int wt, uint64_t u, const unsigned char *s, Py_ssize_t n) {
    if (wt == 2) return bk_text(p, s, n);
    if (wt == 5) return PyLong_FromUnsignedLongLong((uint32_t)u);
    return PyLong_FromUnsignedLongLong(u);
}

static PyObject *bplan_row(BPlan *self, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *d = buf.buf;
    Py_ssize_t o = 0, end = buf.len;
    PyObject *row = NULL, *unknown = NULL;
    long mism = 0;
    row = _PyDict_NewPresized(self->n);
    unknown = PyList_New(0);
    if (!row || !unknown) goto fail;
    for (Py_ssize_t i = 0; i < self->n; i++)
        if (PyDict_SetItem(row, PyTuple_GET_ITEM(self->names, i), Py_None) < 0) goto fail;
    while (o < end) {
        uint64_t tag, u = 0;
        const unsigned char *s = NULL;
        Py_ssize_t n = 0;
        if (bk_varint(d, &o, end, &tag) < 0) goto fail;
        uint64_t fno = tag >> 3;
        int wt = (int)(tag & 7);
        if (fno == 0) { PyErr_SetString(PyExc_ValueError, "field number 0"); goto fail; }
        if (wt == 0) {
            if (bk_varint(d, &o, end, &u) < 0) goto fail;
        } else if (wt == 2) {
            uint64_t ln;
            if (bk_varint(d, &o, end, &ln) < 0) goto fail;
            if (ln > (uint64_t)(end - o)) { PyErr_SetString(PyExc_ValueError, "truncated length-delimited field"); goto fail; }
            s = d + o;
            n = (Py_ssize_t)ln;
            o += n;
        } else if (wt == 1) {
            if (end - o < 8) { PyErr_SetString(PyExc_ValueError, "truncated 64-bit field"); goto fail; }
            u = le_unsigned(d + o, 8);
            o += 8;
        } else if (wt == 5) {
            if (end - o < 4) { PyErr_SetString(PyExc_ValueError, "truncated 32-bit field"); goto fail; }
            u = le_unsigned(d + o, 4);
            o += 4;
        } else {
            PyErr_Format(PyExc_ValueError, "unsupported wire type %d (field %llu)", wt, (unsigned long long)fno);
            goto fail;
        }
        int idx = fno <= (uint64_t)self->maxid ? self->slot[fno] : -1;
        if (idx < 0) {
            if (fno > (uint64_t)self->maxid || !self->known[fno]) {
                PyObject *f = PyLong_FromUnsignedLongLong(fno);
                if (!f) goto fail;
                int r = PyList_Append(unknown, f);
                Py_DECREF(f);
                if (r < 0) goto fail;
            }
            continue;
        }
        int kind = self->kinds[idx];
        PyObject *v;
        if (wt != BK_WIRE[kind]) {
            mism++;
            v = bk_by_wire(self, wt, u, s, n);
        } else {
            v = bk_value(self, kind, wt, u, s, n);
        }
        if (!v) goto fail;
        int r = PyDict_SetItem(row, PyTuple_GET_ITEM(self->names, idx), v);
        Py_DECREF(v);
        if (r < 0) goto fail;
    }
    PyBuffer_Release(&buf);
    PyObject *ut = PyList_AsTuple(unknown);
    Py_DECREF(unknown);
    if (!ut) { Py_DECREF(row); return NULL; }
    PyObject *res = Py_BuildValue("(NNl)", row, ut, mism);
    return res;
fail:
    Py_XDECREF(row);
    Py_XDECREF(unknown);
    PyBuffer_Release(&buf);
    return NULL;
}

static PyMethodDef bplan_methods[] = {
    {"row", (PyCFunction)bplan_row, METH_O,
     "row(data) -> (column -> value for every live column, unknown field numbers, wire-type mismatches)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject BPlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "capturer._fastrows.BaikalPlan",
    .tp_basicsize = sizeof(BPlan),
    .tp_dealloc = (destructor)bplan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a decoder for the rows of one BaikalDB table version (baikal_plan(...))",
    .tp_methods = bplan_methods,
};

/* ------------------------------------------------------------------------ */
/* PostgreSQL pgoutput TupleData -> a row image (column -> value), as          */
/* capturer/regions/postgresql/region.py PostgresRegion.image makes it from    */
/* pgoutput.parse's tuples (the specification; tests compare both).           */

enum { PG_CALL = 0, PG_TEXT, PG_INT, PG_BOOL, PG_TS, PG_TSTZ, PG_DATE, PG_NUMERIC };

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    PyObject *names;    /* tuple of str */
    PyObject *parsers;  /* tuple of callables (text -> value), used for PG_CALL and every text a fast kind declines */
    int *kinds;
    PyObject *unrepresentable; /* the exception class whose instances mean "no equivalent: None, counted" */
} PgPlan;

static void pgplan_dealloc(PgPlan *self) {
    PyMem_Free(self->kinds);
    Py_XDECREF(self->names);
    Py_XDECREF(self->parsers);
    Py_XDECREF(self->unrepresentable);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* pg_plan(((name, kind, parser), ...), Unrepresentable) */
static PyObject *pg_plan(PyObject *mod, PyObject *args) {
    PyObject *spec, *unrep;
    if (!PyArg_ParseTuple(args, "O!O", &PyTuple_Type, &spec, &unrep)) return NULL;
    extern PyTypeObject PgPlanType;
    PgPlan *p = PyObject_New(PgPlan, &PgPlanType);
    if (!p) return NULL;
    p->n = PyTuple_GET_SIZE(spec);
    p->kinds = PyMem_Malloc(sizeof(int) * (p->n ? p->n : 1));
    p->names = PyTuple_New(p->n);
    p->parsers = PyTuple_New(p->n);
    p->unrepresentable = Py_NewRef(unrep);
    if (!p->kinds || !p->names || !p->parsers) { PyErr_NoMemory(); goto fail; }
    for (Py_ssize_t i = 0; i < p->n; i++) {
        PyObject *t = PyTuple_GET_ITEM(spec, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3 || !PyUnicode_Check(PyTuple_GET_ITEM(t, 0))) {
            PyErr_SetString(PyExc_ValueError, "bad column spec");
            goto fail;
        }
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(t, 1));
        if (kind == -1 && PyErr_Occurred()) goto fail;
        if (kind < PG_CALL || kind > PG_NUMERIC) { PyErr_SetString(PyExc_ValueError, "bad column kind"); goto fail; }
        p->kinds[i] = (int)kind;
        PyTuple_SET_ITEM(p->names, i, Py_NewRef(PyTuple_GET_ITEM(t, 0)));
        PyTuple_SET_ITEM(p->parsers, i, Py_NewRef(PyTuple_GET_ITEM(t, 2)));
    }
    return (PyObject *)p;
fail:
    Py_DECREF(p);
    return NULL;
}

static int pg_digits(const char *s, int n, int *out) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

/* "YYYY-MM-DD" (exactly): 0 with the fields, -1 = not this simple form (the parser decides) */
static int pg_ymd(const char *s, Py_ssize_t n, int *y, int *mo, int *d) {
    if (n < 10 || s[4] != '-' || s[7] != '-') return -1;
    if (pg_digits(s, 4, y) || pg_digits(s + 5, 2, mo) || pg_digits(s + 8, 2, d)) return -1;
    return 0;
}

/* "YYYY-MM-DD HH:MM:SS[.f{1,6}]" then, for timestamptz, exactly "+00" (TimeZone=UTC) */
static PyObject *pg_fast_ts(const char *s, Py_ssize_t n, int tz) {
    int y, mo, d, h, mi, se, us = 0;
    if (tz) {
        if (n < 3 || memcmp(s + n - 3, "+00", 3) != 0) return Py_NewRef(Py_NotImplemented);
        n -= 3;
    }
    if (n < 19 || pg_ymd(s, n, &y, &mo, &d) || s[10] != ' ' || s[13] != ':' || s[16] != ':' ||
        pg_digits(s + 11, 2, &h) || pg_digits(s + 14, 2, &mi) || pg_digits(s + 17, 2, &se))
        return Py_NewRef(Py_NotImplemented);
    if (n > 19) {
        int nf = (int)(n - 20);
        if (s[19] != '.' || nf < 1 || nf > 6 || pg_digits(s + 20, nf, &us)) return Py_NewRef(Py_NotImplemented);
        for (int i = nf; i < 6; i++) us *= 10;
    }
    if (y < 1) return Py_NewRef(Py_NotImplemented);
    PyObject *v = PyDateTime_FromDateAndTime(y, mo, d, h, mi, se, us);
    if (!v && PyErr_ExceptionMatches(PyExc_ValueError)) {  /* (e.g. 24:00:00): the parser's answer */
        PyErr_Clear();
        return Py_NewRef(Py_NotImplemented);
    }
    return v;
}

static PyObject *pg_fast(int kind, const char *s, Py_ssize_t n) {
    switch (kind) {
    case PG_TEXT:
        return PyUnicode_DecodeUTF8(s, n, "surrogateescape");
    case PG_BOOL:
        return PyLong_FromLong(n == 1 && s[0] == 't');
    case PG_INT: {
        char tmp[32];
        if (n < 1 || n > 30) return Py_NewRef(Py_NotImplemented);
        memcpy(tmp, s, n);
        tmp[n] = 0;
        char *endp;
        PyObject *v = PyLong_FromString(tmp, &endp, 10);
        if (!v || *endp) {
            Py_XDECREF(v);
            PyErr_Clear();
            return Py_NewRef(Py_NotImplemented);
        }
        return v;
    }
    case PG_TS: case PG_TSTZ:
        return pg_fast_ts(s, n, kind == PG_TSTZ);
    case PG_DATE: {
        int y, mo, d;
        if (n != 10 || pg_ymd(s, n, &y, &mo, &d) || y < 1) return Py_NewRef(Py_NotImplemented);
        PyObject *v = PyDate_FromDate(y, mo, d);
        if (!v && PyErr_ExceptionMatches(PyExc_ValueError)) {
            PyErr_Clear();
            return Py_NewRef(Py_NotImplemented);
        }
        return v;
    }
    case PG_NUMERIC: {
        if (n < 1 || s[n - 1] < '0' || s[n - 1] > '9') return Py_NewRef(Py_NotImplemented);  /* NaN, +-Infinity */
        PyObject *t = PyUnicode_DecodeASCII(s, n, "strict");
        if (!t) {
            PyErr_Clear();
            return Py_NewRef(Py_NotImplemented);
        }
        PyObject *v = PyObject_CallOneArg(Decimal, t);
        Py_DECREF(t);
        return v;
    }
    }
    return Py_NewRef(Py_NotImplemented);
}

static inline uint32_t pg_be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* plan.image(data, offset, only_present) -> (image, unchanged columns (tuple), offset after, unrepresentable count)
   ValueError for a tuple cut short or a value its parser refuses (the Python path then says which). */
static PyObject *pgplan_image(PgPlan *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t o;
    int only_present;
    if (!PyArg_ParseTuple(args, "y*np", &buf, &o, &only_present)) return NULL;
    const unsigned char *d = buf.buf;
    Py_ssize_t end = buf.len;
    PyObject *row = NULL, *unchanged = NULL;
    long bad = 0;
    if (o < 0 || o + 2 > end) { PyErr_SetString(PyExc_ValueError, "tuple cut short"); goto fail; }
    int ncols = (d[o] << 8) | d[o + 1];
    if (ncols & 0x8000) { PyErr_SetString(PyExc_ValueError, "negative column count"); goto fail; }
    o += 2;
    row = _PyDict_NewPresized(ncols < self->n ? ncols : self->n);
    if (!row) goto fail;
    for (int i = 0; i < ncols; i++) {
        if (o >= end) { PyErr_SetString(PyExc_ValueError, "tuple cut short"); goto fail; }
        unsigned char kind = d[o++];
        int mine = i < self->n;  /* (columns past the relation's are read over, as zip() leaves them) */
        if (kind == 't') {
            if (o + 4 > end) { PyErr_SetString(PyExc_ValueError, "tuple cut short"); goto fail; }
            int32_t ln = (int32_t)pg_be32(d + o);
            o += 4;
            if (ln < 0 || ln > end - o) { PyErr_SetString(PyExc_ValueError, "value past the message's end"); goto fail; }
            const char *s = (const char *)d + o;
            o += ln;
            if (!mine) continue;
            PyObject *v = pg_fast(self->kinds[i], s, ln);
            if (v == Py_NotImplemented) {
                Py_DECREF(v);
                PyObject *t = PyUnicode_DecodeUTF8(s, ln, "surrogateescape");
                if (!t) goto fail;
                v = PyObject_CallOneArg(PyTuple_GET_ITEM(self->parsers, i), t);
                Py_DECREF(t);
            }
            if (!v) {
                if (!PyErr_ExceptionMatches(self->unrepresentable)) goto fail;
                PyErr_Clear();
                bad++;
                v = Py_NewRef(Py_None);
            }
            int r = PyDict_SetItem(row, PyTuple_GET_ITEM(self->names, i), v);
            Py_DECREF(v);
            if (r < 0) goto fail;
        } else if (kind == 'n') {
            if (mine && !only_present && PyDict_SetItem(row, PyTuple_GET_ITEM(self->names, i), Py_None) < 0) goto fail;
        } else if (kind == 'u') {
            if (!mine) continue;
            if (!unchanged && !(unchanged = PyList_New(0))) goto fail;
            if (PyList_Append(unchanged, PyTuple_GET_ITEM(self->names, i)) < 0) goto fail;
        } else {  /* 'b' (never asked for) or unknown */
            PyErr_Format(PyExc_ValueError, "tuple column kind %c", kind);
            goto fail;
        }
    }
    PyBuffer_Release(&buf);
    PyObject *ut = unchanged ? PyList_AsTuple(unchanged) : PyTuple_New(0);
    Py_XDECREF(unchanged);
    if (!ut) { Py_DECREF(row); return NULL; }
    return Py_BuildValue("(NNnl)", row, ut, o, bad);
fail:
    Py_XDECREF(row);
    Py_XDECREF(unchanged);
    PyBuffer_Release(&buf);
    return NULL;
}

static PyMethodDef pgplan_methods[] = {
    {"image", (PyCFunction)pgplan_image, METH_VARARGS,
     "image(data, offset, only_present) -> (column -> value, unchanged columns, offset after, unrepresentable)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject PgPlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "capturer._fastrows.PgPlan",
    .tp_basicsize = sizeof(PgPlan),
    .tp_dealloc = (destructor)pgplan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a decoder of pgoutput tuples of one relation (pg_plan(...))",
    .tp_methods = pgplan_methods,
};


/* ------------------------------------------------------------------------ */
/* JSON text, as json.dumps(obj, ensure_ascii=False, default=json_value)      */
/* gives it for the values a row holds; see capturer/model/encode.py.              */

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
/* n >= 0 in exactly `width` digits (zero-padded; wider numbers keep all their digits) */
static char *fmt_uint(char *p, unsigned long long n, int width) {
    char tmp[24];
    int k = 0;
    do {
        tmp[k++] = (char)('0' + n % 10);
        n /= 10;
    } while (n);
    while (k < width) tmp[k++] = '0';
    while (k) *p++ = tmp[--k];
    return p;
}

static int put_temporal(Buf *b, PyObject *o, char q) {
    char tmp[96];
    char *p = tmp;
    if (PyDateTime_CheckExact(o)) {
        int us = PyDateTime_DATE_GET_MICROSECOND(o);
        *p++ = q;
        p = fmt_uint(p, (unsigned)PyDateTime_GET_YEAR(o), 4);
        *p++ = '-';
        p = fmt_uint(p, (unsigned)PyDateTime_GET_MONTH(o), 2);
        *p++ = '-';
        p = fmt_uint(p, (unsigned)PyDateTime_GET_DAY(o), 2);
        *p++ = ' ';
        p = fmt_uint(p, (unsigned)PyDateTime_DATE_GET_HOUR(o), 2);
        *p++ = ':';
        p = fmt_uint(p, (unsigned)PyDateTime_DATE_GET_MINUTE(o), 2);
        *p++ = ':';
        p = fmt_uint(p, (unsigned)PyDateTime_DATE_GET_SECOND(o), 2);
        if (us) {
            *p++ = '.';
            p = fmt_uint(p, (unsigned)us, 6);
        }
        *p++ = q;
    } else if (PyDate_CheckExact(o)) {
        *p++ = q;
        p = fmt_uint(p, (unsigned)PyDateTime_GET_YEAR(o), 4);
        *p++ = '-';
        p = fmt_uint(p, (unsigned)PyDateTime_GET_MONTH(o), 2);
        *p++ = '-';
        p = fmt_uint(p, (unsigned)PyDateTime_GET_DAY(o), 2);
        *p++ = q;
    } else if (PyDelta_CheckExact(o)) {
        if (PyDateTime_DELTA_GET_DAYS(o) > 100000 || PyDateTime_DELTA_GET_DAYS(o) < -100000)
            return 0; /* the total in microseconds would overflow: the caller's fallback writes it */
        long long total = ((long long)PyDateTime_DELTA_GET_DAYS(o) * 86400 + PyDateTime_DELTA_GET_SECONDS(o)) * 1000000LL
                          + PyDateTime_DELTA_GET_MICROSECONDS(o);
        *p++ = q;
        if (total < 0) {
            *p++ = '-';
            total = -total;
        }
        unsigned long long secs = (unsigned long long)total / 1000000, us = (unsigned long long)total % 1000000;
        p = fmt_uint(p, secs / 3600, 2);
        *p++ = ':';
        p = fmt_uint(p, (secs % 3600) / 60, 2);
        *p++ = ':';
        p = fmt_uint(p, secs % 60, 2);
        if (us) {
            *p++ = '.';
            p = fmt_uint(p, us, 6);
        }
        *p++ = q;
    } else {
        return 0;
    }
    return buf_put(b, tmp, p - tmp) < 0 ? -1 : 1;
}

typedef struct {
    PyObject *fallback;  /* v -> a JSON-able value (capturer.model.encode.json_value(v)[0]) */
    PyObject *b64;       /* set: columns whose value was base64-encoded, or NULL */
    const char *isep, *ksep;
    int isep_n, ksep_n;
    PyObject *rows;      /* tuple: the top-level keys whose dict values are row images, or NULL */
} Enc;

/* key: o is the value of column `key` of a row image (listed in e->b64 if base64-encoded);
   row: o is a row image */
static int put_obj(Buf *b, PyObject *o, Enc *e, PyObject *key, int depth, int row);

static int put_fallback(Buf *b, PyObject *o, Enc *e, PyObject *key, int depth) {
    PyObject *r = PyObject_CallOneArg(e->fallback, o);
    if (!r) return -1;
    if (r == o) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_TypeError, "value is not JSON serializable");
        return -1;
    }
    int rc = put_obj(b, r, e, key, depth + 1, 0);
    Py_DECREF(r);
    return rc;
}

static int put_obj(Buf *b, PyObject *o, Enc *e, PyObject *key, int depth, int row) {
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
        /* a dict subclass (e.g. an OrderedDict) in its items() order, as json writes it */
        PyObject *items = PyDict_CheckExact(o) ? NULL : PyMapping_Items(o);
        if (!items && !PyDict_CheckExact(o)) return -1;
        int rc = buf_put(b, "{", 1);
        Py_ssize_t pos = 0, idx = 0;
        PyObject *k, *v;
        int first = 1;
        while (rc == 0) {
            if (!items) {
                if (!PyDict_Next(o, &pos, &k, &v)) break;
            } else {
                if (idx >= PyList_GET_SIZE(items)) break;
                PyObject *it = PyList_GET_ITEM(items, idx++);
                if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 2) {
                    PyErr_SetString(PyExc_ValueError, "items must return 2-tuples");
                    rc = -1;
                    break;
                }
                k = PyTuple_GET_ITEM(it, 0);
                v = PyTuple_GET_ITEM(it, 1);
            }
            if (!PyUnicode_Check(k)) {
                PyErr_SetString(PyExc_TypeError, "keys must be str");
                rc = -1;
                break;
            }
            Py_INCREF(k);
            Py_INCREF(v);
            int child_row = 0;
            if (depth == 0 && e->b64 && e->rows) {
                child_row = PySequence_Contains(e->rows, k);
                if (child_row < 0) rc = -1;
            }
            if (rc == 0 && ((!first && buf_put(b, e->isep, e->isep_n) < 0) || put_str(b, k) < 0
                            || buf_put(b, e->ksep, e->ksep_n) < 0
                            || put_obj(b, v, e, row ? k : NULL, depth + 1, child_row) < 0))
                rc = -1;
            first = 0;
            Py_DECREF(k);
            Py_DECREF(v);
        }
        Py_XDECREF(items);
        return rc < 0 ? -1 : buf_put(b, "}", 1);
    }
    if (PyList_Check(o) || PyTuple_Check(o)) {
        PyObject *seq = PySequence_Fast(o, "");
        if (!seq) return -1;
        int rc = buf_put(b, "[", 1);
        /* the size is read at each step: a fallback may change the list being written */
        for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(seq); i++) {
            if (i && buf_put(b, e->isep, e->isep_n) < 0) { rc = -1; break; }
            PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
            Py_INCREF(item);
            rc = put_obj(b, item, e, NULL, depth + 1, 0);
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
        /* plain notation, never an exponent (str(Decimal("1E-20")) is "1E-20"): as json_value writes it */
        PyObject *r = PyObject_Str(o);
        if (!r) return -1;
        const char *s = PyUnicode_AsUTF8(r);
        if (!s) { Py_DECREF(r); return -1; }
        const char *ex = strpbrk(s, "Ee");
        long e10 = ex ? strtol(ex + 1, NULL, 10) : 0;
        /* (a bounded exponent: "1E+999999999" stays as it is rather than a gigabyte of zeros) */
        if (ex && !strpbrk(s, "Nn") && e10 >= -20000 && e10 <= 20000) {
            static PyObject *f = NULL;
            Py_DECREF(r);
            if (!f && !(f = PyUnicode_FromString("f"))) return -1;
            r = PyObject_Format(o, f);
            if (!r) return -1;
        }
        int rc = put_str(b, r);
        Py_DECREF(r);
        return rc;
    }
    if (PyBytes_Check(o) || PyByteArray_Check(o) || PyMemoryView_Check(o)) {
        if (key && e->b64 && PySet_Add(e->b64, key) < 0) return -1;
        if (PyBytes_Check(o)) return put_b64(b, (const unsigned char *)PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o));
        if (PyByteArray_Check(o))
            return put_b64(b, (const unsigned char *)PyByteArray_AS_STRING(o), PyByteArray_GET_SIZE(o));
        PyObject *raw = PyBytes_FromObject(o); /* bytes(memoryview), any layout */
        if (!raw) return -1;
        int rc = put_b64(b, (const unsigned char *)PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw));
        Py_DECREF(raw);
        return rc;
    }
    return put_fallback(b, o, e, key, depth);
}

static PyObject *json_dumps(PyObject *self, PyObject *args) {
    PyObject *obj, *fallback, *b64 = Py_None, *rows = Py_None;
    int compact = 0, as_bytes = 0;
    if (!PyArg_ParseTuple(args, "OO|OppO", &obj, &fallback, &b64, &compact, &as_bytes, &rows)) return NULL;
    if (b64 != Py_None && !PySet_Check(b64)) {
        PyErr_SetString(PyExc_TypeError, "b64 must be a set or None");
        return NULL;
    }
    if (rows != Py_None && !PyTuple_Check(rows)) {
        PyErr_SetString(PyExc_TypeError, "rows must be a tuple or None");
        return NULL;
    }
    Enc e = {fallback, b64 == Py_None ? NULL : b64, compact ? "," : ", ", compact ? ":" : ": ", compact ? 1 : 2,
             compact ? 1 : 2, rows == Py_None ? NULL : rows};
    Buf b = {NULL, 0, 0};
    PyObject *out = NULL;
    if (put_obj(&b, obj, &e, NULL, 0, 0) == 0)
        out = as_bytes ? PyBytes_FromStringAndSize(b.p ? b.p : "", b.n) : PyUnicode_DecodeUTF8(b.p ? b.p : "", b.n, NULL);
    PyMem_Free(b.p);
    return out;
}

/* sep + the sorted columns in b64 as a JSON list, if any; b64 is emptied */
static int put_b64_keys(Buf *b, PyObject *b64, Enc *e, const char *sep, Py_ssize_t sep_n) {
    if (PySet_GET_SIZE(b64) == 0) return 0;
    PyObject *keys = PySequence_List(b64);
    if (!keys) return -1;
    int bad = PyList_Sort(keys) < 0 || buf_put(b, sep, sep_n) < 0 || put_obj(b, keys, e, NULL, 0, 0) < 0;
    Py_DECREF(keys);
    return bad || PySet_Clear(b64) < 0 ? -1 : 0;
}

/* A row change's schema, op, before and after (new references), as the senders' batch renderers read them. */
static int change_fields(PyObject *ch, PyObject **schema, PyObject **op, PyObject **before, PyObject **after) {
    static PyObject *s_schema, *s_op, *s_before, *s_after;
    if ((!s_schema && !(s_schema = PyUnicode_InternFromString("schema")))
        || (!s_op && !(s_op = PyUnicode_InternFromString("op")))
        || (!s_before && !(s_before = PyUnicode_InternFromString("before")))
        || (!s_after && !(s_after = PyUnicode_InternFromString("after"))))
        return -1;
    if (!(*schema = PyObject_GetAttr(ch, s_schema)) || !(*op = PyObject_GetAttr(ch, s_op))
        || !(*before = PyObject_GetAttr(ch, s_before)) || !(*after = PyObject_GetAttr(ch, s_after)))
        return -1;
    return 0;
}

/* piece(schema) once per schema object of one call: cache maps the schema's address to (made, schema)
   (holding the schema, so its address is not reused during the call). valid(made) checks the result
   (0 = refused, with the exception set). Returns made, borrowed from the cache, or NULL. */
static PyObject *schema_piece(PyObject *cache, PyObject *schema, PyObject *piece, int (*valid)(PyObject *)) {
    PyObject *key = PyLong_FromVoidPtr(schema);
    if (!key) return NULL;
    PyObject *entry = PyDict_GetItemWithError(cache, key); /* borrowed */
    if (!entry) {
        PyObject *made = PyErr_Occurred() ? NULL : PyObject_CallOneArg(piece, schema);
        if (!made || !valid(made) || !(entry = PyTuple_Pack(2, made, schema))) {
            Py_XDECREF(made);
            Py_DECREF(key);
            return NULL;
        }
        Py_DECREF(made);
        int rc = PyDict_SetItem(cache, key, entry);
        Py_DECREF(entry); /* (the cache holds it) */
        if (rc < 0) {
            Py_DECREF(key);
            return NULL;
        }
    }
    Py_DECREF(key);
    return PyTuple_GET_ITEM(entry, 0);
}

static int lines_piece_valid(PyObject *made) {
    if (PyTuple_Check(made) && PyTuple_GET_SIZE(made) == 2 && PyBytes_Check(PyTuple_GET_ITEM(made, 0))
        && PyBytes_Check(PyTuple_GET_ITEM(made, 1)))
        return 1;
    PyErr_SetString(PyExc_RuntimeError, "piece(schema) must return (bytes, bytes)");
    return 0;
}

/* The file sender's JSON lines of one slice of a transaction, joined, each ending in "\n":
 * prefix + "seq": i, <db/table/"op": > op <, "pk": [...], "before": > before, "after": after,
 * "txn_rows": total, "last": bool [, "b64": [sorted keys]]}
 * exactly as senders/local.py's per-line path writes them. piece(schema) -> (bytes, bytes)
 * gives the parts that depend only on the table (called once per schema object). */
static PyObject *json_lines(PyObject *self, PyObject *args) {
    PyObject *prefix, *changes, *piece, *fallback;
    Py_ssize_t seq0, total;
    if (!PyArg_ParseTuple(args, "SOOOnn", &prefix, &changes, &piece, &fallback, &seq0, &total)) return NULL;
    if (seq0 < 0 || total < 0) {
        PyErr_SetString(PyExc_ValueError, "seq0 and txn_rows must be >= 0");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(changes, "changes must be a sequence");
    if (!seq) return NULL;
    PyObject *cache = PyDict_New(), *b64 = PySet_New(NULL), *out = NULL;
    Buf b = {NULL, 0, 0};
    Enc e = {fallback, b64, ", ", ": ", 2, 2, NULL};
    const char *pre = PyBytes_AS_STRING(prefix);
    Py_ssize_t pre_n = PyBytes_GET_SIZE(prefix);
    char num[64];
    if (!cache || !b64) goto done;
    /* the size is read at each step and the change held: its attributes may run code that changes the list */
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *ch = PySequence_Fast_GET_ITEM(seq, i);
        Py_INCREF(ch);
        PyObject *schema = NULL, *op = NULL, *before = NULL, *after = NULL, *pieces;
        int rc = -1;
        if (change_fields(ch, &schema, &op, &before, &after) < 0
            || !(pieces = schema_piece(cache, schema, piece, lines_piece_valid)))
            goto row_done;
        PyObject *pa = PyTuple_GET_ITEM(pieces, 0), *pb = PyTuple_GET_ITEM(pieces, 1);
        char *np = num;
        memcpy(np, "\"seq\": ", 7);
        np = fmt_uint(np + 7, (unsigned long long)seq0 + (unsigned long long)i, 1); /* no signed overflow */
        *np++ = ',';
        *np++ = ' ';
        if (buf_put(&b, pre, pre_n) < 0 || buf_put(&b, num, np - num) < 0
            || buf_put(&b, PyBytes_AS_STRING(pa), PyBytes_GET_SIZE(pa)) < 0 || put_obj(&b, op, &e, NULL, 0, 0) < 0
            || buf_put(&b, PyBytes_AS_STRING(pb), PyBytes_GET_SIZE(pb)) < 0 || put_obj(&b, before, &e, NULL, 0, 1) < 0
            || buf_put(&b, ", \"after\": ", 11) < 0 || put_obj(&b, after, &e, NULL, 0, 1) < 0)
            goto row_done;
        np = num;
        memcpy(np, ", \"txn_rows\": ", 14);
        np = fmt_uint(np + 14, (unsigned long long)total, 1);
        if ((unsigned long long)seq0 + (unsigned long long)i + 1 == (unsigned long long)total) {
            memcpy(np, ", \"last\": true", 14);
            np += 14;
        } else {
            memcpy(np, ", \"last\": false", 15);
            np += 15;
        }
        if (buf_put(&b, num, np - num) < 0 || put_b64_keys(&b, b64, &e, ", \"b64\": ", 9) < 0) goto row_done;
        rc = buf_put(&b, "}\n", 2);
    row_done:
        Py_DECREF(ch);
        Py_XDECREF(schema);
        Py_XDECREF(op);
        Py_XDECREF(before);
        Py_XDECREF(after);
        if (rc < 0) goto done;
    }
    out = PyBytes_FromStringAndSize(b.p ? b.p : "", b.n);
done:
    PyMem_Free(b.p);
    Py_XDECREF(cache);
    Py_XDECREF(b64);
    Py_DECREF(seq);
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

/* one literal as pymysql writes it: lit_one, else fallback(value) (a str) */
static int lit_or_fallback(Buf *b, PyObject *v, int no_backslash, PyObject *fallback) {
    int rc = lit_one(b, v, no_backslash);
    if (rc != 0) return rc < 0 ? -1 : 0;
    PyObject *lit = PyObject_CallOneArg(fallback, v);
    if (!lit) return -1;
    if (!PyUnicode_Check(lit)) {
        PyErr_Format(PyExc_TypeError, "fallback returned %.100s, not str", Py_TYPE(lit)->tp_name);
        Py_DECREF(lit);
        return -1;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(lit, &n);
    rc = s ? buf_put(b, s, n) : -1;
    Py_DECREF(lit);
    return rc;
}

/* "(v, ...), (v, ...)": the values of cols of every row (dicts), as pymysql's
   Cursor.mogrify writes the same text with %s placeholders and the values as parameters */
static PyObject *sql_tuples(PyObject *self, PyObject *args) {
    PyObject *rows, *cols, *fallback;
    int no_backslash;
    if (!PyArg_ParseTuple(args, "OOpO", &rows, &cols, &no_backslash, &fallback)) return NULL;
    /* tuples of our own: the fallback (Python code) may change the caller's lists */
    PyObject *rseq = PySequence_Tuple(rows);
    if (!rseq) return NULL;
    PyObject *cseq = PySequence_Tuple(cols);
    if (!cseq) { Py_DECREF(rseq); return NULL; }
    Py_ssize_t nr = PyTuple_GET_SIZE(rseq), nc = PyTuple_GET_SIZE(cseq);
    Buf b = {NULL, 0, 0};
    PyObject *out = NULL;
    for (Py_ssize_t r = 0; r < nr; r++) {
        PyObject *row = PyTuple_GET_ITEM(rseq, r);
        if (!PyDict_Check(row)) {
            PyErr_Format(PyExc_TypeError, "row %zd is %.100s, not a dict", r, Py_TYPE(row)->tp_name);
            goto done;
        }
        if (buf_put(&b, r ? ", (" : "(", r ? 3 : 1) < 0) goto done;
        for (Py_ssize_t c = 0; c < nc; c++) {
            PyObject *key = PyTuple_GET_ITEM(cseq, c);
            PyObject *v = PyDict_GetItemWithError(row, key);
            if (!v) {
                if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
                goto done;
            }
            if (c && buf_put(&b, ", ", 2) < 0) goto done;
            Py_INCREF(v);  /* the fallback may run Python code */
            int rc = lit_or_fallback(&b, v, no_backslash, fallback);
            Py_DECREF(v);
            if (rc < 0) goto done;
        }
        if (buf_put(&b, ")", 1) < 0) goto done;
    }
    out = PyUnicode_DecodeUTF8(b.p ? b.p : "", b.n, NULL);
done:
    PyMem_Free(b.p);
    Py_DECREF(cseq);
    Py_DECREF(rseq);
    return out;
}

/* Kafka's murmur2 (the Java client's default partitioner), as senders/kafka/sender.py's Python murmur2 */
static uint32_t murmur2_raw(const unsigned char *d, Py_ssize_t len) {
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
    return h;
}

static PyObject *murmur2(PyObject *self, PyObject *arg) {
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t h = murmur2_raw(v.buf, v.len);
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLong(h);
}

/* ------------------------------------------------------------------------ */
/* The Kafka sender's json format: one Debezium-like envelope per event        */

static int put_bytes_obj(Buf *b, PyObject *o) {
    return buf_put(b, PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o));
}

/* the message key: {"c":v,...} of the primary-key columns, compact, bytes as base64 (not listed) */
static PyObject *kj_key(PyObject *pk, PyObject *image, Enc *ek) {
    Buf b = {NULL, 0, 0};
    PyObject *out = NULL;
    if (buf_put(&b, "{", 1) < 0) goto done;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(pk); i++) {
        PyObject *c = PyTuple_GET_ITEM(pk, i);
        PyObject *v = PyDict_GetItemWithError(image, c); /* borrowed */
        if (!v && PyErr_Occurred()) goto done;
        Py_XINCREF(v);
        int bad = (i && buf_put(&b, ",", 1) < 0) || put_str(&b, c) < 0 || buf_put(&b, ":", 1) < 0
                  || put_obj(&b, v ? v : Py_None, ek, NULL, 1, 0) < 0;
        Py_XDECREF(v);
        if (bad) goto done;
    }
    if (buf_put(&b, "}", 1) < 0) goto done;
    out = PyBytes_FromStringAndSize(b.p, b.n);
done:
    PyMem_Free(b.p);
    return out;
}

/* 1 if any primary-key column differs between the images (Python's !=), 0 if not, -1 on error */
static int kj_pk_changed(PyObject *pk, PyObject *before, PyObject *after) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(pk); i++) {
        PyObject *c = PyTuple_GET_ITEM(pk, i);
        PyObject *x = PyDict_GetItemWithError(before, c);
        if (!x && PyErr_Occurred()) return -1;
        PyObject *y = PyDict_GetItemWithError(after, c);
        if (!y && PyErr_Occurred()) return -1;
        Py_XINCREF(x);
        Py_XINCREF(y);
        PyObject *r = PyObject_RichCompare(x ? x : Py_None, y ? y : Py_None, Py_NE);
        Py_XDECREF(x);
        Py_XDECREF(y);
        if (!r) return -1;
        int t = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (t) return t;
    }
    return 0;
}

/* piece(schema) of kafka_json: (topic, partitions >= 1, bytes, tuple of str, bytes) */
static int kafka_piece_valid(PyObject *made) {
    if (!PyTuple_Check(made) || PyTuple_GET_SIZE(made) != 5 || !PyUnicode_Check(PyTuple_GET_ITEM(made, 0))
        || !PyLong_Check(PyTuple_GET_ITEM(made, 1)) || !PyBytes_Check(PyTuple_GET_ITEM(made, 2))
        || !PyTuple_Check(PyTuple_GET_ITEM(made, 3)) || !PyBytes_Check(PyTuple_GET_ITEM(made, 4))) {
        PyErr_SetString(PyExc_RuntimeError, "piece(schema) must return (str, int, bytes, tuple, bytes)");
        return 0;
    }
    PyObject *pk = PyTuple_GET_ITEM(made, 3);
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(pk); k++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(pk, k))) {
            PyErr_SetString(PyExc_TypeError, "kafka_json: key columns must be str");
            return 0;
        }
    long parts = PyLong_AsLong(PyTuple_GET_ITEM(made, 1));
    if (parts < 1) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "kafka_json: partitions must be >= 1");
        return 0;
    }
    return 1;
}

/* kafka_json(changes, seq0, txn_rows, (head, mid, tail, tail_last, end), piece, fallback, (h_region, h_commit_ts),
 *            tombstones) -> [(topic, partition, key, value, headers), ...]
 * exactly what senders/kafka/messages.py's json_envelope, change_events and key_bytes and the sender's
 * partitioning give, message by message (a unit test compares them). piece(schema) -> (topic, partitions,
 * b'"db":..,"table":..,', pk names tuple, key bytes of a keyless table), called once per schema object. */
static PyObject *kafka_json(PyObject *self, PyObject *args) {
    static PyObject *s_insert, *s_read, *s_delete, *h_seq, *h_op[4];
    static const char opc[4] = {'c', 'u', 'd', 'r'};
    PyObject *changes, *txnp, *piece, *fallback, *hbase;
    Py_ssize_t seq0, total;
    int tombstones;
    if (!PyArg_ParseTuple(args, "OnnO!OOO!p", &changes, &seq0, &total, &PyTuple_Type, &txnp, &piece, &fallback,
                          &PyTuple_Type, &hbase, &tombstones))
        return NULL;
    if (seq0 < 0 || total < 0 || PyTuple_GET_SIZE(txnp) != 5 || PyTuple_GET_SIZE(hbase) != 2) {
        PyErr_SetString(PyExc_ValueError, "kafka_json: bad arguments");
        return NULL;
    }
    for (int i = 0; i < 5; i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(txnp, i))) {
            PyErr_SetString(PyExc_TypeError, "kafka_json: the transaction's pieces must be bytes");
            return NULL;
        }
    if (!h_op[3]) { /* (each made once; a failure part-way is completed by the next call) */
        if ((!s_insert && !(s_insert = PyUnicode_InternFromString("insert")))
            || (!s_read && !(s_read = PyUnicode_InternFromString("read")))
            || (!s_delete && !(s_delete = PyUnicode_InternFromString("delete")))
            || (!h_seq && !(h_seq = PyUnicode_InternFromString("seq"))))
            return NULL;
        for (int i = 0; i < 4; i++)
            if (!h_op[i] && !(h_op[i] = Py_BuildValue("(sy#)", "op", &opc[i], (Py_ssize_t)1))) return NULL;
    }
    PyObject *head = PyTuple_GET_ITEM(txnp, 0), *mid = PyTuple_GET_ITEM(txnp, 1), *tail = PyTuple_GET_ITEM(txnp, 2),
             *tail_last = PyTuple_GET_ITEM(txnp, 3), *end = PyTuple_GET_ITEM(txnp, 4);
    PyObject *seq = PySequence_Fast(changes, "changes must be a sequence");
    if (!seq) return NULL;
    PyObject *cache = PyDict_New(), *b64 = PySet_New(NULL), *out = PyList_New(0);
    Buf b = {NULL, 0, 0};
    Enc e = {fallback, b64, ",", ":", 1, 1, NULL};
    Enc ek = {fallback, NULL, ",", ":", 1, 1, NULL};
    char num[64];
    if (!cache || !b64 || !out) goto fail;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *ch = PySequence_Fast_GET_ITEM(seq, i);
        Py_INCREF(ch);
        PyObject *schema = NULL, *op = NULL, *before = NULL, *after = NULL, *pieces, *seq_h = NULL;
        int rc = -1;
        if (change_fields(ch, &schema, &op, &before, &after) < 0) goto row_done;
        /* (a dict subclass may answer get() its own way: the Python path writes it) */
        if ((before != Py_None && !PyDict_CheckExact(before)) || (after != Py_None && !PyDict_CheckExact(after))
            || !PyUnicode_CheckExact(op)) {
            PyErr_SetString(PyExc_TypeError, "kafka_json: row images must be dicts and the op a str");
            goto row_done;
        }
        if (!(pieces = schema_piece(cache, schema, piece, kafka_piece_valid))) goto row_done;
        PyObject *topic = PyTuple_GET_ITEM(pieces, 0), *dbtable = PyTuple_GET_ITEM(pieces, 2),
                 *pk = PyTuple_GET_ITEM(pieces, 3), *keyless = PyTuple_GET_ITEM(pieces, 4);
        long parts = PyLong_AsLong(PyTuple_GET_ITEM(pieces, 1));
        /* change_events: (op code index, key image) pairs */
        int ev[2], nev = 1;
        PyObject *img[2];
        if (PyUnicode_Compare(op, s_insert) == 0) { ev[0] = 0; img[0] = after; }
        else if (PyUnicode_Compare(op, s_read) == 0) { ev[0] = 3; img[0] = after; }
        else if (PyUnicode_Compare(op, s_delete) == 0) { ev[0] = 2; img[0] = before; }
        else {
            if (PyErr_Occurred()) goto row_done;
            int moved = 0;
            if (PyTuple_GET_SIZE(pk) && before != Py_None && after != Py_None) {
                moved = kj_pk_changed(pk, before, after);
                if (moved < 0) goto row_done;
            }
            if (moved) { ev[0] = 2; img[0] = before; ev[1] = 0; img[1] = after; nev = 2; }
            else { ev[0] = 1; img[0] = after; }
        }
        unsigned long long sq = (unsigned long long)seq0 + (unsigned long long)i;
        char *np = fmt_uint(num, sq, 1);
        if (!(seq_h = Py_BuildValue("(Oy#)", h_seq, num, (Py_ssize_t)(np - num)))) goto row_done;
        for (int k = 0; k < nev; k++) {
            int c = ev[k];
            PyObject *key = NULL, *value = NULL, *headers = NULL, *msg = NULL, *partobj = NULL;
            int ok = 0;
            if (PyTuple_GET_SIZE(pk) && img[k] != Py_None) {
                if (!(key = kj_key(pk, img[k], &ek))) goto ev_done;
            } else {
                key = Py_NewRef(Py_None);
            }
            PyObject *hk = key != Py_None ? key : keyless;
            uint32_t h = murmur2_raw((const unsigned char *)PyBytes_AS_STRING(hk), PyBytes_GET_SIZE(hk));
            if (!(partobj = PyLong_FromLong((long)((h & 0x7FFFFFFF) % (unsigned long)parts)))) goto ev_done;
            /* the envelope */
            b.n = 0;
            if (buf_put(&b, "{\"before\":", 10) < 0
                || put_obj(&b, (c == 1 || c == 2) ? before : Py_None, &e, NULL, 1, 1) < 0
                || buf_put(&b, ",\"after\":", 9) < 0
                || put_obj(&b, (c != 2) ? after : Py_None, &e, NULL, 1, 1) < 0)
                goto ev_done;
            char opbuf[10] = {',', '"', 'o', 'p', '"', ':', '"', opc[c], '"'};
            if (buf_put(&b, opbuf, 9) < 0 || put_bytes_obj(&b, head) < 0 || put_bytes_obj(&b, dbtable) < 0
                || put_bytes_obj(&b, mid) < 0 || buf_put(&b, num, np - num) < 0
                || put_bytes_obj(&b, sq + 1 == (unsigned long long)total ? tail_last : tail) < 0)
                goto ev_done;
            char *tp = fmt_uint(num + 32, sq + 1, 1);
            if (buf_put(&b, num + 32, tp - (num + 32)) < 0 || put_bytes_obj(&b, end) < 0
                || put_b64_keys(&b, b64, &e, ",\"b64\":", 7) < 0)
                goto ev_done;
            if (buf_put(&b, "}", 1) < 0 || !(value = PyBytes_FromStringAndSize(b.p, b.n))) goto ev_done;
            if (!(headers = PyList_New(4))) goto ev_done;
            for (int j = 0; j < 2; j++) PyList_SET_ITEM(headers, j, Py_NewRef(PyTuple_GET_ITEM(hbase, j)));
            PyList_SET_ITEM(headers, 2, Py_NewRef(seq_h));
            PyList_SET_ITEM(headers, 3, Py_NewRef(h_op[c]));
            if (!(msg = PyTuple_Pack(5, topic, partobj, key, value, headers)) || PyList_Append(out, msg) < 0) goto ev_done;
            if (c == 2 && tombstones && key != Py_None) {
                Py_DECREF(msg);
                if (!(msg = PyTuple_Pack(5, topic, partobj, key, Py_None, headers)) || PyList_Append(out, msg) < 0)
                    goto ev_done;
            }
            ok = 1;
        ev_done:
            Py_XDECREF(key);
            Py_XDECREF(value);
            Py_XDECREF(headers);
            Py_XDECREF(msg);
            Py_XDECREF(partobj);
            if (!ok) goto row_done;
        }
        rc = 0;
    row_done:
        Py_DECREF(ch);
        Py_XDECREF(schema);
        Py_XDECREF(op);
        Py_XDECREF(before);
        Py_XDECREF(after);
        Py_XDECREF(seq_h);
        if (rc < 0) goto fail;
    }
    PyMem_Free(b.p);
    Py_DECREF(cache);
    Py_DECREF(b64);
    Py_DECREF(seq);
    return out;
fail:
    PyMem_Free(b.p);
    Py_XDECREF(cache);
    Py_XDECREF(b64);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}


/* ------------------------------------------------------------------------ */
/* The wire format's rows (capturer/model/wire.py) as msgpack, in C: what    */
/* Encoder._rows + packb and Decoder.rows + unpackb's ext_hook do in Python, */
/* for the agents' streams, the sender processes' pipes and the backlog.     */
/* Extension types: 1 Decimal, 2 datetime, 3 date, 4 time, 5 timedelta,      */
/* 6 set, 7 integer beyond 64 bits (see wire.py). A value of another type,   */
/* or an aware datetime/time, goes to the caller's fallback (wire._default). */

static PyObject *WireExtType = NULL;  /* msgpack.ExtType, set by wire_setup */

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

static PyObject *S_schema, *S_op, *S_before, *S_after;

/* wire_rows(changes, sid_of, op_codes, fallback) -> bytes: the msgpack array of the
   changes' [sid, op, before, after]; sid_of(schema) -> int (called once per run of one
   schema), op_codes a dict op -> int */
static PyObject *wire_rows(PyObject *self, PyObject *args) {
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

/* --- decoding --- */
static int parse_digits(const char *s, Py_ssize_t n, Py_ssize_t at, int count, int *out) {
    if (at + count > n) return -1;
    int v = 0;
    for (int i = 0; i < count; i++) {
        char c = s[at + i];
        if (c < '0' || c > '9') return -1;
        v = v * 10 + (c - '0');
    }
    *out = v;
    return 0;
}

/* HH:MM:SS[.ffffff] at s[at..n) exactly; -1 if it is not that */
static int parse_hms(const char *s, Py_ssize_t n, Py_ssize_t at, int *h, int *m, int *sec, int *us) {
    if (parse_digits(s, n, at, 2, h) || at + 2 >= n || s[at + 2] != ':' || parse_digits(s, n, at + 3, 2, m)
        || at + 5 >= n || s[at + 5] != ':' || parse_digits(s, n, at + 6, 2, sec))
        return -1;
    *us = 0;
    if (at + 8 == n) return 0;
    if (s[at + 8] != '.' || at + 15 != n || parse_digits(s, n, at + 9, 6, us)) return -1;
    return 0;
}

/* wire_ext(code, data): what wire._ext_hook gives; the common naive forms parsed here,
   anything else by the Python hook (slow) */
static PyObject *WireSlowHook = NULL;

static PyObject *ext_make(int code, const char *s, Py_ssize_t n) {
    if (code == 1) {
        PyObject *str = PyUnicode_DecodeUTF8(s, n, "strict");
        if (!str) return NULL;
        PyObject *d = PyObject_CallOneArg(Decimal, str);
        Py_DECREF(str);
        return d;
    }
    int y, mo, d, h, mi, sec, us;
    if (code == 2 && n >= 19 && s[10] == 'T' && !parse_digits(s, n, 0, 4, &y) && s[4] == '-'
        && !parse_digits(s, n, 5, 2, &mo) && s[7] == '-' && !parse_digits(s, n, 8, 2, &d)
        && !parse_hms(s, n, 11, &h, &mi, &sec, &us))
        return PyDateTime_FromDateAndTime(y, mo, d, h, mi, sec, us);
    if (code == 3 && n == 10 && !parse_digits(s, n, 0, 4, &y) && s[4] == '-' && !parse_digits(s, n, 5, 2, &mo)
        && s[7] == '-' && !parse_digits(s, n, 8, 2, &d))
        return PyDate_FromDate(y, mo, d);
    if (code == 4 && !parse_hms(s, n, 0, &h, &mi, &sec, &us))
        return PyTime_FromTime(h, mi, sec, us);
    if (!WireSlowHook) {
        PyErr_SetString(PyExc_RuntimeError, "wire_setup was not called");
        return NULL;
    }
    return PyObject_CallFunction(WireSlowHook, "iy#", code, s, n);
}

static PyObject *wire_ext(PyObject *self, PyObject *args) {
    int code;
    const char *s;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "iy#", &code, &s, &n)) return NULL;
    return ext_make(code, s, n);
}

/* wire_unrows(rows, schemas, row_change, ops) -> list of RowChange: Decoder.rows; schemas
   a dict sid -> (schema, columns), ops a tuple of op names. ValueError for a bad row. */
static PyObject *image_of(PyObject *v, PyObject *cols) {
    if (v == Py_None || !PyList_CheckExact(v)) return Py_NewRef(v);
    Py_ssize_t n = PyList_GET_SIZE(v);
    if (n != PyTuple_GET_SIZE(cols)) {
        PyErr_SetString(PyExc_ValueError, "a row image does not match its schema's columns");
        return NULL;
    }
    PyObject *d = _PyDict_NewPresized(n);
    if (!d) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(cols, i), PyList_GET_ITEM(v, i)) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

static PyObject *wire_unrows(PyObject *self, PyObject *args) {
    PyObject *rows, *schemas, *row_change, *ops;
    if (!PyArg_ParseTuple(args, "O!O!O!O!", &PyList_Type, &rows, &PyDict_Type, &schemas, &PyType_Type, &row_change,
                          &PyTuple_Type, &ops))
        return NULL;
    PyTypeObject *rt = (PyTypeObject *)row_change;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(rows, i);
        if (!PyList_CheckExact(r) || PyList_GET_SIZE(r) != 4) goto bad;
        PyObject *ent = PyDict_GetItemWithError(schemas, PyList_GET_ITEM(r, 0));
        if (!ent) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a row of an unknown schema");
            goto fail;
        }
        if (!PyTuple_Check(ent) || PyTuple_GET_SIZE(ent) != 2) goto bad;
        PyObject *schema = PyTuple_GET_ITEM(ent, 0), *cols = PyTuple_GET_ITEM(ent, 1);
        long op = PyLong_AsLong(PyList_GET_ITEM(r, 1));
        if (op == -1 && PyErr_Occurred()) goto fail;
        if (op < 0 || op >= PyTuple_GET_SIZE(ops) || !PyTuple_Check(cols)) goto bad;
        PyObject *b = image_of(PyList_GET_ITEM(r, 2), cols);
        if (!b) goto fail;
        PyObject *a = image_of(PyList_GET_ITEM(r, 3), cols);
        if (!a) { Py_DECREF(b); goto fail; }
        /* a RowChange without running the dataclass's __init__ (it only assigns its four slots) */
        PyObject *ch = rt->tp_alloc(rt, 0);
        if (!ch || PyObject_GenericSetAttr(ch, S_schema, schema) < 0
            || PyObject_GenericSetAttr(ch, S_op, PyTuple_GET_ITEM(ops, op)) < 0
            || PyObject_GenericSetAttr(ch, S_before, b) < 0 || PyObject_GenericSetAttr(ch, S_after, a) < 0) {
            Py_XDECREF(ch);
            Py_DECREF(b);
            Py_DECREF(a);
            goto fail;
        }
        Py_DECREF(b);
        Py_DECREF(a);
        PyList_SET_ITEM(out, i, ch);
    }
    return out;
bad:
    PyErr_SetString(PyExc_ValueError, "a bad row change");
fail:
    Py_DECREF(out);
    return NULL;
}


/* wire_unpack(data) -> the value: msgpack.unpackb(data, ext_hook=wire._ext_hook,
   unicode_errors="surrogatepass", raw=False, strict_map_key=False) for the values the
   wire format holds, with its extension types 1-4 made here (5-7 by the Python hook).
   Every read is bounds-checked; malformed data raises ValueError. */
typedef struct {
    const unsigned char *p, *end;
} Rd;

static int rd_need(Rd *r, Py_ssize_t n) {
    if (r->end - r->p < n) {
        PyErr_SetString(PyExc_ValueError, "truncated msgpack data");
        return -1;
    }
    return 0;
}

static uint64_t rd_be(Rd *r, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | r->p[i];
    r->p += n;
    return v;
}

static PyObject *rd_value(Rd *r, int depth);

static PyObject *rd_str(Rd *r, Py_ssize_t n) {
    if (rd_need(r, n) < 0) return NULL;
    PyObject *o = PyUnicode_DecodeUTF8((const char *)r->p, n, "surrogatepass");
    r->p += n;
    return o;
}

static PyObject *rd_bin(Rd *r, Py_ssize_t n) {
    if (rd_need(r, n) < 0) return NULL;
    PyObject *o = PyBytes_FromStringAndSize((const char *)r->p, n);
    r->p += n;
    return o;
}

static PyObject *rd_array(Rd *r, Py_ssize_t n, int depth) {
    if (n > r->end - r->p) {  /* every element takes at least one byte */
        PyErr_SetString(PyExc_ValueError, "truncated msgpack data");
        return NULL;
    }
    PyObject *l = PyList_New(n);
    if (!l) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = rd_value(r, depth + 1);
        if (!v) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, i, v);
    }
    return l;
}

static PyObject *rd_map(Rd *r, Py_ssize_t n, int depth) {
    if (n > (r->end - r->p) / 2) {
        PyErr_SetString(PyExc_ValueError, "truncated msgpack data");
        return NULL;
    }
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = rd_value(r, depth + 1);
        if (!k) goto fail;
        PyObject *v = rd_value(r, depth + 1);
        if (!v) {
            Py_DECREF(k);
            goto fail;
        }
        int rc = PyDict_SetItem(d, k, v);  /* an unhashable key: TypeError, as msgpack gives */
        Py_DECREF(k);
        Py_DECREF(v);
        if (rc < 0) goto fail;
    }
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

static PyObject *rd_ext(Rd *r, int code, Py_ssize_t n) {
    if (rd_need(r, n) < 0) return NULL;
    const char *s = (const char *)r->p;
    r->p += n;
    return ext_make(code, s, n);
}

static PyObject *rd_value(Rd *r, int depth) {
    if (depth > 512) {
        PyErr_SetString(PyExc_ValueError, "msgpack data nested too deeply");
        return NULL;
    }
    if (rd_need(r, 1) < 0) return NULL;
    unsigned char t = *r->p++;
    if (t <= 0x7f) return PyLong_FromLong(t);
    if (t >= 0xe0) return PyLong_FromLong((signed char)t);
    if ((t & 0xe0) == 0xa0) return rd_str(r, t & 0x1f);
    if ((t & 0xf0) == 0x90) return rd_array(r, t & 0x0f, depth);
    if ((t & 0xf0) == 0x80) return rd_map(r, t & 0x0f, depth);
    int n;
    switch (t) {
    case 0xc0: Py_RETURN_NONE;
    case 0xc2: Py_RETURN_FALSE;
    case 0xc3: Py_RETURN_TRUE;
    case 0xc4: case 0xc5: case 0xc6:
        n = t == 0xc4 ? 1 : t == 0xc5 ? 2 : 4;
        if (rd_need(r, n) < 0) return NULL;
        return rd_bin(r, (Py_ssize_t)rd_be(r, n));
    case 0xc7: case 0xc8: case 0xc9: {
        n = t == 0xc7 ? 1 : t == 0xc8 ? 2 : 4;
        if (rd_need(r, n + 1) < 0) return NULL;
        Py_ssize_t len = (Py_ssize_t)rd_be(r, n);
        int code = (signed char)*r->p++;
        return rd_ext(r, code, len);
    }
    case 0xca: {
        if (rd_need(r, 4) < 0) return NULL;
        union { uint32_t u; float f; } x;
        x.u = (uint32_t)rd_be(r, 4);
        return PyFloat_FromDouble(x.f);
    }
    case 0xcb: {
        if (rd_need(r, 8) < 0) return NULL;
        union { uint64_t u; double d; } x;
        x.u = rd_be(r, 8);
        return PyFloat_FromDouble(x.d);
    }
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
        n = 1 << (t - 0xcc);
        if (rd_need(r, n) < 0) return NULL;
        return PyLong_FromUnsignedLongLong(rd_be(r, n));
    case 0xd0: if (rd_need(r, 1) < 0) return NULL; return PyLong_FromLong((int8_t)rd_be(r, 1));
    case 0xd1: if (rd_need(r, 2) < 0) return NULL; return PyLong_FromLong((int16_t)rd_be(r, 2));
    case 0xd2: if (rd_need(r, 4) < 0) return NULL; return PyLong_FromLong((int32_t)rd_be(r, 4));
    case 0xd3: if (rd_need(r, 8) < 0) return NULL; return PyLong_FromLongLong((int64_t)rd_be(r, 8));
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: {
        if (rd_need(r, 1) < 0) return NULL;
        int code = (signed char)*r->p++;
        return rd_ext(r, code, (Py_ssize_t)1 << (t - 0xd4));
    }
    case 0xd9: case 0xda: case 0xdb:
        n = t == 0xd9 ? 1 : t == 0xda ? 2 : 4;
        if (rd_need(r, n) < 0) return NULL;
        return rd_str(r, (Py_ssize_t)rd_be(r, n));
    case 0xdc: case 0xdd:
        n = t == 0xdc ? 2 : 4;
        if (rd_need(r, n) < 0) return NULL;
        return rd_array(r, (Py_ssize_t)rd_be(r, n), depth);
    case 0xde: case 0xdf:
        n = t == 0xde ? 2 : 4;
        if (rd_need(r, n) < 0) return NULL;
        return rd_map(r, (Py_ssize_t)rd_be(r, n), depth);
    default:  /* 0xc1: never used */
        PyErr_Format(PyExc_ValueError, "bad msgpack type byte 0x%02x", t);
        return NULL;
    }
}

static PyObject *wire_unpack(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Rd r = {(const unsigned char *)view.buf, (const unsigned char *)view.buf + view.len};
    PyObject *v = rd_value(&r, 0);
    if (v && r.p != r.end) {
        Py_DECREF(v);
        v = NULL;
        PyErr_SetString(PyExc_ValueError, "extra data after a msgpack value");
    }
    PyBuffer_Release(&view);
    return v;
}

/* wire_setup(ext_type, slow_hook): msgpack.ExtType, and the Python ext hook for what wire_ext leaves */
static PyObject *wire_setup(PyObject *self, PyObject *args) {
    PyObject *ext, *hook;
    if (!PyArg_ParseTuple(args, "OO", &ext, &hook)) return NULL;
    Py_XSETREF(WireExtType, Py_NewRef(ext));
    Py_XSETREF(WireSlowHook, Py_NewRef(hook));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"sql_literals", (PyCFunction)sql_literals, METH_VARARGS,
     "sql_literals(values, no_backslash_escapes, fallback) -> tuple of SQL literals as pymysql writes them;\n"
     "fallback(value) (pymysql's Connection.escape) for any other type"},
    {"sql_tuples", (PyCFunction)sql_tuples, METH_VARARGS,
     "sql_tuples(rows, cols, no_backslash_escapes, fallback) -> str: '(v, ...), (v, ...)', the values of cols\n"
     "of each row (a dict) as pymysql writes them; fallback(value) (Connection.escape) for any other type"},
    {"murmur2", (PyCFunction)murmur2, METH_O, "murmur2(data: bytes) -> int (Kafka's partitioner hash)"},
    {"baikal_plan", (PyCFunction)baikal_plan, METH_VARARGS,
     "baikal_plan(((field_id, name, kind), ...), known_field_ids, encoding) -> a BaikalDB row decoder"},
    {"pg_plan", (PyCFunction)pg_plan, METH_VARARGS,
     "pg_plan(((name, kind, parser), ...), Unrepresentable) -> a pgoutput tuple decoder for one relation"},
    {"json_lines", (PyCFunction)json_lines, METH_VARARGS,
     "json_lines(prefix, changes, piece, fallback, seq0, txn_rows) -> bytes: the file sender's JSON lines of\n"
     "changes (seq numbered from seq0), each ending in a newline; piece(schema) -> (bytes, bytes)"},
    {"kafka_json", (PyCFunction)kafka_json, METH_VARARGS,
     "kafka_json(changes, seq0, txn_rows, (head, mid, tail, tail_last, end), piece, fallback, (h_region, h_ts),\n"
     "tombstones) -> [(topic, partition, key, value, headers)]: the Kafka sender's json messages of changes"},
    {"json_dumps", (PyCFunction)json_dumps, METH_VARARGS,
     "json_dumps(obj, fallback, b64_keys=None, compact=False, as_bytes=False, rows=None) -> str (or its UTF-8\n"
     "bytes): json.dumps(obj, ensure_ascii=False, default=fallback) for row values; the columns of base64-encoded\n"
     "values in the row images (the dicts under obj's keys in rows) are added to b64_keys"},
    {"wire_rows", (PyCFunction)wire_rows, METH_VARARGS,
     "wire_rows(changes, sid_of, op_codes, fallback) -> bytes: the msgpack array of the changes as the wire format\n"
     "writes rows ([sid, op, before, after], an image as its values in column order when its keys are the columns)"},
    {"wire_unrows", (PyCFunction)wire_unrows, METH_VARARGS,
     "wire_unrows(rows, schemas, RowChange, ops) -> [RowChange]: the wire format's rows back (schemas: sid ->\n"
     "(schema, columns))"},
    {"wire_ext", (PyCFunction)wire_ext, METH_VARARGS,
     "wire_ext(code, data): the wire format's extension values (the common ones in C)"},
    {"wire_setup", (PyCFunction)wire_setup, METH_VARARGS, "wire_setup(msgpack.ExtType, python_ext_hook)"},
    {"wire_unpack", (PyCFunction)wire_unpack, METH_O,
     "wire_unpack(data) -> the one msgpack value of data, as wire.unpackb reads it (extension values made in C)"},
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
    S_schema = PyUnicode_InternFromString("schema");
    S_op = PyUnicode_InternFromString("op");
    S_before = PyUnicode_InternFromString("before");
    S_after = PyUnicode_InternFromString("after");
    if (!S_schema || !S_op || !S_before || !S_after) return NULL;
    if (PyType_Ready(&PlanType) < 0) return NULL;
    if (PyType_Ready(&BPlanType) < 0) return NULL;
    if (PyType_Ready(&PgPlanType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "VERSION", 3);
    return m;
}
