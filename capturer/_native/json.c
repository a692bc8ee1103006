/*
 * json.c (capturer._fastrows): JSON text of row values as json.dumps(ensure_ascii=False) with the project's
 * fallback writes it, and the file sender's JSON lines. Its writer (put_obj and helpers, fastrows.h) is
 * shared with sql.c and kafka.c.
 * Python-visible: json_dumps, json_lines.
 */
#include "fastrows.h"
#include <datetime.h>

FR_DATETIME_IMPORT(fr_json_datetime)

/* JSON text, as json.dumps(obj, ensure_ascii=False, default=json_value)      */
/* gives it for the values a row holds; see capturer/model/encode.py.              */
/* 8 bytes of a string: nonzero if one may need escaping (a byte < 0x20, '"' or '\\'). The bit tricks are
   exact for "has such a byte" (x - 0x01.. & ~x & 0x80.. has a bit set iff some byte of x is 0; x - 0x20.. the
   same for a byte < 0x20), so a zero answer lets all 8 bytes be copied as they are. */
static inline uint64_t esc8(const char *s) {
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t x;
    memcpy(&x, s, 8);
    uint64_t q = x ^ (ones * '"'), bs = x ^ (ones * '\\');
    return (((x - ones * 0x20) & ~x) | ((q - ones) & ~q) | ((bs - ones) & ~bs)) & highs;
}

