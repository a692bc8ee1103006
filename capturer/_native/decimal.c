/*
 * decimal.c (capturer._fastrows): a decimal.Decimal's text read from the object itself, without str().
 * Python-visible: dec_text, dec_parse (for the tests), dec_fast.
 *
 * Every sender writes the text of each DECIMAL value (the file's and Kafka's JSON, the MySQL sender's SQL
 * literals, the wire format, the lake's unscaled integers), and str() made a str object each time, through
 * libmpdec's formatter. Here the digits are read from the C Decimal's own number (CPython's _decimal:
 * PyDecObject holds an mpd_t, its coefficient in base-10**19 words, least significant first) and written
 * straight into the caller's buffer, as str() or format(d, "f") writes them.
 *
 * The layout is CPython's, not a public API: dec_setup (module init) checks the type's size and then
 * compares this writer with str() and format() on values that take every branch; any difference (another
 * Python, _pydecimal, a changed layout) turns it off, and every caller then goes the str() way, as before.
 * Only the exact type, finite values and texts that fit the caller's buffer are written here; NaN, Infinity,
 * subclasses and anything else answer 0 (the caller's former path).
 *
 * The other way, dec_from_text makes the Decimal of a plain text ("-123.4500": what the MySQL rows decoder
 * prints of a binary DECIMAL, PostgreSQL's numeric text, the wire format's) by filling a new object as
 * _decimal's own constructor does (PyDecType_New: the coefficient in the object's four inline words), instead
 * of Decimal(str), which converts the text again and parses it. Only on CPython 3.11 and older (the
 * allocation this mirrors is 3.11's PyDecType_New; 3.13 made the type a heap type tracked by the collector,
 * and 3.12 is not checked here, so it is off from 3.12 on), only where the same check at import passed for
 * it too (values compared with Decimal(text): str, ==, hash, as_tuple, arithmetic in a private context), and
 * only for up to 76 significant digits; anything else is Decimal(text) as before.
 *
 * The checks never fail the import: an error in them (other than running out of memory) turns the fast
 * paths off. str() follows the thread's context (capitals = 0 writes "e"); the capturer never changes it,
 * and a context that differs at import turns the texts off.
 */
#include "fastrows.h"

#define DEC_RDIGITS 19 /* MPD_RDIGITS of a 64-bit build */
#define DEC_SPECIAL 14 /* MPD_INF | MPD_NAN | MPD_SNAN */
#define DEC_NEG 1
#define DEC_STATIC 16      /* MPD_STATIC: the mpd_t is not malloc'd (it is in the object) */
#define DEC_STATIC_DATA 32 /* MPD_STATIC_DATA: nor are its words, until libmpdec grows them */

typedef struct {
    uint8_t flags;
    Py_ssize_t exp, digits, len, alloc;
    uint64_t *data;
} DecNum; /* mpd_t */

typedef struct {
    PyObject_HEAD
    Py_hash_t hash;
    DecNum dec;
    uint64_t data[4]; /* _Py_DEC_MINALLOC */
} DecObj; /* PyDecObject */

static int dec_ok = 0, dec_new_ok = 0;

/* the text of o as str(o) (DEC_STR), format(o, "f") (DEC_PLAIN) or the JSON writer's rule (DEC_JSON: plain
   unless str() has an exponent beyond +/-20000) into out (cap bytes); its length, 0 when not written here */
