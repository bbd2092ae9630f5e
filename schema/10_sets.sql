-- =====================================================================
-- 10. SEVERAL LEASES AT ONCE: ALL OR NONE
-- =====================================================================

-- LATER PARTS. Used here, defined in a later part (PL/pgSQL looks a
-- name up when a function runs, not when it is created): 11: _ahead.
--
-- acquire_all takes every lease of a set, each with its own token, or none.
-- It checks every name, and whether the caller may use it (see
-- AUTHORITY), before anything is taken; checks the server's timeline as
-- acquire does, outside what a refusal undoes (so that a refused set does
-- not undo the check, nor start a grant delay again); then sorts the
-- names (byte order, COLLATE "C": the same order in every session
-- whatever its locale) and acquires them one by one with acquire, in one
-- subtransaction: the first name it cannot take rolls back the ones
-- already taken (their rows, history and notifications; the tokens drawn
-- are never issued, so the fence sequence skips them), and the answer
-- describes that name. What a refusal does not undo: stale fenced
-- sessions that a takeover of an earlier name ended stay ended (their
-- eviction is not recorded). Once every name is taken, every lease gets
-- the same expiry, a full TTL from the end of the call, so that a set
-- whose names took long to take is not answered already expired (nobody
-- else sees the rows before the commit). Sets are not session-bound.
--
-- No deadlock: acquire never queues for a row lock (see NO WAIT WITHOUT
-- BOUND), so two acquire_all calls over overlapping names, in whatever
-- order their callers list them, never wait on each other beyond
-- TAKEOVER_GRACE per name: the later one finds the first contended name
-- held, or still being taken by the other's open transaction (then, after
-- the grace, "not acquired" with a note that a transaction is open), and
-- answers for it. The canonical order makes the first contended name the
-- same for both, so one of them gets the whole set. Sets of names never
-- used before may also contend on the creators' slots (a hash of the
-- name): the later one then answers "not acquired" after 1 s.

CREATE FUNCTION pglease._max_set_names()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 100 $$;

COMMENT ON FUNCTION pglease._max_set_names() IS
    'How many names acquire_all takes at once, at most.';

