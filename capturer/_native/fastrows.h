/*
 * fastrows.h: what the files of the C extension capturer._fastrows share (internal; no Python-visible
 * name is declared here that module.c does not register).
 *
 * The extension is one module built from the files of this folder, one concern each (setup.py lists them):
 *   module.c         the module init and its method table (every Python-visible name, in one place)
 *   mysql_rows.c     MySQL/MariaDB binlog rows events -> row images (the Plan type)
 *   baikaldb_rows.c  BaikalDB binlog rows (protobuf messages) -> row images (baikal_plan)
 *   pg_images.c      PostgreSQL pgoutput TupleData -> row images (pg_plan)
 *   json.c           JSON text of row values and of the file sender's lines (json_dumps, json_lines)
 *   sql.c            SQL literals as pymysql writes them (sql_literals, sql_tuples)
 *   kafka.c          the Kafka sender's json messages, its partitioner hash and its produce loop (kafka_json,
 *                    murmur2, kafka_produce_each)
 *   unjson.c         those json messages read back for the applier (kafka_unjson, kafka_unrow, kafka_untype,
 *                    kafka_msgs: the consumer's messages as the applier's Msg objects)
 *   wire.c           the wire format's rows and values written as msgpack (wire_rows, wire_pack, wire_setup)
 *   wire_read.c      ... read back (wire_unrows, wire_ext, wire_unpack, wire_unpack_item), and RowChange
 *                    objects made in C for the regions (row_changes, row_change)
 *   causality.c      the MySQL sender's conflict keys and placing (conflict_keys, causality_place, stable_hash,
 *                    place_txns, manifest_txns)
 *   snaprows.c       a snapshot chunk's rows: tuples -> dicts -> RowChanges (dict_rows, read_changes)
 *   arrowcols.c      the Spark sender's rows and Arrow column buffers of a batch (lake_rows, arrow_columns)
 *   decimal.c        a Decimal's text read from the object, without str(), and Decimals made from plain texts
 *                    (dec_chars, dec_from_text; dec_text, dec_parse, dec_fast)
 *
 * <datetime.h> gives every file that includes it its own (static) PyDateTimeAPI: a file that uses the
 * datetime C API includes it, defines its import function with FR_DATETIME_IMPORT, and module.c's init
 * calls it (a file that forgot would crash on its first datetime).
 */
#ifndef CAPTURER_FASTROWS_H
#define CAPTURER_FASTROWS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FR_DATETIME_IMPORT(name) \
    int name(void) { PyDateTime_IMPORT; return PyDateTimeAPI ? 0 : -1; }

/* decimal.Decimal and datetime(1970, 1, 1) (module.c sets them at init) */
extern PyObject *Decimal;
extern PyObject *Epoch;

