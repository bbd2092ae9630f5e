-- Set-up for the SQL-level benchmark (BENCH_ONLY=sql): run once on a
-- database where pglease is migrated. Names 1..1000 of each kind:
--   cycle-N  free leases, for acquire + release (pglease.leases and raw_leases)
--   held-N   held for a day, for renew, failed acquires and guarded writes
-- and data rows 1..1000 for the writes. The held leases' tokens are
-- consecutive in N, so the scripts know each one's token as N + :off
-- (pglease) or N + :roff (raw); the runner checks that and passes both.
CREATE SEQUENCE raw_seq;
-- The home-made `locked_until` table: the statements a service would
-- write without pglease, unfenced.
CREATE TABLE raw_leases (name text PRIMARY KEY, holder text, token bigint NOT NULL,
                         expires_at timestamptz NOT NULL) WITH (fillfactor = 80);
INSERT INTO raw_leases SELECT 'cycle-' || g, NULL, 0, '-infinity' FROM generate_series(1, 1000) g;
INSERT INTO raw_leases SELECT 'held-' || g, 'bench', nextval('raw_seq'), now() + interval '1 day'
  FROM generate_series(1, 1000) g ORDER BY g;
-- The history a home-made lease table would keep: pglease._history's
-- columns and index.
CREATE TABLE raw_history (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text,
                          token bigint NOT NULL, event text NOT NULL, holder text,
                          at timestamptz NOT NULL, renewals integer, detail text, role name);
CREATE INDEX raw_history_name ON raw_history (name, id);
CREATE TABLE data (id int PRIMARY KEY, value bigint NOT NULL);
INSERT INTO data SELECT g, 0 FROM generate_series(1, 1000) g;
-- Each name's row exists in pglease.leases (created by a first
-- acquisition, as in a running service).
SELECT count(pglease.release(c.name, (c.a).token))
  FROM (SELECT 'cycle-' || g AS name, pglease.acquire('cycle-' || g, 'bench', interval '1 s') AS a
          FROM generate_series(1, 1000) g) AS c;
SELECT count((pglease.acquire('held-' || g, 'bench', interval '1 day')).token)
  FROM generate_series(1, 1000) g;
CHECKPOINT;
