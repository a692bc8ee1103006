/*
 * sql.c (capturer._fastrows): SQL literals exactly as pymysql's Connection.escape writes them (1.2.x), for
 * the MySQL sender's statements.
 * Python-visible: sql_literals, sql_tuples.
 */
#include "fastrows.h"

/* SQL literals, exactly as pymysql's Connection.escape writes them (1.2.x)   */

/* nonzero when one of the 8 bytes at s may need escaping (a byte < 0x20, '"', '\\' or '\''): json.c's esc8
   with the quote; a zero answer lets all 8 be copied as they are */
static inline uint64_t sql_esc8(const char *s) {
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t x;
    memcpy(&x, s, 8);
    uint64_t q = x ^ (ones * '"'), bs = x ^ (ones * '\\'), sq = x ^ (ones * '\'');
    return (((x - ones * 0x20) & ~x) | ((q - ones) & ~q) | ((bs - ones) & ~bs) | ((sq - ones) & ~sq)) & highs;
}

static int lit_escaped_str(Buf *b, PyObject *u, int no_backslash) {
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(u, &n);
    if (!s) return -1;
    if (buf_grow(b, n + 2) < 0) return -1;
    b->p[b->n++] = '\'';
    Py_ssize_t start = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        while (i + 8 <= n && !sql_esc8(s + i)) i += 8; /* (a word at a time where nothing needs escaping) */
        if (i >= n) break;
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
        char t[DEC_TEXT_CAP];
        Py_ssize_t tn = dec_chars(o, DEC_PLAIN, t, sizeof(t)); /* (format's text without a str: decimal.c) */
        if (tn > 0) return buf_put(b, t, tn) < 0 ? -1 : 1;
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

PyObject *sql_literals(PyObject *self, PyObject *args) {
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
PyObject *sql_tuples(PyObject *self, PyObject *args) {
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

