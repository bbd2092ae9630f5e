-- pglease schema: leases with fencing tokens, enforced by PostgreSQL.
--
-- Files: 0001_schema.sql (this one: tables, types, limits, views),
-- 0002_leases.sql (acquire, renew, renew_many, release, watch, unwatch),
-- 0003_fencing.sql (assert_held, protect, unprotect, advance). Every
-- function is defined once, in the file that names it.
--
-- VOCABULARY. A lease has a name (the resource), a holder (who), a token
-- (which acquisition: the fence) and an expires_at (until when). A lease is
-- valid at time t iff its token is the row's current token, the row has a
-- holder, and t < expires_at. Equality is expired.
--
-- CLOCK. Every decision uses the database server's clock, never a client's.
-- Every function reads clock_timestamp() (the time the statement actually
-- runs), never now(): now() is the start of the caller's transaction, and a
-- check made late in a long transaction against now() would accept a lease
-- that has already expired. Each check reads the clock *after* the row lock
-- it depends on is held, so a wait for a lock cannot make the clock stale.
-- TTLs are converted to an exact number of seconds before they are added,
-- so '1 day' is always 86400 s and never depends on the session's TimeZone
-- (a calendar day across a DST change is 23 or 25 hours).
--
-- LOCKS. acquire changes the token, and (name, token) is a unique key, so
-- the update is a *key* update and needs the FOR UPDATE row lock.
-- assert_held takes FOR KEY SHARE, which conflicts only with FOR UPDATE:
-- while a fenced transaction is open no acquisition of its lease can
-- commit, but renew and release (which change no key column) proceed.
-- Advisory-lock key spaces (first key): 0x706c6561 "plea" (creators of a
-- new name take turns), 0x706c7761 "plwa" (watchers of a name, see
-- release), 0x706c6665 "plfe" (transactions fenced on a lease, see
-- assert_held and acquire's takeover).
--
-- DURABILITY. A token once handed out is never handed out again, whatever
-- synchronous_commit is: acquire and advance raise synchronous_commit to
-- 'on' for their own transaction when it is weaker (with asynchronous
-- commit a crash could roll back both the lease row and the sequence and
-- issue the same token twice; with a synchronous standby, 'on' also waits
-- for the standby). renew and release keep the caller's setting: losing one
-- in a crash makes a lease end earlier or later than its holder believes,
-- but can never reissue a token, and guarded writes are checked against the
-- row that survived.
--
-- PRIVILEGES. The functions that change leases are SECURITY DEFINER with a
-- fixed search_path: an application role may call them (GRANT EXECUTE)
-- without being able to update the tables, and a caller's search_path
-- cannot reach inside them. Nothing is granted to PUBLIC on the tables.

CREATE SCHEMA IF NOT EXISTS pglease;

COMMENT ON SCHEMA pglease IS
    'Leases with fencing tokens enforced by PostgreSQL (see the pglease README).';

------------------------------------------------------------------------
-- Limits, named once. Both are inlined and folded to constants wherever
-- they are used, so they cost nothing per call.
------------------------------------------------------------------------

-- name, holder and advance's resource: 1 to this many bytes of UTF-8.
CREATE FUNCTION pglease._max_text_bytes()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 255 $$;

-- ttl: greater than zero and at most this many seconds (7 days).
CREATE FUNCTION pglease._max_ttl_seconds()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 604800 $$;

------------------------------------------------------------------------
-- Tables
------------------------------------------------------------------------

-- Tokens for every lease come from one sequence: strictly increasing in the
-- order they are drawn, never reused. CACHE 1 so that no session keeps a
-- private block of values; NO CYCLE so that it can never wrap around.
CREATE SEQUENCE pglease.fence_seq AS bigint START WITH 1 INCREMENT BY 1 CACHE 1 NO CYCLE;

-- Each lease's own number, for the marker of fenced transactions (see
-- assert_held): integer, because an advisory lock key has 32 bits; NO
-- CYCLE, so that a number is never given to two names (creating a name
-- fails after 2,147,483,647 names instead).
CREATE SEQUENCE pglease.lease_id_seq AS integer START WITH 1 NO CYCLE;

-- One row per lease name, created on the first acquisition and never
-- deleted: deleting and recreating a row could let a racing acquirer lock a
-- row that is no longer current.
CREATE TABLE pglease.leases (
    name        text        NOT NULL PRIMARY KEY
                            CHECK (octet_length(name) BETWEEN 1 AND pglease._max_text_bytes()),
    -- NULL once released; after expiry it still names the last holder.
    holder      text        CHECK (holder IS NULL
                                   OR octet_length(holder) BETWEEN 1 AND pglease._max_text_bytes()),
    -- The latest token issued for this name (0 only inside the transaction
    -- that creates the row).
    token       bigint      NOT NULL,
    expires_at  timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz,
    released_at timestamptz,
    -- Unique by construction (only the functions write the table, and rows
    -- are never deleted), and deliberately not indexed: every acquisition
    -- inserts into every index of the table (it changes the token, so it
    -- is never a HOT update), and one more unique index made the
    -- acquire + release cycle measurably slower on a hot name. Nothing
    -- looks a lease up by its number but the view pglease.fenced.
    id          integer     NOT NULL DEFAULT nextval('pglease.lease_id_seq'),
    -- Makes "token" a key column: see LOCKS above.
    CONSTRAINT leases_name_token_key UNIQUE (name, token)
) WITH (fillfactor = 80); -- room for HOT updates by renew and release