-- A set's names, checked (1 to _max_set_names() distinct names, each a
-- valid name this session may use; 22023 or 42501 otherwise) and sorted
-- in byte order. ACTION names the operation in a refusal.
CREATE FUNCTION pglease._check_names(names text[], action text)
RETURNS text[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    sorted text[];
    n      text;
BEGIN
    IF array_ndims(_check_names.names) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'names',
            MESSAGE = format('pglease: names must be a list (an array of one dimension), got %s '
                             'dimensions', array_ndims(_check_names.names));
    END IF;
    IF _check_names.names IS NULL
       OR coalesce(cardinality(_check_names.names), 0) NOT BETWEEN 1 AND pglease._max_set_names() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'names',
            MESSAGE = format('pglease: names must hold 1 to %s names, got %s',
                             pglease._max_set_names(),
                             coalesce(cardinality(_check_names.names)::text, 'NULL'));
    END IF;
    IF array_position(_check_names.names, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'names',
            MESSAGE = 'pglease: names must not contain NULL';
    END IF;
    SELECT array_agg(d.n ORDER BY d.n COLLATE "C") INTO sorted
      FROM (SELECT DISTINCT u.n FROM unnest(_check_names.names) AS u(n)) AS d;
    IF cardinality(sorted) <> cardinality(_check_names.names) THEN
        SELECT u.n INTO n FROM unnest(_check_names.names) AS u(n)
         GROUP BY u.n HAVING count(*) > 1 ORDER BY u.n COLLATE "C" LIMIT 1;
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'names',
            MESSAGE = format('pglease: names must differ, %L is there twice', n);
    END IF;
    FOREACH n IN ARRAY sorted LOOP
        PERFORM pglease._check_text('name', n);
        IF NOT pglease._may_use_name(n) THEN
            PERFORM pglease._refuse_name(n, _check_names.action);
        END IF;
    END LOOP;
    RETURN sorted;
END
$$;

REVOKE ALL ON FUNCTION pglease._check_names(text[], text) FROM PUBLIC;

-- Result of acquire_all, one row per name: acquire's answer and the name.
CREATE TYPE pglease.set_acquisition AS (
    name           text,
    token          bigint,
    expires_at     timestamptz,
    holder         text,
    checked_at     timestamptz,
    note           text,
    holder_session integer,
    delayed_until  timestamptz,
    ahead          integer,
    -- As acquire's: the name is served first come, first served, and the
    -- set, refused on it, should join the lines of its names.
    fair           boolean
);

CREATE FUNCTION pglease.acquire_all(names text[], holder text, ttl interval,
                                    ticket bigint DEFAULT NULL)
RETURNS SETOF pglease.set_acquisition
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    sorted  text[];
    got     pglease.acquisition;
    taken   pglease.acquisition[] := '{}';
    missing text;
    expiry  timestamptz;
BEGIN
    -- Every name, and whether the caller may use it, before anything is
    -- taken (acquire checks the holder and the TTL on the first name).
    sorted := pglease._check_names(acquire_all.names, 'acquire');
    -- The server's timeline, checked where a refusal does not undo it.
    IF NOT pg_is_in_recovery() AND NOT EXISTS (SELECT 1 FROM pglease._checked) THEN
        PERFORM pglease._timeline_checked(NULL);
    END IF;
    -- The set's places in line, kept for another TTL where a refusal does
    -- not undo it (see LINES).
    IF acquire_all.ticket IS NOT NULL AND NOT pg_is_in_recovery() THEN
        FOREACH missing IN ARRAY sorted LOOP
            PERFORM pglease._ahead(missing, acquire_all.ticket, acquire_all.ttl);
        END LOOP;
    END IF;
    BEGIN
        FOREACH missing IN ARRAY sorted LOOP
            got := pglease.acquire(missing, acquire_all.holder, acquire_all.ttl, false,
                                   acquire_all.ticket);
            IF got.token IS NULL THEN
                -- Undo the ones taken: the handler below rolls this
                -- subtransaction back.
                RAISE EXCEPTION USING ERRCODE = 'LE099';
            END IF;
            taken := taken || got;
        END LOOP;
        -- One expiry for the set, a full TTL from now (see above).
        expiry := clock_timestamp()
                  + make_interval(secs => extract(epoch FROM acquire_all.ttl)::double precision);
        UPDATE pglease.leases AS l SET expires_at = expiry WHERE l.name = ANY (sorted);
    EXCEPTION WHEN SQLSTATE 'LE099' THEN
        -- missing and got describe the name that could not be taken.
        RETURN NEXT ROW(missing, NULL, got.expires_at, got.holder, got.checked_at, got.note,
                        got.holder_session, got.delayed_until, got.ahead,
                        got.fair)::pglease.set_acquisition;
        RETURN;
    END;
    RETURN QUERY SELECT sorted[i], taken[i].token, l.expires_at, taken[i].holder,
                        taken[i].checked_at, taken[i].note, taken[i].holder_session,
                        taken[i].delayed_until, taken[i].ahead, taken[i].fair
                   FROM generate_subscripts(sorted, 1) AS i
                   JOIN pglease.leases AS l ON l.name = sorted[i]
                  ORDER BY i;
END
$$;

COMMENT ON FUNCTION pglease.acquire_all(text[], text, interval, bigint) IS
    'Acquire every lease of NAMES (1 to 100 distinct names) for HOLDER for TTL, each with '
    'its own token and the same expiry, or none; 42501 before anything if the caller may '
    'not use one of the names. The names are taken in byte order (COLLATE "C"), each as '
    'acquire would; the first that cannot be taken undoes the others. Returns one row per '
    'name in that order (name, token, expires_at, '
    'holder, checked_at, note, holder_session, delayed_until) when all were acquired; '
    'otherwise one row, token NULL, describing the first name that could not be taken. '
    'TICKET: the set''s place in line (see enqueue), kept for another TTL on every name. '
    'Renew the set with renew_many and release it in one transaction.';