Py_ssize_t dec_chars(PyObject *o, int mode, char *out, Py_ssize_t cap) {
    if (!dec_ok || Py_TYPE(o) != (PyTypeObject *)Decimal) return 0;
    const DecNum *d = &((DecObj *)o)->dec;
    if (d->flags & DEC_SPECIAL) return 0;
    Py_ssize_t len = d->len, digits = d->digits, exp = d->exp;
    if (len < 1 || digits < 1 || digits > len * DEC_RDIGITS || !d->data) return 0;
    char c[DEC_RDIGITS * 2 + 512];
    if (len > (Py_ssize_t)(sizeof(c) / DEC_RDIGITS)) return 0; /* (every word fits, whatever digits says) */
    char *p = fmt_uint(c, d->data[len - 1], 0);
    for (Py_ssize_t i = len - 2; i >= 0; i--) p = fmt_uint(p, d->data[i], DEC_RDIGITS);
    if (p - c != digits) return 0; /* (never, for a number libmpdec made) */
    Py_ssize_t adj = exp + digits - 1;
    int sci = !(exp <= 0 && adj >= -6); /* str()'s rule (to-scientific-string) */
    if (mode == DEC_PLAIN || (mode == DEC_JSON && adj >= -20000 && adj <= 20000)) sci = 0;
    int zero = digits == 1 && c[0] == '0';
    Py_ssize_t need = sci ? digits + 26 : exp >= 0 ? (zero ? 2 : 2 + digits + exp) : digits + exp > 0 ? 3 + digits
                                                                                    : 3 - (digits + exp) + digits;
    if (need > cap) return 0; /* (the caller's str() path then) */
    char *q = out;
    if (d->flags & DEC_NEG) *q++ = '-';
    if (sci) {
        *q++ = c[0];
        if (digits > 1) {
            *q++ = '.';
            memcpy(q, c + 1, digits - 1);
            q += digits - 1;
        }
        *q++ = 'E';
        *q++ = adj < 0 ? '-' : '+';
        q = fmt_uint(q, (unsigned long long)(adj < 0 ? -adj : adj), 0);
    } else if (exp >= 0) {
        if (zero) {
            *q++ = '0'; /* format(Decimal("0E+2"), "f") is "0" */
        } else {
            memcpy(q, c, digits);
            q += digits;
            memset(q, '0', exp);
            q += exp;
        }
    } else {
        Py_ssize_t ld = digits + exp; /* digits before the point */
        if (ld > 0) {
            memcpy(q, c, ld);
            q += ld;
            *q++ = '.';
            memcpy(q, c + ld, -exp);
            q += -exp;
        } else {
            *q++ = '0';
            *q++ = '.';
            memset(q, '0', -ld);
            q += -ld;
            memcpy(q, c, digits);
            q += digits;
        }
    }
    return q - out;
}

/* the Decimal of a plain text: [-]digits[.digits] (at least one digit, at most 76 significant ones, no
   exponent, no sign "+", no spaces or underscores), as Decimal(text) makes it; NULL without an error when the
   text is not of that form or this is off (the caller makes Decimal(text)), NULL with one when out of memory */
PyObject *dec_from_text(const char *s, Py_ssize_t n) {
#if PY_VERSION_HEX >= 0x030C0000
    (void)s;
    (void)n;
    return NULL;
#else
    if (!dec_new_ok || n > 200) return NULL;
    const char *p = s, *e = s + n;
    int neg = 0, dot = 0, any = 0, nd = 0;
    Py_ssize_t frac = 0;
    char dig[4 * DEC_RDIGITS];
    if (p < e && *p == '-') {
        neg = 1;
        p++;
    }
    for (; p < e; p++) {
        char c = *p;
        if (c >= '0' && c <= '9') {
            any = 1;
            if (dot) frac++;
            if (nd == 0 && c == '0') continue; /* (leading zeros are not in the coefficient) */
            if (nd == (int)sizeof(dig)) return NULL;
            dig[nd++] = c;
        } else if (c == '.' && !dot) {
            dot = 1;
        } else {
            return NULL;
        }
    }
    if (!any) return NULL;
    DecObj *d = PyObject_New(DecObj, (PyTypeObject *)Decimal);
    if (!d) return NULL;
    d->hash = -1;
    d->dec.flags = DEC_STATIC | DEC_STATIC_DATA | (neg ? DEC_NEG : 0);
    d->dec.exp = -frac;
    d->dec.alloc = 4;
    d->dec.data = d->data;
    if (nd == 0) { /* zero: one word, one digit */
        d->data[0] = 0;
        d->dec.len = 1;
        d->dec.digits = 1;
    } else {
        Py_ssize_t len = (nd + DEC_RDIGITS - 1) / DEC_RDIGITS;
        int end = nd;
        for (Py_ssize_t w = 0; w < len; w++) { /* least significant word first */
            int start = end > DEC_RDIGITS ? end - DEC_RDIGITS : 0;
            uint64_t v = 0;
            for (int i = start; i < end; i++) v = v * 10 + (uint64_t)(dig[i] - '0');
            d->data[w] = v;
            end = start;
        }
        d->dec.len = len;
        d->dec.digits = nd;
    }
    return (PyObject *)d;
#endif
}

