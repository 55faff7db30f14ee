"""DuckDB over an object-store data root: reads through fsspec (or httpfs), database files kept whole."""

import duckdb
import pyarrow as pa
import pytest

from speechdata.io.duckdb_object_store import database_on_root, enable_data_root_reads, s3_secret_sql
from speechdata.io.storage import TEMP_PREFIX, DataRoot


@pytest.fixture
def bucket_root(s3_bucket) -> DataRoot:
    return DataRoot(f"{s3_bucket}/prefix")


def test_a_connection_reads_parquet_globs_in_the_bucket(bucket_root):
    for shard, values in (("a", [1, 2]), ("b", [3])):
        bucket_root.write_parquet(f"manifests/shard={shard}/part-0.parquet", pa.table({"x": values}))
    with duckdb.connect() as connection:
        how = enable_data_root_reads(connection, bucket_root)
        [(rows, total)] = connection.execute(
            "SELECT count(*), sum(x) FROM read_parquet(?, hive_partitioning = false)",
            [bucket_root.uri("manifests/*/part-0.parquet")],
        ).fetchall()
    # This environment has no httpfs binary for this DuckDB: the data root's own s3fs serves the reads.
    assert how in ("httpfs", "fsspec") and (rows, total) == (3, 6)


def test_a_local_root_needs_nothing(tmp_path):
    with duckdb.connect() as connection:
        assert enable_data_root_reads(connection, DataRoot(str(tmp_path))) == "local"


def test_a_database_on_the_bucket_is_replaced_whole_and_only_on_success(bucket_root):
    with database_on_root(bucket_root, "state/db.duckdb") as local, duckdb.connect(local) as connection:
        connection.execute("CREATE TABLE t AS SELECT 1 AS v")
    with pytest.raises(RuntimeError), database_on_root(bucket_root, "state/db.duckdb") as local:
        with duckdb.connect(local) as connection:
            connection.execute("INSERT INTO t VALUES (2)")
        raise RuntimeError("the run fails after changing its copy")
    with (
        database_on_root(bucket_root, "state/db.duckdb", read_only=True) as local,
        duckdb.connect(local, read_only=True) as connection,
    ):
        assert connection.execute("SELECT v FROM t").fetchall() == [(1,)]
    assert [p.rsplit("/", 1)[1] for p in bucket_root.fs.ls(bucket_root.path("state"), detail=False)] == ["db.duckdb"]
    assert not [p for p in bucket_root.fs.find(bucket_root.root) if TEMP_PREFIX in p]


def test_the_httpfs_secret_comes_from_the_standard_aws_variables():
    sql = s3_secret_sql(
        {
            "AWS_ACCESS_KEY_ID": "AKIA",
            "AWS_SECRET_ACCESS_KEY": "it's",
            "AWS_REGION": "eu-west-1",
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        }
    )
    assert sql.startswith("CREATE OR REPLACE SECRET speechdata_data_root (TYPE s3, ")
    for part in (
        "KEY_ID 'AKIA'",
        "SECRET 'it''s'",
        "REGION 'eu-west-1'",
        "ENDPOINT '127.0.0.1:9000'",
        "URL_STYLE 'path'",
        "USE_SSL false",
    ):
        assert part in sql
    # A pod with an IAM role (IRSA) has no keys in its environment: the AWS credential chain answers.
    chain = s3_secret_sql({"AWS_DEFAULT_REGION": "us-east-1"})
    assert "PROVIDER credential_chain" in chain and "KEY_ID" not in chain and "ENDPOINT" not in chain
    assert "USE_SSL true" in s3_secret_sql({"AWS_ENDPOINT_URL_S3": "https://minio.internal"})
