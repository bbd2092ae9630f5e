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
-- The floor of a function-based design: each raw statement above, moved
-- unchanged into a SECURITY DEFINER PL/pgSQL function with a fixed
-- search_path, which is what lets an application role use leases without
-- being able to forge them (it calls the functions, it may not write the
-- table). pglease's functions do this and the fence's own work besides;
-- the floor_*.sql scripts call these in place of the raw statements.
CREATE SCHEMA floor;
CREATE FUNCTION floor.acquire(name text, holder text, ttl interval) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE t bigint;
BEGIN
    UPDATE public.raw_leases AS l SET holder = acquire.holder, token = nextval('public.raw_seq'),
           expires_at = clock_timestamp() + acquire.ttl
     WHERE l.name = acquire.name AND (l.holder IS NULL OR l.expires_at <= clock_timestamp())
    RETURNING l.token INTO t;
    RETURN t;
END $$;
CREATE FUNCTION floor.release(name text, token bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE public.raw_leases AS l SET holder = NULL
     WHERE l.name = release.name AND l.token = release.token AND l.holder IS NOT NULL
       AND clock_timestamp() < l.expires_at;
    RETURN FOUND;
END $$;
-- The same, recording the history rows the raw_cycle_history script does.
CREATE FUNCTION floor.acquire_history(name text, holder text, ttl interval) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE t bigint;
BEGIN
    WITH a AS (UPDATE public.raw_leases AS l SET holder = acquire_history.holder,
                      token = nextval('public.raw_seq'),
                      expires_at = clock_timestamp() + acquire_history.ttl
                WHERE l.name = acquire_history.name
                  AND (l.holder IS NULL OR l.expires_at <= clock_timestamp())
            RETURNING l.name, l.token, l.holder),
         h AS (INSERT INTO public.raw_history (name, token, event, holder, at, role)
               SELECT a.name, a.token, 'acquired', a.holder, clock_timestamp(), session_user FROM a)
    SELECT a.token INTO t FROM a;
    RETURN t;
END $$;
CREATE FUNCTION floor.release_history(name text, token bigint, notify boolean) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE n text;
BEGIN
    WITH r AS (UPDATE public.raw_leases AS l SET holder = NULL
                WHERE l.name = release_history.name AND l.token = release_history.token
                  AND l.holder IS NOT NULL AND clock_timestamp() < l.expires_at
            RETURNING l.name, l.token),
         h AS (INSERT INTO public.raw_history (name, token, event, holder, at, role)
               SELECT r.name, r.token, 'released', 'bench', clock_timestamp(), session_user FROM r)
    SELECT r.name INTO n FROM r;
    IF n IS NOT NULL AND notify THEN
        PERFORM pg_notify('raw_release', hashtext(n)::text);
    END IF;
    RETURN n IS NOT NULL;
END $$;
CREATE FUNCTION floor.renew(name text, token bigint, ttl interval) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE e timestamptz;
BEGIN
    UPDATE public.raw_leases AS l SET expires_at = clock_timestamp() + renew.ttl
     WHERE l.name = renew.name AND l.token = renew.token AND l.holder IS NOT NULL
       AND clock_timestamp() < l.expires_at
    RETURNING l.expires_at INTO e;
    RETURN e;
END $$;
-- The minimal guard: the lease row locked FOR KEY SHARE (until commit)
-- when the token is current and unexpired. Inside a function, because
-- locking a row FOR KEY SHARE needs UPDATE on its table, which an
-- application role must not have.
CREATE FUNCTION floor.guard(name text, token bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM FROM public.raw_leases AS l
      WHERE l.name = guard.name AND l.token = guard.token AND clock_timestamp() < l.expires_at
        FOR KEY SHARE;
    RETURN FOUND;
END $$;