static int put_escaped(Buf *b, const char *s, Py_ssize_t n) {
    static const char hex[] = "0123456789abcdef";
    if (buf_grow(b, n + 2) < 0) return -1;
    b->p[b->n++] = '"';
    Py_ssize_t start = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* (a word at a time where nothing in it needs escaping: the loop below sees every byte otherwise) */
        while (i + 8 <= n && !esc8(s + i)) i += 8;
        if (i >= n) break;
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

int put_str(Buf *b, PyObject *u) {
    Py_ssize_t n;
    if (PyUnicode_IS_COMPACT_ASCII(u)) /* (ASCII: its characters are its UTF-8 bytes, no conversion) */
        return put_escaped(b, (const char *)PyUnicode_DATA(u), PyUnicode_GET_LENGTH(u));
    const char *s = PyUnicode_AsUTF8AndSize(u, &n);
    if (!s) return -1;
    return put_escaped(b, s, n);
}

/* a dict key k (a str) as JSON text, from e->keys where it was written before (exact str only: a subclass'
   instance is escaped every time, and never held) */
int put_key(Buf *b, PyObject *k, Enc *e) {
    KeyCache *kc = e->keys;
    if (!kc || !PyUnicode_CheckExact(k)) return put_str(b, k);
    KcSlot *s = &kc->slot[((uintptr_t)k >> 4) % KC_SLOTS];
    if (s->key == k) return buf_put(b, s->txt, s->n);
    Py_ssize_t at = b->n;
    if (put_str(b, k) < 0) return -1;
    if (b->n - at <= KC_TXT) {
        Py_INCREF(k);
        Py_XSETREF(s->key, k); /* (the one it replaces: an exact str, its release runs no code) */
        s->n = b->n - at;
        memcpy(s->txt, b->p + at, (size_t)s->n);
    }
    return 0;
}

void key_cache_clear(KeyCache *kc) {
    for (int i = 0; i < KC_SLOTS; i++) Py_CLEAR(kc->slot[i].key);
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
int put_int(Buf *b, PyObject *o) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (!overflow) {  /* (not snprintf: its format parsing cost more than the digits) */
        char tmp[32], *p = tmp;
        unsigned long long u = (unsigned long long)v;
        if (v < 0) {
            *p++ = '-';
            u = 0ULL - u; /* (LLONG_MIN too) */
        }
        p = fmt_uint(p, u, 1);
        return buf_put(b, tmp, p - tmp);
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
/* v < 100 in two digits, from a table: the fields of a date and a time (a year is 1..9999, the rest fit) */
static const char two_digits[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";
static inline char *put2(char *p, unsigned v) {
    memcpy(p, two_digits + 2 * v, 2);
    return p + 2;
}

/* YYYY-MM-DD (the year 1..9999 of a date: four digits, as fmt_uint(year, 4) writes it) */
static inline char *put_ymd(char *p, PyObject *o) {
    unsigned y = (unsigned)PyDateTime_GET_YEAR(o);
    p = put2(put2(p, y / 100), y % 100);
    *p++ = '-';
    p = put2(p, (unsigned)PyDateTime_GET_MONTH(o));
    *p++ = '-';
    return put2(p, (unsigned)PyDateTime_GET_DAY(o));
}

int put_temporal(Buf *b, PyObject *o, char q) {
    char tmp[96];
    char *p = tmp;
    if (PyDateTime_CheckExact(o)) {
        unsigned us = (unsigned)PyDateTime_DATE_GET_MICROSECOND(o);
        *p++ = q;
        p = put_ymd(p, o);
        *p++ = ' ';
        p = put2(p, (unsigned)PyDateTime_DATE_GET_HOUR(o));
        *p++ = ':';
        p = put2(p, (unsigned)PyDateTime_DATE_GET_MINUTE(o));
        *p++ = ':';
        p = put2(p, (unsigned)PyDateTime_DATE_GET_SECOND(o));
        if (us) {
            *p++ = '.';
            p = put2(put2(put2(p, us / 10000), us / 100 % 100), us % 100);
        }
        *p++ = q;
    } else if (PyDate_CheckExact(o)) {
        *p++ = q;
        p = put_ymd(p, o);
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

/* key: o is the value of column `key` of a row image (listed in e->b64 if base64-encoded);
   row: o is a row image */
int put_obj(Buf *b, PyObject *o, Enc *e, PyObject *key, int depth, int row);

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

int put_obj(Buf *b, PyObject *o, Enc *e, PyObject *key, int depth, int row) {
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
            if (rc == 0 && ((!first && buf_put(b, e->isep, e->isep_n) < 0) || put_key(b, k, e) < 0
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
        char t[DEC_TEXT_CAP];
        Py_ssize_t tn = dec_chars(o, DEC_JSON, t, sizeof(t)); /* (the same text without str(): decimal.c) */
        if (tn > 0) return put_escaped(b, t, tn);
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

PyObject *json_dumps(PyObject *self, PyObject *args) {
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
int put_b64_keys(Buf *b, PyObject *b64, Enc *e, const char *sep, Py_ssize_t sep_n) {
    if (PySet_GET_SIZE(b64) == 0) return 0;
    PyObject *keys = PySequence_List(b64);
    if (!keys) return -1;
    int bad = PyList_Sort(keys) < 0 || buf_put(b, sep, sep_n) < 0 || put_obj(b, keys, e, NULL, 0, 0) < 0;
    Py_DECREF(keys);
    return bad || PySet_Clear(b64) < 0 ? -1 : 0;
}

/* A row change's schema, op, before and after (new references), as the senders' batch renderers read them. */
int change_fields(PyObject *ch, PyObject **schema, PyObject **op, PyObject **before, PyObject **after) {
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
PyObject *schema_piece(PyObject *cache, PyObject *schema, PyObject *piece, int (*valid)(PyObject *)) {
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
/* bytes per line of json_lines' last call (the next call's buffer is sized by it; the GIL guards it) */
static Py_ssize_t lines_row_bytes = 256;
#define LINES_SIZED_MAX ((Py_ssize_t)64 << 20) /* a bigger estimate grows as it goes instead */

PyObject *json_lines(PyObject *self, PyObject *args) {
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
    KeyCache kc; /* (the column names' texts for this call: the rows' names are the same str objects) */
    memset(&kc, 0, sizeof kc);
    Enc e = {fallback, b64, ", ", ": ", 2, 2, NULL, &kc};
    const char *pre = PyBytes_AS_STRING(prefix);
    Py_ssize_t pre_n = PyBytes_GET_SIZE(prefix);
    char num[64];
    if (!cache || !b64) goto done;
    /* the buffer starts as big as the last call's lines were per row: no growing (copying) on the way */
    Py_ssize_t rows = PySequence_Fast_GET_SIZE(seq);
    if (rows > 0 && rows <= LINES_SIZED_MAX / lines_row_bytes && buf_grow(&b, rows * lines_row_bytes) < 0) goto done;
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
    if (rows > 0) lines_row_bytes = b.n / rows + 32 > 64 ? b.n / rows + 32 : 64;
done:
    key_cache_clear(&kc);
    PyMem_Free(b.p);
    Py_XDECREF(cache);
    Py_XDECREF(b64);
    Py_DECREF(seq);
    return out;
}