/* the self-test of dec_from_text: each text's Decimal the same as Decimal(text) made (arithmetic in a context
   of its own, which traps nothing: the importer's may); 1 = all, 0 = a difference, -1 = an error */
static int dec_parse_agrees(void) {
    static const char *texts[] = {
        "0", "-0", "0.00", "-0.000", "1", "-1", "123.", ".5", "-.5", "00012.3400", "123456789012345678.9",
        "1234567890123456789", "12345678901234567890", "-99999999999999999999999999999999999999.999999999",
        "1234567890123456789012345678901234567890123456789012345678901234567890123456",
        "0.0000000000000000000000000000000000000000000000000000000000000000000000000000000001", NULL};
    /* Context(prec=200, rounding=None, Emin, Emax, capitals=1, clamp=0, flags=[], traps=[]) */
    PyObject *mod = PyImport_ImportModule("decimal"), *ctx = NULL, *none1 = PyList_New(0), *none2 = PyList_New(0);
    if (mod && none1 && none2)
        ctx = PyObject_CallMethod(mod, "Context", "(iOnniiOO)", 200, Py_None, (Py_ssize_t)-999999,
                                  (Py_ssize_t)999999, 1, 0, none1, none2);
    Py_XDECREF(mod);
    Py_XDECREF(none1);
    Py_XDECREF(none2);
    if (!ctx) return -1;
    int ok = 1;
    for (int i = 0; ok == 1 && texts[i]; i++) {
        PyObject *mine = dec_from_text(texts[i], (Py_ssize_t)strlen(texts[i]));
        if (!mine) {
            ok = PyErr_Occurred() ? -1 : 0;
            break;
        }
        PyObject *ref = PyObject_CallFunction(Decimal, "s", texts[i]);
        PyObject *s1 = ref ? PyObject_Str(mine) : NULL, *s2 = s1 ? PyObject_Str(ref) : NULL;
        PyObject *t1 = s2 ? PyObject_CallMethod(mine, "as_tuple", NULL) : NULL;
        PyObject *t2 = t1 ? PyObject_CallMethod(ref, "as_tuple", NULL) : NULL;
        PyObject *a1 = t2 ? PyObject_CallMethod(ctx, "add", "OO", mine, mine) : NULL;
        PyObject *a2 = a1 ? PyObject_CallMethod(ctx, "add", "OO", ref, ref) : NULL;
        if (!a2) {
            ok = -1;
        } else {
            Py_hash_t h1 = PyObject_Hash(mine), h2 = h1 == -1 ? -1 : PyObject_Hash(ref);
            int eq = h2 == -1 ? -1 : PyObject_RichCompareBool(mine, ref, Py_EQ);
            int se = eq < 0 ? -1 : PyObject_RichCompareBool(s1, s2, Py_EQ);
            int te = se < 0 ? -1 : PyObject_RichCompareBool(t1, t2, Py_EQ);
            int ae = te < 0 ? -1 : PyObject_RichCompareBool(a1, a2, Py_EQ);
            if (ae < 0) ok = -1;
            else if (h1 != h2 || !eq || !se || !te || !ae) ok = 0;
        }
        Py_XDECREF(a2);
        Py_XDECREF(a1);
        Py_XDECREF(t2);
        Py_XDECREF(t1);
        Py_XDECREF(s2);
        Py_XDECREF(s1);
        Py_XDECREF(ref);
        Py_DECREF(mine);
    }
    Py_DECREF(ctx);
    return ok;
}

