/*
 * pg_images.c (capturer._fastrows): PostgreSQL pgoutput TupleData decoded into row images (column -> value),
 * the common types typed in C, every other value by its column's Python parser.
 * Python-visible: pg_plan(...) -> a PgPlan (its image(data, offset, only_present) method).
 */
#include "fastrows.h"
#include <datetime.h>

FR_DATETIME_IMPORT(fr_pg_images_datetime)

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
PyObject *pg_plan(PyObject *mod, PyObject *args) {
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
        PyObject *v = dec_from_text((const char *)s, n); /* (decimal.c: Decimal(text) without a str parsed) */
        if (v || PyErr_Occurred()) return v;
        PyObject *t = PyUnicode_DecodeASCII(s, n, "strict");
        if (!t) {
            PyErr_Clear();
            return Py_NewRef(Py_NotImplemented);
        }
        v = PyObject_CallOneArg(Decimal, t);
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