ALTER SEQUENCE pglease.lease_id_seq OWNED BY pglease.leases.id;

COMMENT ON TABLE pglease.leases IS
    'One row per lease name; change it only through the pglease functions.';

COMMENT ON COLUMN pglease.leases.id IS
    'The lease''s own number: fenced transactions hold the shared advisory lock '
    '(1886152293, id) until they end (view pglease.fenced).';

-- Separate-resource fencing: the highest token each resource has accepted.
CREATE TABLE pglease.fences (
    resource    text        NOT NULL PRIMARY KEY
                            CHECK (octet_length(resource) BETWEEN 1 AND pglease._max_text_bytes()),
    token       bigint      NOT NULL,
    advanced_at timestamptz NOT NULL
);

COMMENT ON TABLE pglease.fences IS
    'High-water mark of accepted tokens per separate resource (pglease.advance).';

REVOKE ALL ON pglease.leases, pglease.fences, pglease.fence_seq, pglease.lease_id_seq
    FROM PUBLIC;

-- Result of acquire. When the lease was not acquired, token is NULL and
-- expires_at/holder describe the current holder; note is NULL, except when
-- the lease has ended but could not be taken, where it says why.
CREATE TYPE pglease.acquisition AS (
    token      bigint,
    expires_at timestamptz,
    holder     text,
    checked_at timestamptz,  -- the database time the decision was made at
    note       text
);

------------------------------------------------------------------------
-- Input validation: SQLSTATE 22023 (invalid_parameter_value), a message
-- naming the argument, and the argument's name in the error's COLUMN field
-- (for clients), raised before anything is read or written.
------------------------------------------------------------------------

-- The hot functions test all their arguments in one expression and call
-- these only when that test fails, for the exact message. The helpers use
-- only built-in functions (pg_catalog is always searched first) and carry
-- no SET clause. They return their argument so that callers can use them
-- in an assignment, which PL/pgSQL evaluates without going through SPI.
CREATE FUNCTION pglease._check_text(argument text, value text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = argument,
            MESSAGE = format('pglease: %s must not be NULL', argument);
    END IF;
    IF octet_length(value) = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = argument,
            MESSAGE = format('pglease: %s must not be empty', argument);
    END IF;
    IF octet_length(value) > pglease._max_text_bytes() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = argument,
            MESSAGE = format('pglease: %s is %s bytes long; the limit is %s bytes of UTF-8',
                             argument, octet_length(value), pglease._max_text_bytes());
    END IF;
    RETURN value;
END
$$;

CREATE FUNCTION pglease._check_token(token bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF token IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'token',
            MESSAGE = 'pglease: token must not be NULL';
    END IF;
    RETURN token;
END
$$;

-- Returns the ttl as an exact number of seconds (see CLOCK above).
CREATE FUNCTION pglease._check_ttl(ttl interval)
RETURNS interval
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    seconds numeric;
BEGIN
    IF ttl IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'ttl',
            MESSAGE = 'pglease: ttl must not be NULL';
    END IF;
    seconds := extract(epoch FROM ttl);
    IF seconds <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'ttl',
            MESSAGE = format('pglease: ttl must be greater than zero, got %s', ttl);
    END IF;
    IF seconds > pglease._max_ttl_seconds() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'ttl',
            MESSAGE = format('pglease: ttl must be at most %s, got %s',
                             justify_hours(make_interval(secs => pglease._max_ttl_seconds())), ttl);
    END IF;
    RETURN make_interval(secs => seconds::double precision);
END
$$;

------------------------------------------------------------------------
-- Views
------------------------------------------------------------------------

-- One row per name ever acquired.
CREATE VIEW pglease.status AS
SELECT l.name,
       l.holder,
       l.token,
       l.expires_at,
       CASE WHEN l.holder IS NOT NULL AND c.t < l.expires_at
            THEN l.expires_at - c.t END AS remaining,
       (l.holder IS NOT NULL AND c.t < l.expires_at) AS held
  FROM pglease.leases AS l
 CROSS JOIN LATERAL (SELECT clock_timestamp() AS t) AS c
 WHERE l.token > 0;

COMMENT ON VIEW pglease.status IS
    'One row per lease name ever acquired; holder is NULL once released, '
    'remaining is NULL unless held, held uses the database clock.';

-- Which sessions are fenced on which lease right now (the marker taken by
-- assert_held). Without an index on id the join reads the whole leases
-- table: a tenth of a second or so for a million leases, acceptable for a
-- view that people, not the functions, query.
CREATE VIEW pglease.fenced AS
SELECT l.name, k.pid
  FROM pg_locks AS k
  JOIN pglease.leases AS l ON k.objid = l.id::oid
 WHERE k.locktype = 'advisory'
   AND k.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
   AND k.classid = 1886152293 AND k.objsubid = 2 AND k.granted;

COMMENT ON VIEW pglease.fenced IS
    'Sessions (pid) with an open transaction fenced on each lease (pglease.assert_held). '
    'An acquisition after the lease has ended ends these sessions.';

-- Which tables are protected, by which lease (see pglease.protect).
CREATE VIEW pglease.protected AS
SELECT t.tgrelid::regclass AS tbl,
       -- tgargs holds the one trigger argument followed by a NUL byte.
       convert_from(substring(t.tgargs FROM 1 FOR octet_length(t.tgargs) - 1), 'UTF8') AS name
  FROM pg_trigger AS t
 WHERE t.tgname = 'pglease_protect';

COMMENT ON VIEW pglease.protected IS 'Tables protected by pglease.protect, with their lease.';