/* the self-test: dec_chars against str() and format(d, "f"), 1 = equal everywhere */
static int dec_agrees(void) {
    static const char *vals[] = {
        "0", "-0", "1", "-1", "123.45", "-123.45", "0.001", "0.000001", "0.0000001", "1E-7", "1E+2", "0E+2",
        "-0E+3", "0E-5", "-0.00", "123E-10", "1.5E+3", "-1E-20", "9999999999999999999", "10000000000000000000",
        "12345678901234567890123", "-98765432109876543210987654321098765432109876543210.0123456789012345678901",
        "99999999999999999999999999999999999999999999999999999999999999999999999999999999999.5", "1E+25000",
        "-3E-25000", "1.00000000000000000000000000001E+60", "4.2E-30001", "0.1000000000000000000", NULL};
    static const int modes[] = {DEC_STR, DEC_PLAIN, DEC_JSON};
    PyObject *f = PyUnicode_FromString("f");
    if (!f) return -1;
    int ok = 1;
    char buf[2048];
    for (int i = 0; ok == 1 && vals[i]; i++) {
        PyObject *d = PyObject_CallFunction(Decimal, "s", vals[i]);
        if (!d) { Py_DECREF(f); return -1; }
        PyObject *s = PyObject_Str(d), *pf = PyObject_Format(d, f);
        if (!s || !pf) { Py_XDECREF(s); Py_XDECREF(pf); Py_DECREF(d); Py_DECREF(f); return -1; }
        for (int m = 0; ok == 1 && m < 3; m++) {
            PyObject *want = modes[m] == DEC_PLAIN ? pf : s;
            if (modes[m] == DEC_JSON) {
                const char *t = PyUnicode_AsUTF8(s), *ex = t ? strpbrk(t, "E") : NULL;
                long e10 = ex ? strtol(ex + 1, NULL, 10) : 0;
                if (ex && e10 >= -20000 && e10 <= 20000) want = pf;
            }
            Py_ssize_t n = dec_chars(d, modes[m], buf, sizeof(buf)), wn;
            const char *w = PyUnicode_AsUTF8AndSize(want, &wn);
            if (!w) { ok = -1; break; }
            if (n == 0) { /* not written here: only a text longer than the buffer may be that */
                if (wn < (Py_ssize_t)sizeof(buf) - 600) ok = 0;
            } else if (n != wn || memcmp(buf, w, n) != 0) {
                ok = 0;
            }
        }
        Py_DECREF(s);
        Py_DECREF(pf);
        Py_DECREF(d);
    }
    Py_DECREF(f);
    return ok;
}

/* the checks' error: out of memory fails the import, anything else (a context that traps, a changed type)
   turns the fast paths off; 0 or -1 */
static int dec_check_failed(void) {
    dec_ok = dec_new_ok = 0;
    if (PyErr_ExceptionMatches(PyExc_MemoryError)) return -1;
    PyErr_Clear();
    return 0;
}

int dec_setup(void) {
    dec_ok = dec_new_ok = 0;
    if (!Decimal || !PyType_Check(Decimal) || ((PyTypeObject *)Decimal)->tp_basicsize != (Py_ssize_t)sizeof(DecObj))
        return 0;
    dec_ok = 1;
    int rc = dec_agrees();
    if (rc < 0) return dec_check_failed();
    dec_ok = rc == 1;
    PyTypeObject *t = (PyTypeObject *)Decimal;
    /* making objects too: only the static, untracked type of 3.11 and older whose texts were right */
    dec_new_ok = dec_ok && PY_VERSION_HEX < 0x030C0000 && !(t->tp_flags & (Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HEAPTYPE));
    if (!dec_new_ok) return 0;
    rc = dec_parse_agrees();
    if (rc < 0) return dec_check_failed();
    dec_new_ok = rc == 1;
    return 0;
}

/* dec_text(d, mode) -> str or None: dec_chars' text (mode 0 str(), 1 format "f", 2 the JSON rule) */
PyObject *dec_text(PyObject *self, PyObject *args) {
    PyObject *o;
    int mode;
    if (!PyArg_ParseTuple(args, "Oi", &o, &mode)) return NULL;
    if (mode < DEC_STR || mode > DEC_JSON) {
        PyErr_SetString(PyExc_ValueError, "mode is 0, 1 or 2");
        return NULL;
    }
    char buf[DEC_TEXT_CAP];
    Py_ssize_t n = dec_chars(o, mode, buf, sizeof(buf));
    if (n <= 0) Py_RETURN_NONE;
    return PyUnicode_DecodeASCII(buf, n, NULL);
}

/* dec_parse(text) -> Decimal or None: dec_from_text's Decimal of text (str), None where the callers make
   Decimal(text) */
PyObject *dec_parse(PyObject *self, PyObject *arg) {
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(arg, &n);
    if (!s) return NULL;
    PyObject *d = dec_from_text(s, n);
    if (d || PyErr_Occurred()) return d;
    Py_RETURN_NONE;
}

/* dec_fast() -> (bool, bool): whether dec_setup's checks passed (texts written here, Decimals made here) */
PyObject *dec_fast(PyObject *self, PyObject *unused) {
    return Py_BuildValue("(OO)", dec_ok ? Py_True : Py_False, dec_new_ok ? Py_True : Py_False);
}
