"""A throwaway PostgreSQL server for the Dagster instance of the e2e test (Debian's `postgresql` binaries).

`initdb` a cluster in a temporary directory and `pg_ctl start` it on a free loopback port with trust
authentication; stopped and deleted afterwards. PostgreSQL refuses to run as root, so under root the
server runs as the `postgres` user the Debian package creates. `make test` installs the package
when no `pg_ctl` is found.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.e2e.dagster_dev import free_port

DATABASE = "dagster"
USER = "dagster"


def postgres_bin_dir() -> Path:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    found = candidates[-1] if candidates else shutil.which("pg_ctl")
    if not found:
        raise RuntimeError("no PostgreSQL server binaries (pg_ctl): `apt-get install postgresql` (make test does)")
    return Path(found).parent


class PostgresServer:
    """``with PostgresServer() as pg: pg.env`` gives the ``DAGSTER_POSTGRES_*`` variables of the
    production ``dagster.yaml`` (deploy/production/dagster.yaml)."""

    def __init__(self):
        self.bin = postgres_bin_dir()
        self.port = free_port()
        self.run_as = None if os.geteuid() != 0 else pwd.getpwnam("postgres")
        self.directory: Path | None = None

    @property
    def env(self) -> dict[str, str]:
        return {
            "DAGSTER_POSTGRES_HOST": "127.0.0.1",
            "DAGSTER_POSTGRES_PORT": str(self.port),
            "DAGSTER_POSTGRES_USER": USER,
            "DAGSTER_POSTGRES_PASSWORD": "unused-with-trust-auth",
            "DAGSTER_POSTGRES_DB": DATABASE,
        }

    @property
    def postgres_db(self) -> dict:
        """The ``postgres_db`` block of a ``dagster.yaml`` storage for this server (as
        deploy/production/dagster.yaml: dagster-postgres ships psycopg2)."""
        return {
            "hostname": "127.0.0.1",
            "port": self.port,
            "username": USER,
            "password": "unused-with-trust-auth",
            "db_name": DATABASE,
            "scheme": "postgresql+psycopg2",
        }

    def _run(self, *args: str) -> None:
        user = {"user": self.run_as.pw_uid, "group": self.run_as.pw_gid} if self.run_as else {}
        result = subprocess.run(
            [str(self.bin / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=120,
            **user,
        )
        if result.returncode != 0:
            log = self.directory / "server.log"
            raise RuntimeError(
                f"{' '.join(args[:2])} failed: {result.stderr[-2000:]}\n{log.read_text()[-2000:] if log.exists() else ''}"
            )

    def __enter__(self) -> PostgresServer:
        # Under /tmp (not pytest's 0700 tmp_path) so that the `postgres` user can reach it.
        self.directory = Path(tempfile.mkdtemp(prefix="speechdata-pg-"))
        if self.run_as:
            os.chown(self.directory, self.run_as.pw_uid, self.run_as.pw_gid)
        data = self.directory / "data"
        try:
            self._run("initdb", "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync")
            options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.directory} -c fsync=off"
            self._run("pg_ctl", "-D", str(data), "-o", options, "-l", str(self.directory / "server.log"), "-w", "start")
            self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, DATABASE)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.directory is None:
            return
        data = self.directory / "data"
        if (data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory = None