/* little-endian unsigned over n bytes (MySQL and BaikalDB rows) */
static inline uint64_t le_unsigned(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* a growing output buffer (JSON, SQL, Kafka messages, msgpack); PyMem memory, the caller frees b.p */
typedef struct {
    char *p;
    Py_ssize_t n, cap;
} Buf;

static inline int buf_grow(Buf *b, Py_ssize_t more) {
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
    if (n) memcpy(b->p + b->n, s, n); /* (n == 0: b->p may still be NULL, which memcpy must not get) */
    b->n += n;
    return 0;
}

/* n in decimal, zero-padded to width, written at p; returns the end */
static inline char *fmt_uint(char *p, unsigned long long n, int width) {
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

/* json.c: the JSON writer, also used by sql.c and kafka.c */
/* dict keys (str) already written by one call, with their JSON text ("name", quoted and escaped): a row's
   column names are the same str objects row after row. A slot holds a reference to its key (so its address
   is not reused while the text is kept); key_cache_clear drops them. Zeroed before use. */
#define KC_SLOTS 64
#define KC_TXT 46
typedef struct {
    PyObject *key;
    Py_ssize_t n;
    char txt[KC_TXT];
} KcSlot;
typedef struct {
    KcSlot slot[KC_SLOTS];
} KeyCache;
void key_cache_clear(KeyCache *kc);
typedef struct {
    PyObject *fallback;  /* v -> a JSON-able value (capturer.model.encode.json_value(v)[0]) */
    PyObject *b64;       /* set: columns whose value was base64-encoded, or NULL */
    const char *isep, *ksep;
    int isep_n, ksep_n;
    PyObject *rows;      /* tuple: the top-level keys whose dict values are row images, or NULL */
    KeyCache *keys;      /* the dict keys' texts, or NULL (each key escaped every time) */
} Enc;
int put_key(Buf *b, PyObject *k, Enc *e);
int put_str(Buf *b, PyObject *u);
int put_int(Buf *b, PyObject *o);
int put_temporal(Buf *b, PyObject *o, char q);
int put_obj(Buf *b, PyObject *o, Enc *e, PyObject *key, int depth, int row);
int put_b64_keys(Buf *b, PyObject *b64, Enc *e, const char *sep, Py_ssize_t sep_n);
int change_fields(PyObject *ch, PyObject **schema, PyObject **op, PyObject **before, PyObject **after);
PyObject *schema_piece(PyObject *cache, PyObject *schema, PyObject *piece, int (*valid)(PyObject *));

/* decimal.c: a Decimal's text as str() (DEC_STR), format(d, "f") (DEC_PLAIN) or the JSON writer's rule
   (DEC_JSON: plain unless str() has an exponent beyond +/-20000) into out; its length, or 0 when it is not
   written there (not the exact C Decimal, NaN/Infinity, longer than cap, the check at init failed) */
enum { DEC_STR = 0, DEC_PLAIN = 1, DEC_JSON = 2 };
#define DEC_TEXT_CAP 160
Py_ssize_t dec_chars(PyObject *o, int mode, char *out, Py_ssize_t cap);
/* ... and the Decimal of a plain text [-]digits[.digits], made as Decimal(text) makes it; NULL without an
   error where the caller makes Decimal(text) itself (another form, over 76 digits, off) */
PyObject *dec_from_text(const char *s, Py_ssize_t n);
int dec_setup(void);

/* wire.c: the interned change field names (module.c sets them at init); the Python ext hook (wire_setup) */
extern PyObject *S_schema, *S_op, *S_before, *S_after;
extern PyObject *WireSlowHook;

/* the types (module.c readies them) */
extern PyTypeObject PlanType, BPlanType, PgPlanType;

/* the datetime C API of each file that uses it */
int fr_mysql_rows_datetime(void);
int fr_baikaldb_rows_datetime(void);
int fr_pg_images_datetime(void);
int fr_json_datetime(void);
int fr_wire_datetime(void);
int fr_wire_read_datetime(void);
int fr_arrowcols_datetime(void);
int fr_causality_datetime(void);

/* the module's functions (module.c's method table) */
PyObject *baikal_plan(PyObject *mod, PyObject *args);
PyObject *pg_plan(PyObject *mod, PyObject *args);
PyObject *json_dumps(PyObject *self, PyObject *args);
PyObject *dec_text(PyObject *self, PyObject *args);
PyObject *dec_fast(PyObject *self, PyObject *unused);
PyObject *dec_parse(PyObject *self, PyObject *arg);
PyObject *json_lines(PyObject *self, PyObject *args);
PyObject *sql_literals(PyObject *self, PyObject *args);
PyObject *sql_tuples(PyObject *self, PyObject *args);
PyObject *murmur2(PyObject *self, PyObject *arg);
PyObject *kafka_json(PyObject *self, PyObject *args);
PyObject *kafka_produce_each(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *kafka_unjson(PyObject *self, PyObject *arg);
PyObject *kafka_untype(PyObject *self, PyObject *args);
PyObject *kafka_unrow(PyObject *self, PyObject *args);
PyObject *kafka_msgs(PyObject *self, PyObject *args);
PyObject *wire_rows(PyObject *self, PyObject *args);
PyObject *wire_unrows(PyObject *self, PyObject *args);
PyObject *row_changes(PyObject *self, PyObject *args);
PyObject *row_change(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *wire_ext(PyObject *self, PyObject *args);
PyObject *wire_unpack(PyObject *self, PyObject *arg);
PyObject *wire_setup(PyObject *self, PyObject *args);
PyObject *wire_unpack_item(PyObject *self, PyObject *args);
PyObject *wire_pack(PyObject *self, PyObject *args);
PyObject *conflict_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *causality_place(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *stable_hash(PyObject *self, PyObject *key);
PyObject *place_txns(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *manifest_txns(PyObject *self, PyObject *txns);
PyObject *dict_rows(PyObject *self, PyObject *args);
PyObject *read_changes(PyObject *self, PyObject *args);
PyObject *arrow_columns(PyObject *self, PyObject *args);
PyObject *lake_rows(PyObject *self, PyObject *args);

#endif
