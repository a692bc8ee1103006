from setuptools import Extension, find_packages, setup

# The C row decoder is optional: where it cannot be built (no compiler or
# Python headers) the install still succeeds and the Python decoder is used.
# One module built from capturer/_native/, one C file per concern (capturer/_native/fastrows.h lists them).
NATIVE = ["module", "mysql_rows", "baikaldb_rows", "pg_images", "json", "sql", "kafka", "unjson", "wire", "wire_read", "causality", "snaprows", "arrowcols", "decimal"]
FASTROWS = Extension("capturer._fastrows", [f"capturer/_native/{n}.c" for n in NATIVE], optional=True,
                     depends=["capturer/_native/fastrows.h"],
                     # the files' shared names stay inside the module (only PyInit__fastrows is exported)
                     extra_compile_args=["-O2", "-fvisibility=hidden"])

# the Spark sender (a Parquet lake); its session also needs Java (sh start.sh installs one)
SPARK = ["pyspark>=4.0,<5", "pyarrow>=14", "pandas<3", "deltalake>=1,<2"]
# [spark] table_format=delta: Delta Lake 4.4.0 (senders/spark/deltajars.py, its jars resolved by Maven) runs on
# Spark 4.2 only, so this extra pins PySpark 4.2 (no Delta release supports PySpark 4.3 yet); deltalake
# (delta-rs) is the independent reader of the tests and of lake users without a JVM
DELTA = ["pyspark>=4.2,<4.3", "pyarrow>=14", "pandas<3", "deltalake>=1,<2"]

setup(
    name="binlog-capturer",
    version="0.1.0",
    description="Ordered binlog capturer with multi-sink fan-out",
    python_requires=">=3.10",
    packages=find_packages(include=["capturer", "capturer.*", "senders", "senders.*", "devtools", "devtools.*"]),
    # the status page (GET /) and its vendored chart library
    package_data={"capturer": ["ops/ui/*.html", "ops/ui/*.js", "ops/ui/*.css", "ops/ui/vendor/*", "apply/ui/*"],
                  "senders": ["spark/delta-pom.xml"]},
    install_requires=[
        "PyMySQL>=1.2,<1.3",  # senders/mysql/sender.py FastCursor overrides Cursor._mogrify (1.2.x)
        "mysql-replication==1.0.17",
        "protobuf>=4.21",
        "msgpack>=1.0",  # the rows of region agents' streams (capturer/model/wire.py)
        "grpcio>=1.60",
        "requests>=2.28",
        "prometheus_client>=0.17",
        "grpcio-tools>=1.60",  # generates proto/*.proto's code at install (and at first use in a bare checkout)
    ],
    extras_require={
        # the Kafka sender's default client (client=kafka-python) and its compression codecs
        # (orjson: the applier's fast JSON decoding; json from the standard library where it is missing;
        # crc32c: the record-batch checksum in C, without it kafka-python computes it in Python at ~7 MB/s,
        # which bounded its producer to ~8k messages/s here, ~30k with it)
        "kafka": ["kafka-python>=3.0,<4", "crc32c>=2.3", "lz4", "zstandard", "orjson>=3.9"],
        "confluent": ["confluent-kafka>=2.3", "orjson>=3.9"],
        # MariaDB Connector/Python (C, needs libmariadb-dev to build): snapshots read ~5x faster than with pymysql
        "snapshot": ["mariadb>=1.1,<2"],
        # PostgreSQL regions (type=postgresql): libpq through psycopg 3's low-level pq API
        "postgresql": ["psycopg[binary]>=3.2,<4"],
        "spark": SPARK,
        "delta": DELTA,
        # sh start.sh --demo full: the client the demo produces and consumes with, and the lake (with the
        # spark extra; start.sh adds Java, and Maven for the private Apache Kafka broker's jars)
        "demo": ["confluent-kafka>=2.3", *SPARK],
        "test": ["kafka-python>=3.0,<4", "crc32c>=2.3", "lz4", "zstandard", "orjson>=3.9", "ruff==0.17.6", "mypy>=1.10,<3", "psycopg[binary]>=3.2,<4", "pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "hypothesis>=6.100", "requests>=2.28", "confluent-kafka>=2.3",
                 "websocket-client>=1.6", "deltalake>=1,<2"],  # drives headless Chromium (DevTools protocol) in the status page test
    },
    ext_modules=[FASTROWS],
    entry_points={"console_scripts": ["capturer=capturer.__main__:main"]},
)
